"""torch's own distributed test suite (``DistributedTest._DistTestBase``) on backend "hpc".

    python tests/torch_backend/torch_suite.py [--ranks 3] [--gate gloo] [--test-timeout 120] [--total-timeout 1500]

Every test method runs in an mpiexec job (tests/programs/torch_suite_worker.py) the way torch's
spawned children run it, one fresh default group per test. A job ends after the first test that
fails anywhere; a test that makes no progress for ``--test-timeout`` seconds is counted as hung
and its job killed; either way the next job starts with the following test, so one bad test
cannot hide the rest. ``--gate gloo`` (the default) sets torch's BACKEND to "gloo" so the tests
torch keeps for gloo run too, on an "hpc" group (``--gate hpc``: only those torch runs for any
backend). Prints a line per failure and one summary line; exits 1 if any test fails or hangs
other than EXPECTED_FAILURES, or one of those passes (the list must stay true), 2 without torch.
Results also go to ``--results`` (JSON lines: name, outcome, message). ``--group gloo`` runs the
same tests on torch's gloo, for comparison by hand only: gloo's transport opens TCP ports on this
machine, which the suite's tests never do.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support import launch  # noqa: E402

WORKER = os.path.join(launch.ROOT, "tests", "programs", "torch_suite_worker.py")

#: The tests torch's own code keeps for gloo alone: not ours to change.
EXPECTED_FAILURES = {
    "test_get_backend": "asserts that the default group's backend is named 'gloo'",
    "test_monitored_barrier_gloo": "torch's monitored_barrier refuses every backend but gloo",
    "test_monitored_barrier_gloo_subgroup": "torch's monitored_barrier refuses every backend but gloo",
    "test_monitored_barrier_gloo_rank_0_timeout": "torch's monitored_barrier refuses every backend but gloo",
}

#: More, from torch 2.14 on, where "hpc" is a per-device Backend written in Python
#: (docs/torch_backend.md): torch's C++ group names such a backend "custom".
PER_DEVICE_BACKEND_FAILURES = {
    "test_ddp_logging_data_cpu": "DDP's logging data names the backend as torch's C++ group does: 'custom'",
}


def expected_failures(group):
    """EXPECTED_FAILURES, and for backend "hpc" as a per-device Backend (torch >= 2.14) those of
    PER_DEVICE_BACKEND_FAILURES too."""
    from hpc_c10d.torch.version import python_backends

    if group == "hpc" and python_backends():
        return {**EXPECTED_FAILURES, **PER_DEVICE_BACKEND_FAILURES}
    return EXPECTED_FAILURES


def test_names():
    """Every test method of torch's suite, in its order of definition."""
    os.environ.setdefault("BACKEND", "gloo")  # read at import; the names do not depend on it
    os.environ.setdefault("WORLD_SIZE", "1")
    from torch.testing._internal.distributed.distributed_test import DistributedTest

    return [name for name in vars(DistributedTest._DistTestBase) if name.startswith("test_")]


def _read(results_file):
    """(outcomes {name: (outcome, message)}, the name started last)."""
    outcomes, started = {}, None
    if os.path.exists(results_file):
        with open(results_file) as f:
            for line in f:
                word, _, rest = line.rstrip("\n").partition(" ")
                if word == "start":
                    started = rest
                else:
                    outcome, _, message = rest.partition(" ")
                    outcomes[word] = (outcome, message)
    return outcomes, started


