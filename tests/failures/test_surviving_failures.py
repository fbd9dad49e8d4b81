"""examples/surviving_failures.py with one rank SIGKILLed mid-training (docs/surviving_failures.md).

Under Open MPI with ULFM (``mpiexec --with-ft ulfm``) the survivors must finish, and the final
checkpoint must equal the reference: the example's arithmetic run in this process, with every
rank up to the last checkpoint before the failure and the survivors from there on. That holds
only if the survivors rewound to that checkpoint, resharded the momentum, split the batches over
their number and lost nothing saved; an uninterrupted run ends elsewhere (checked too). Under
MPICH the death ends the job, promptly, with the launcher's report; the checkpoint stays, and a
run at the survivors' number resumes from it to the same reference.

Serial tests: they start jobs of their own (HPC_C10D_REQUIRE_ULFM=1: the ULFM tests run, never skip).
"""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from support.launch import ROOT, flavour, fresh_env, mpiexec, mpiexec_command, outer_world_size

EXAMPLE = os.path.join(ROOT, "examples", "surviving_failures.py")
STEPS, EVERY = 20, 5
TIMEOUT_S = 150

pytestmark = [
    pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself; run without mpiexec"),
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH"),
]
h5py = pytest.importorskip("h5py", reason="the example's checkpoints need h5py (pip install h5py)")
needs_ulfm = pytest.mark.skipif(
    os.environ.get("HPC_C10D_REQUIRE_ULFM") != "1" and (mpiexec() is None or flavour().name != "openmpi"),
    reason="ULFM (survivors outlive a dead rank) is Open MPI 5's, under mpiexec --with-ft ulfm; "
           "the MPI here is another")
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _example():
    """The example as a module, for its data and arithmetic."""
    spec = importlib.util.spec_from_file_location("surviving_failures", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _example()


def reference(nprocs, survivors_from, steps=STEPS, lost=1):
    """(weights, momentum) after ``steps`` steps of the example's training on ``nprocs`` ranks up to
    step ``survivors_from`` and ``nprocs - lost`` after it, computed here in one process."""
    x, y = ex.dataset()
    weights, momentum = np.zeros(ex.FEATURES), np.zeros(ex.FEATURES)
    for step in range(steps):
        size = nprocs if step < survivors_from else nprocs - lost
        rows = [ex.my_batch(step, rank, size) for rank in range(size)]
        momentum = ex.BETA * momentum + np.mean([ex.mse_gradient(weights, x[r], y[r]) for r in rows], axis=0)
        weights = weights - ex.LR * momentum
    return weights, momentum


def run(tmp_path, nprocs, *args, ulfm=True):
    """The example at ``nprocs`` ranks in ``tmp_path`` (its checkpoint there); (status, output)."""
    command = mpiexec_command(nprocs)
    if ulfm:
        command[1:1] = ["--with-ft", "ulfm"]
    command = ["timeout", str(TIMEOUT_S), *command, sys.executable, EXAMPLE, "--steps", str(STEPS),
               "--every", str(EVERY), *map(str, args)]
    proc = subprocess.run(command, env=fresh_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT_S + 30, stdin=subprocess.DEVNULL)
    return proc.returncode, f"{' '.join(command)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def saved(folder):
    """(weights, momentum, step) of the example's checkpoint in ``folder``."""
    with h5py.File(os.path.join(folder, "surviving.h5"), "r") as f:
        return f["weights"][()], f["momentum"][()], int(f["step"][()])


def assert_equals_reference(tmp_path, nprocs, survivors_from, output):
    weights, momentum, step = saved(tmp_path)
    assert step == STEPS, output
    want_weights, want_momentum = reference(nprocs, survivors_from)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-9, atol=1e-12, err_msg=output)
    np.testing.assert_allclose(momentum, want_momentum, rtol=1e-9, atol=1e-12, err_msg=output)
    assert not np.allclose(weights, reference(nprocs, STEPS)[0], rtol=1e-6), "the failure changes nothing"


@needs_ulfm
@pytest.mark.parametrize("torch_flavour, nprocs, victim, kill_step", [
    (False, 3, 0, 12), (False, 4, 2, 8), (True, 3, 1, 10), (True, 4, 3, 7),
], ids=["numpy-n3", "numpy-n4", "torch-n3", "torch-n4"])
def test_survivors_finish_as_a_restart_from_the_last_checkpoint(tmp_path, torch_flavour, nprocs, victim, kill_step):
    if torch_flavour and not HAVE_TORCH:
        pytest.skip("the torch flavour needs torch, which is not installed")
    status, output = run(tmp_path, nprocs, *(["--torch"] if torch_flavour else []),
                         "--kill-rank", victim, "--kill-step", kill_step)
    assert status == 0, output
    resumed = kill_step // EVERY * EVERY  # the last checkpoint before the failure
    for line in (f"step {kill_step}: lost rank(s) [{victim}]", f"step {resumed}: {nprocs - 1} ranks", "recovery: ",
                 f"finished {STEPS} steps on {nprocs - 1} ranks"):
        assert line in output, output
    assert_equals_reference(tmp_path, nprocs, resumed, output)
    assert [f for f in os.listdir(tmp_path) if f.startswith("surviving")] == ["surviving.h5"], output  # no .partial


@pytest.mark.skipif(mpiexec() is None or flavour().name != "mpich",
                    reason="checks MPICH's behaviour (the job ends when a rank dies); the MPI here is another")
def test_under_mpich_the_job_ends_and_a_rerun_resumes_from_the_checkpoint(tmp_path):
    status, output = run(tmp_path, 3, "--kill-rank", 1, "--kill-step", 7, ulfm=False)
    assert status not in (0, 124), output  # ended, not hung
    assert "BAD TERMINATION" in output and "Killed (signal 9)" in output, output
    assert saved(tmp_path)[2] == 5, output  # the last checkpoint before the death is intact
    status, output = run(tmp_path, 2, ulfm=False)
    assert status == 0 and "step 5: 2 ranks" in output, output
    assert_equals_reference(tmp_path, 3, 5, output)
