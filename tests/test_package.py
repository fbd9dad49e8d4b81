"""Packaging promises: a light import, the info command, and optional dependencies stay optional."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def _mpiexec() -> str:
    found = Path(sys.executable).with_name("mpiexec")
    return str(found) if found.exists() else shutil.which("mpiexec") or pytest.skip("no mpiexec")


def test_import_starts_nothing_heavy():
    result = _python(
        "import sys, hpc_c10d\n"
        "heavy = [m for m in ('mpi4py.MPI', 'torch', 'cupy', 'h5py') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert hpc_c10d.is_initialized() is False\n"
        "print(hpc_c10d.__version__)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0.1.0"


def test_works_without_torch_installed():
    result = _python(
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, hpc_c10d as dist\n"
        "dist.init_process_group()\n"
        "x = np.arange(3.0); dist.all_reduce(x)\n"
        "assert x.tolist() == [0.0, 1.0, 2.0]\n"
        "dist.destroy_process_group()\n"
    )
    assert result.returncode == 0, result.stderr


def test_availability_queries_never_raise():
    result = _python(
        "import hpc_c10d as dist\n"
        "print(dist.is_available(), dist.is_mpi_available(), dist.is_gloo_available(),\n"
        "      dist.is_ucc_available(), dist.is_xccl_available(), dist.is_backend_available('mpi'),\n"
        "      dist.is_backend_available('nonsense'), isinstance(dist.is_nccl_available(), bool))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True", "False", "False", "True", "False", "True"]


def test_info_command_reports_every_rank():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([_mpiexec(), "-n", "3", sys.executable, "-m", "hpc_c10d", "info"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "mpi4py" in out and "MPI library" in out and "thread level" in out and "NCCL library" in out
    assert "world size       3" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2]
