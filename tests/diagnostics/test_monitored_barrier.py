"""monitored_barrier passes when everyone arrives and names the ranks that do not."""

import os
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import hpc_c10d as dist
from support import launch

ROOT = Path(launch.ROOT)
LATE_RANK = """
import time, sys
from datetime import timedelta
import hpc_c10d as dist
dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
late = set(range(1, size)) if sys.argv[1] == "all" else {size - 1}
if rank in late:
    time.sleep(3)
try:
    dist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=sys.argv[1] == "all")
except dist.DistBackendError as exc:
    print(f"rank {rank}: {exc}", flush=True)
"""


@pytest.mark.mpi
def test_everyone_arrives(world, size):
    for _ in range(3):
        dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)


@pytest.mark.mpi
def test_timeout_must_be_timedelta(world):
    with pytest.raises(TypeError, match="timedelta"):
        dist.monitored_barrier(timeout=5)


@pytest.mark.parametrize("mode", ["first", "all"])
def test_missing_ranks_are_named(mode, tmp_path):
    script = tmp_path / "late.py"
    script.write_text(LATE_RANK)
    mpiexec = Path(sys.executable).with_name("mpiexec")
    mpiexec = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([mpiexec, "-n", "3", sys.executable, str(script), mode],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    # ranks print concurrently, so lines may interleave: search the whole output
    reports = re.findall(r"\[Rank 0\]: (Ranks? [\d, ]+) failed to pass monitoredBarrier", result.stdout)
    assert reports == (["Ranks 1, 2"] if mode == "all" else ["Rank 2"]), result.stdout
