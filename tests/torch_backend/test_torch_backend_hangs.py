"""A collective that one rank never joins, under torch on backend "hpc" (tests/faults/torch_hang.py).

Serial tests that start mpiexec themselves (skipped under an outer mpiexec): every rank that waits
gets torch's DistBackendError naming the collective (op, seq, group, dtype, shape) and the rank
that never came, from the watchdog's who-is-where report; the flight recorder's dumps list the
plugin's operations and ``python -m hpc_c10d trace`` reads them.
"""
import json
import os
import subprocess
import sys

import pytest

from support.launch import ROOT, job_sizes, launch, mpiexec, outer_world_size

pytest.importorskip("torch", reason="torch is not installed (pip install 'torch>=2.11,<2.16')")

PROGRAM = os.path.join(ROOT, "tests", "faults", "torch_hang.py")
BOUND_S = 90

pytestmark = [
    pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself"),
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH"),
]


def _run(scenario, nprocs, tmp_path):
    env = {"HPC_C10D_TRACE_DIR": str(tmp_path / "traces"), "HPC_C10D_ABORT_GRACE": "2",
           "HPC_C10D_TRACE_BUFFER_SIZE": "8"}
    proc, cmd = launch(nprocs, [PROGRAM, scenario], BOUND_S, env=env, cwd=str(tmp_path))
    output = f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode != 124, f"{scenario} at -n {nprocs} hung past {BOUND_S} s\n{output}"
    return proc.stdout, output


def _errors(stdout, nprocs):
    """Each waiting rank's error: its type and message (the lines after it included)."""
    errors = {}
    for r in range(nprocs - 1):
        start = stdout.index(f"rank {r}: DistBackendError: ")
        errors[r] = stdout[start:]
    return errors


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
@pytest.mark.long
def test_a_blocking_all_reduce_past_its_timeout_names_the_collective_and_the_missing_rank(nprocs, tmp_path):
    stdout, output = _run("blocking", nprocs, tmp_path)
    last = nprocs - 1
    for r, error in _errors(stdout, nprocs).items():
        assert error.startswith(f"rank {r}: DistBackendError: all_reduce seq 4 of group 0 float32[5]: Timed out "
                                "waiting 3000ms"), output
        assert f"rank {last} not inside any operation (collectives started on group 0: 3)" in error, output
        assert f"behind: rank {last} (collective seq 3 < 4)" in error, output

    dumps = [json.loads(p.read_text()) for p in (tmp_path / "traces").glob("*.json")]
    assert sorted(d["rank"] for d in dumps) == list(range(nprocs)), output
    mine = next(d for d in dumps if d["rank"] == 0)
    assert [(e["op"], e["seq"], e["shape"]) for e in mine["entries"]][-2:] == [("allreduce", 3, [4]),
                                                                            ("allreduce", 4, [5])], mine
    report = subprocess.run([sys.executable, "-m", "hpc_c10d", "trace", str(tmp_path / "traces")],
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert f"behind: rank {last} (collective seq 3 < 4)" in report.stdout, report


@pytest.mark.long
def test_ddp_whose_last_rank_skips_backward_names_the_gradient_all_reduce(tmp_path):
    stdout, output = _run("ddp", 2, tmp_path)
    error = _errors(stdout, 2)[0]
    assert "all_reduce seq 7 of group 0 float32[18]: Timed out waiting 3000ms" in error, output
    assert "behind: rank 1 (collective seq 6 < 7)" in error, output
