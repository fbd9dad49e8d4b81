"""Run the programs in tests/programs/ under mpiexec at 1-4 ranks; each must exit 0.

A serial test: it launches mpiexec itself, so it is not marked mpi. Under a multi-rank
mpiexec it skips (every rank would start its own nested jobs on the same cores).

Each program runs as ``__main__`` through a tiny wrapper that, on an uncaught exception,
prints it and aborts the MPI job: otherwise the ranks that did not fail would wait in
their next collective until the timeout. The wrapper imports nothing before the program
runs, so who initialises MPI (the program or hpc_c10d) is unchanged.
"""
import importlib.util
import os

import pytest

from support.launch import ROOT, job_sizes, launch, mpiexec, outer_world_size

PROGRAMS = os.path.join(ROOT, "tests", "programs")
TIMEOUT_S = 120

# program -> world sizes where it means something
RUNS = {
    "tutorial_send_recv.py": (2, 3, 4),  # rank 0 sends to the others: needs a second rank
    "tutorial_ring.py": (1, 2, 3, 4),
    "tutorial_ddp_torch.py": (1, 2, 3, 4),
    "tutorial_ddp_numpy.py": (1, 2, 3, 4),
    "reinit_and_subcomm.py": (1, 2, 3, 4),
    "mpi_initialized_first.py": (1, 2, 3, 4),
}
NEEDS_TORCH = {"tutorial_send_recv.py", "tutorial_ring.py", "tutorial_ddp_torch.py"}
HAVE_TORCH = importlib.util.find_spec("torch") is not None


# argv: -c PROGRAM; run PROGRAM as __main__, abort the whole job if it raises
_RUN_OR_ABORT = """
import os, runpy, sys, traceback
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    if e.code not in (None, 0):
        raise
except BaseException:
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(1)
    os._exit(1)
"""


def test_every_program_is_listed():
    # torch_*.py are launched by test_torch_backend_launch.py, node_awareness.py by test_multinode.py,
    # nccl_scenarios.py by test_nccl_gpu.py, thread_pools.py by test_threads.py, frameworks.py by
    # test_frameworks.py; _listening.py is a module two of them import
    on_disk = {f for f in os.listdir(PROGRAMS) if f.endswith(".py") and not f.startswith("torch_")}
    assert on_disk == set(RUNS) | {"node_awareness.py", "nccl_scenarios.py", "thread_pools.py", "frameworks.py",
                                   "_listening.py"}


@pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself; run without mpiexec")
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
@pytest.mark.parametrize(
    "program, nprocs",
    [(p, n) for p, sizes in RUNS.items() for n in job_sizes(*sizes)],
    ids=[f"{p[:-3]}-n{n}" for p, sizes in RUNS.items() for n in job_sizes(*sizes)],
)
def test_program_exits_zero(program, nprocs):
    if program in NEEDS_TORCH and not HAVE_TORCH:
        pytest.skip(f"{program} uses torch, which is not installed")
    proc, cmd = launch(nprocs, ["-c", _RUN_OR_ABORT, os.path.join(PROGRAMS, program)], TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}"
        + (" (timed out)" if proc.returncode == 124 else "")
        + f"\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )


@pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself; run without mpiexec")
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
def test_checkpoint_example_saves_and_resumes_at_another_world_size(tmp_path):
    """examples/checkpoint_resume.py, as docs/checkpoints.md shows it: 2 ranks save, 3 ranks resume."""
    pytest.importorskip("h5py", reason="h5py is not installed (pip install h5py)")
    example = os.path.join(ROOT, "examples", "checkpoint_resume.py")
    for nprocs, steps, said in ((2, 20, []), (3, 40, ["resuming from ckpt.h5 at step 20 on 3 ranks"])):
        proc, cmd = launch(nprocs, [example, str(steps)], TIMEOUT_S, cwd=str(tmp_path))
        assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        for line in [*said, f"saved ckpt.h5 at step {steps}; every weight equals the step count: True"]:
            assert line in proc.stdout, proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["ckpt.h5"]
