"""One job of torch's own distributed test suite on backend "hpc" (started by tests/torch_backend/torch_suite.py).

    mpiexec -n N python torch_suite_worker.py NAMES_FILE RESULTS_FILE GROUP_BACKEND

Runs the ``DistributedTest._DistTestBase`` methods named in NAMES_FILE, in order, each the way
torch's spawned child runs it: a fresh default group (with the test's timeout from torch's
``CUSTOM_PG_TIMEOUT``), the case made with this rank, the RNG seeded. After each, the ranks agree
on the outcome (the worst rank's) and rank 0 appends ``NAME OUTCOME message`` to RESULTS_FILE,
having appended ``start NAME`` before it. The job ends after the first test that did not pass or
skip on every rank (its group may be broken): the driver goes on with the rest in a fresh job.
``BACKEND`` (the gate torch's tests read at import) and ``TEMP_DIR`` come from the driver.
"""
import os
import sys
import traceback
import unittest
from datetime import timedelta

from mpi4py import MPI

world = MPI.COMM_WORLD
os.environ["WORLD_SIZE"] = str(world.Get_size())

import torch.distributed as dist  # noqa: E402 - WORLD_SIZE first: torch's suite reads it at import
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.common_utils import set_rng_seed  # noqa: E402
from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402

PASSED, SKIPPED, FAILED = 0, 1, 2
OUTCOMES = ("passed", "skipped", "failed")
_SKIP_CODES = {skip.exit_code for skip in TEST_SKIPS.values()}


class Case(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    """torch's test case, run in this process instead of a spawned child."""


def _one_line(exc):
    """The exception's type and first line, then where it was raised (the last frame)."""
    first = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[0]
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return (first + where)[:400]


def run_test(name, rank, file_name):
    """(outcome, message) of one test on this rank."""
    timeout = timedelta(seconds=suite.CUSTOM_PG_TIMEOUT.get(name, suite.default_pg_timeout))
    dist.init_process_group(backend=os.environ["GROUP_BACKEND"], timeout=timeout)
    case = Case(name)
    case.rank, case.file_name = rank, file_name
    set_rng_seed()
    test = getattr(case, name)
    if getattr(test, "__unittest_skip__", False):  # torch's skip_but_pass_in_sandcastle_if marks, as unittest
        return SKIPPED, getattr(test, "__unittest_skip_why__", "")[:200]
    try:
        test()
        outcome = (PASSED, "")
    except unittest.SkipTest as skip:
        outcome = (SKIPPED, str(skip)[:200])
    except SystemExit as leaving:  # torch's skip decorators exit a spawned child with a code
        outcome = (SKIPPED, f"skip exit {leaving.code}") if leaving.code in _SKIP_CODES else (FAILED, repr(leaving))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, the job goes on agreeing
        outcome = (FAILED, _one_line(exc))
    return outcome


def main(names_file, results_file, group_backend):
    os.environ["GROUP_BACKEND"] = group_backend
    rank = world.Get_rank()
    with open(names_file) as f:
        names = f.read().split()
    file_name = os.path.join(os.environ["TEMP_DIR"], "init_dir", "file_store")
    results = open(results_file, "a") if rank == 0 else None
    for name in names:
        if results:
            results.write(f"start {name}\n")
            results.flush()
        world.Barrier()
        code, message = run_test(name, rank, file_name)
        worst = world.allreduce(code, op=MPI.MAX)
        messages = world.gather(message if code == worst else "", root=0)
        if results:
            said = next((f"[rank {r}] {m}" for r, m in enumerate(messages) if m), "")
            results.write(f"{name} {OUTCOMES[worst]} {said}".rstrip() + "\n")
            results.flush()
        if worst == FAILED:
            os._exit(0)  # the group may be broken: the driver starts a fresh job for the rest
        if dist.is_initialized():
            dist.destroy_process_group()
    world.Barrier()


if __name__ == "__main__":
    main(*sys.argv[1:4])
