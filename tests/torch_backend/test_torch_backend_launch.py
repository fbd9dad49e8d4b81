"""Backend "hpc" from the outside: the entry point, the version check, and an unmodified torch
script started by mpiexec and by srun with no environment variables (serial tests that launch
their own jobs)."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from support.launch import (ROOT, flavour, fresh_env, job_sizes, mpiexec, mpiexec_command, outer_world_size,
                            slurm_cluster_problem, slurm_required)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (pip install 'torch>=2.11,<2.16')")

SCRIPT = os.path.join(ROOT, "tests", "programs", "torch_unmodified_ddp.py")
# what a torchrun or a hand-written job script would set; the unmodified script needs none of it
_TORCH_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DEVICE_BACKEND_AUTOLOAD")
_serial_only = pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts its own job")


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=fresh_env(drop=_TORCH_RENDEZVOUS, **env), cwd=ROOT)


@_serial_only
def test_import_torch_registers_the_backend_without_starting_mpi():
    """Nor loading ml_dtypes: every ``import torch`` where hpc_c10d is installed would pay its 0.6 s."""
    proc = _python("import sys, torch, torch.distributed as d\n"
                   "print('HPC' in d.Backend._plugins, 'mpi4py.MPI' in sys.modules, 'ml_dtypes' in sys.modules,"
                   " d.Backend('hpc'))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "False", "hpc"], proc.stdout


def test_version_check_names_the_supported_range():
    from hpc_c10d.torch.version import SUPPORTED_TORCH, torch_version_problem

    for supported in ("2.11.0", "2.12.1", "2.13.0+cpu", "2.14.1", "2.15.0+cu132"):
        assert torch_version_problem(supported) == "", supported
    for old_or_new in ("2.10.0", "2.16.0", "3.0.0", "nightly"):
        problem = torch_version_problem(old_or_new)
        assert SUPPORTED_TORCH in problem and old_or_new in problem and "pip install" in problem


@_serial_only
def test_unsupported_torch_warns_at_import_torch_and_refuses_the_api():
    code = ("import warnings, torch\n"
            "torch.__version__ = '2.99.0'\n"
            "from hpc_c10d.torch.autoload import autoload\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    autoload()\n"
            "print([str(w.message) for w in seen])\n"
            "import hpc_c10d.torch as ht\n"
            "try:\n"
            "    ht.register\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    proc = _python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 0, proc.stderr
    assert "backend 'hpc' is not registered" in proc.stdout
    assert "ImportError: hpc_c10d.torch supports torch" in proc.stdout and "2.99.0" in proc.stdout


def _check_script_output(proc, cmd, nprocs):
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    # ranks' lines may interleave mid-line in the launcher's merged stdout
    found = sorted(re.findall(r"rank (\d+)/(\d+) backend hpc: DDP matches single-process training", proc.stdout))
    assert found == [(str(r), str(nprocs)) for r in range(nprocs)], proc.stdout


@_serial_only
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
@pytest.mark.long
def test_unmodified_script_under_mpiexec():
    cmd = ["timeout", "240", *mpiexec_command(4), sys.executable, SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=270, cwd=ROOT,
                          env=fresh_env(drop=_TORCH_RENDEZVOUS))
    _check_script_output(proc, cmd, 4)


_slurm_problem = slurm_cluster_problem() if outer_world_size() == 1 else "serial test that submits a job"
_slurm_required = slurm_required() and outer_world_size() == 1


@_serial_only
@pytest.mark.skipif(bool(_slurm_problem) and not _slurm_required, reason=_slurm_problem or "")
@pytest.mark.long
def test_unmodified_script_under_srun():
    assert not _slurm_problem, f"HPC_C10D_REQUIRE_SLURM=1 but {_slurm_problem}"
    conf = {"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    cmd = ["timeout", "240", "srun", "-n", "4", "--overcommit", f"--mpi={flavour().srun_mpi}", sys.executable, SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=270, cwd=ROOT,
                          env=fresh_env(drop=("SLURM_", *_TORCH_RENDEZVOUS), PATH=path, **conf))
    _check_script_output(proc, cmd, 4)


FRAMEWORK_SCRIPT = os.path.join(ROOT, "tests", "programs", "torch_framework_store.py")
# never opened: the test fails if anything listens there (rank 0's TCPStore would)
_UNUSED_PORT = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29431"}


@_serial_only
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_a_framework_setting_master_addr_under_mpiexec_gets_the_mpi_store_and_no_port(nprocs):
    cmd = ["timeout", "120", *mpiexec_command(nprocs), sys.executable, FRAMEWORK_SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT,
                          env=fresh_env(drop=_TORCH_RENDEZVOUS, **_UNUSED_PORT))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    found = sorted(re.findall(r"rank (\d+)/\d+: (\w+), nothing listens on MASTER_PORT, all_reduce ok", proc.stdout))
    assert found == [(str(r), "MPIStore") for r in range(nprocs)], proc.stdout


@_serial_only
def test_torchrun_asking_for_hpc_gets_one_clear_error_naming_mpiexec_before_anything_waits():
    code = ("import time, torch.distributed as d\n"
            "from datetime import timedelta\n"
            "start = time.monotonic()\n"
            "try:\n"
            "    d.init_process_group('hpc', timeout=timedelta(seconds=60))\n"
            "except ValueError as e:\n"
            "    print('ValueError:', e)\n"
            "print(f'after {time.monotonic() - start:.1f} s')\n")
    torchrun = {"TORCHELASTIC_RUN_ID": "job", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2", **_UNUSED_PORT}  # rank 1: torch's TCPStore would wait for rank 0
    proc = _python(code, **torchrun)
    assert proc.returncode == 0, proc.stderr
    assert "ValueError: torchrun started 2 processes" in proc.stdout and "`mpiexec -n N` or `srun -n N`" in proc.stdout
    assert float(re.search(r"after ([\d.]+) s", proc.stdout).group(1)) < 30, proc.stdout


@_serial_only
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
def test_info_says_which_store_torch_gives_backend_hpc():
    cmd = ["timeout", "120", *mpiexec_command(1), sys.executable, "-m", "hpc_c10d", "info"]
    for env, says in (({}, "MPIStore: env:// rendezvouses through MPI"), (_UNUSED_PORT, "MPIStore for backend 'hpc'"),
                      ({**_UNUSED_PORT, "HPC_C10D_TORCH_STORE": "tcp"}, "torch's TCPStore (HPC_C10D_TORCH_STORE=tcp)")):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT,
                              env=fresh_env(drop=_TORCH_RENDEZVOUS, **env))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(rf"^torch store +{re.escape(says)}", proc.stdout, re.M), proc.stdout