def _job(names, ranks, gate, group, work_dir, test_timeout, deadline):
    """Run ``names`` in one job until it ends; return {name: (outcome, message)} for those it reached."""
    names_file, results_file = os.path.join(work_dir, "names"), os.path.join(work_dir, "results")
    with open(names_file, "w") as f:
        f.write("\n".join(names))
    if os.path.exists(results_file):
        os.unlink(results_file)
    temp = os.path.join(work_dir, "temp")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(temp, sub), exist_ok=True)
        for entry in os.listdir(os.path.join(temp, sub)):
            os.unlink(os.path.join(temp, sub, entry))
    cmd = ["timeout", str(max(1, int(deadline - time.monotonic()))), *launch.mpiexec_command(ranks),
           sys.executable, WORKER, names_file, results_file, group]
    env = launch.fresh_env(BACKEND=gate, TEMP_DIR=temp, HPC_C10D_TIMEOUT_POLICY="raise",
                            HPC_C10D_TRACE_DIR=os.path.join(work_dir, "traces"))  # a timed-out test's dumps
    log = open(os.path.join(work_dir, "job.log"), "a")
    job = subprocess.Popen(cmd, env=env, cwd=launch.ROOT, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    progress, seen = time.monotonic(), None
    while job.poll() is None:
        time.sleep(0.2)
        outcomes, started = _read(results_file)
        if (len(outcomes), started) != seen:
            seen, progress = (len(outcomes), started), time.monotonic()
        elif time.monotonic() - progress > test_timeout:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            break
    log.close()
    outcomes, started = _read(results_file)
    if started is not None and started not in outcomes:
        hung = job.returncode in (-signal.SIGKILL, 124, 137)
        outcomes[started] = ("hung" if hung else "crashed",
                             f"no outcome after {test_timeout} s" if hung else f"job ended with {job.returncode}")
    return outcomes


def run(ranks, gate, test_timeout, total_timeout, names=None, group="hpc"):
    """Every test's (outcome, message), restarting after each failure or hang."""
    pending = list(names or test_names())
    deadline = time.monotonic() + total_timeout
    outcomes = {}
    with tempfile.TemporaryDirectory(prefix="torch-suite-") as work_dir:
        while pending and time.monotonic() < deadline:
            reached = _job(pending, ranks, gate, group, work_dir, test_timeout, deadline)
            if not reached:  # the job could not start a single test
                outcomes[pending[0]] = ("crashed", "the job ran no test")
                reached = {pending[0]: outcomes[pending[0]]}
            outcomes.update(reached)
            pending = [name for name in pending if name not in outcomes]
    for name in pending:
        outcomes[name] = ("not run", f"the total timeout of {total_timeout} s ran out")
    return outcomes


def verdict(outcomes, expected=EXPECTED_FAILURES):
    """(unexpected [(name, outcome, message)], expected failures that passed)."""
    unexpected = [(name, outcome, message) for name, (outcome, message) in outcomes.items()
                  if outcome not in ("passed", "skipped") and name not in expected]
    fixed = [name for name in expected if outcomes.get(name, ("",))[0] == "passed"]
    return unexpected, fixed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--gate", choices=("gloo", "hpc"), default="gloo",
                        help="the BACKEND torch's tests are gated on (default gloo: its tests run too)")
    parser.add_argument("--group", choices=("hpc", "gloo"), default="hpc",
                        help="the default group's backend (gloo: comparison by hand; it opens TCP ports)")
    parser.add_argument("--test-timeout", type=float, default=120, help="seconds without progress: hung")
    parser.add_argument("--total-timeout", type=float, default=1500)
    parser.add_argument("--results", help="write every outcome here (JSON lines)")
    parser.add_argument("-k", dest="only", help="run only the tests whose name contains this")
    args = parser.parse_args(argv)
    try:
        names = test_names()
    except ImportError as exc:
        print(f"torch suite: torch is not installed ({exc})")
        return 2
    if args.only:
        names = [name for name in names if args.only in name]
    started = time.monotonic()
    outcomes = run(args.ranks, args.gate, args.test_timeout, args.total_timeout, names, args.group)
    if args.results:
        with open(args.results, "w") as f:
            for name, (outcome, message) in outcomes.items():
                f.write(json.dumps({"name": name, "outcome": outcome, "message": message}) + "\n")
    expected_list = expected_failures(args.group)
    unexpected, fixed = verdict(outcomes, expected_list)
    for name, outcome, message in unexpected:
        print(f"torch suite: {name} {outcome}: {message}")
    for name in fixed:
        print(f"torch suite: {name} passed but is listed as an expected failure; take it off the list")
    counts = {kind: sum(1 for outcome, _ in outcomes.values() if outcome == kind)
              for kind in ("passed", "failed", "skipped", "hung", "crashed", "not run")}
    expected = sum(1 for name in expected_list if outcomes.get(name, ("",))[0] not in ("passed", "skipped", ""))
    print(f"torch suite (backend {args.group}, {args.ranks} ranks, tests gated as {args.gate}): "
          f"{counts['passed']} passed, {counts['failed']} failed ({expected} expected), {counts['skipped']} skipped, "
          f"{counts['hung']} hung, {counts['crashed']} crashed, {counts['not run']} not run "
          f"in {time.monotonic() - started:.0f} s")
    return 1 if unexpected or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
