"""The misbehaving jobs of tests/faults/ (scenario.py, mismatch.py), run within a time bound by the
serial tests of tests/diagnostics/, and ``python -m hpc_c10d trace`` over their dumps."""
import os
import subprocess
import sys
import time

import pytest

from support.launch import ROOT, launch, mpiexec, outer_world_size

SCENARIO = os.path.join(ROOT, "tests", "faults", "scenario.py")
MISMATCH = os.path.join(ROOT, "tests", "faults", "mismatch.py")
BOUND_S = 45  # each job must end well inside a minute

#: pytestmark of a file of serial tests that start these jobs
SERIAL_JOBS = [
    pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself"),
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH"),
]


def run_job(scenario, nprocs, tmp_path, program=SCENARIO, **env):
    """Run one scenario at ``nprocs`` ranks, its dumps in tmp_path/traces: (process, seconds, output)."""
    env = {"HPC_C10D_TRACE_DIR": str(tmp_path / "traces"), "HPC_C10D_ABORT_GRACE": "2", **env}
    start = time.monotonic()
    proc, cmd = launch(nprocs, [program, scenario], BOUND_S, env=env, cwd=str(tmp_path))
    took = time.monotonic() - start
    output = f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode != 124, f"{scenario} at -n {nprocs} hung past {BOUND_S} s\n{output}"
    return proc, took, output


def trace(directory):
    """``python -m hpc_c10d trace directory``, finished."""
    return subprocess.run([sys.executable, "-m", "hpc_c10d", "trace", str(directory)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
