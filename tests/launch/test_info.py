"""``python -m hpc_c10d``'s own parser and ``info``'s hints, in process (no MPI job): plain help
text, a clear usage error without a command, and install hints that run as written."""
import pytest

from hpc_c10d import info
from hpc_c10d.__main__ import main
from hpc_c10d.extras import install_hint
from hpc_c10d.nccl import library


def test_without_a_command_the_usage_error_names_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "error: name a command: info, trace, bench" in capsys.readouterr().err


def test_info_help_says_what_info_prints(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["info", "--help"])
    assert exit_.value.code == 0
    usage, description, *_ = capsys.readouterr().out.split("\n\n")
    assert usage == "usage: python -m hpc_c10d info [-h]"
    assert "MPI library" in description and "rank 0 prints" in " ".join(description.split())
    assert "`" not in description


@pytest.mark.parametrize("argv", [["--help"], ["trace", "--help"]])
def test_help_is_plain_text(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "`" not in capsys.readouterr().out


def test_without_nccl_info_gives_pip_commands_that_run_as_written(monkeypatch):
    def no_library():
        raise RuntimeError("no libnccl.so.2 here")

    monkeypatch.setattr(library, "load", no_library)
    found = info.nccl_library()
    assert install_hint("cuda13") in found and install_hint("cuda12") in found
    assert "hpc-c10d[" not in found


def test_the_mpi_library_line_is_printable_text():
    """Open MPI's version string ends in a NUL byte, which made `info | grep` call its output binary."""
    from mpi4py import MPI

    from hpc_c10d.mpi.bootstrap import library_version

    line = library_version()
    assert line and line.isprintable()
    assert line in MPI.Get_library_version().replace("\x00", "")
