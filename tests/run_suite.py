#!/usr/bin/env python3
"""Run the whole hpc_c10d test suite with one command.

Stages
  serial   python -m pytest -m "not mpi" tests/          (non-MPI tests)
           spread over --jobs pytest-xdist workers (default: two per CPU, at most 4); the tests of
           the designated simulated cluster share one worker (tests/conftest.py)
  n=1..4   mpiexec -n N python -m pytest --with-mpi -m mpi --hpc-c10d tests/
           (--hpc-c10d: hpc_c10d's testing kit, docs/testing_your_code.md: the ranks agree on each
           test's outcome, only rank 0 reports, a test past 600 s fails with a "who is where" report)
  net n=2,4  the store tests again with the MPI library forced onto its network path
           (MPICH: MPIR_CVAR_NOLOCAL=1; Open MPI: the rdma one-sided component over TCP),
           where one-sided operations need the target's progress, as between nodes
  srun n=4 the MPI tests under srun -n 4 --mpi=pmi2 (Open MPI: pmix), on the SLURM cluster
           designated for the tests only (HPC_C10D_TEST_SLURM_CLUSTER, which
           `eval "$(bash slurm/local_cluster.sh env)"` sets for the localhost cluster); skipped with a
           note otherwise (also where SLURM lacks the MPI's plugin), a failure under
           HPC_C10D_REQUIRE_SLURM=1. tests/support/launch.py says how the designation is checked.
  sim mpiexec 2x2, sim srun 2x2
           the MPI tests on 2 nodes x 2 ranks of a simulated cluster (slurm/sim_cluster.sh, node
           namespaces on this machine, traffic between nodes over TCP on veths): under its Hydra
           mpiexec (-n 4 -ppn 2) and under its srun (-N 2 --ntasks-per-node=2 --mpi=pmi2); only
           when one is designated (HPC_C10D_SIM_CLUSTER, which `eval "$(bash slurm/sim_cluster.sh env)"`
           sets; the suite never brings it up), skipped with a note otherwise, a failure under
           HPC_C10D_REQUIRE_SIM_CLUSTER=1. The stages export HPC_C10D_TEST_NODES and
           HPC_C10D_TEST_RANKS_PER_NODE (tests read them with _launch.sim_layout()). --node-layouts
           chooses the layouts (NODESxRANKS, default 2x2), --sim-launchers the launchers.

The stages' mpiexec gets its MPI's flags from tests/support/launch.py (Open MPI: --oversubscribe, and
allowed to run as root), and tests that start jobs of their own use the same launcher ($MPIEXEC).

Every stage runs under a hard wall-clock limit (``--timeout``, and an overall
``--total-timeout``); on expiry the whole process tree of the stage is killed
and the stage is reported as TIMEOUT.  Every MPI rank writes its own JUnit XML
(``<results-dir>/n{N}-rank{R}.xml``); rank 0's pytest output is shown live,
the other ranks' output goes to ``<results-dir>/n{N}-rank{R}.log`` and is
printed only when that rank failed, crashed or the stage timed out.

At the end a per-stage table is printed, followed by the aggregate counts as
the very last line: ``N passed, N failed, N skipped``.  For an MPI stage a test
counts once: failed if it failed/errored on any rank, passed if it passed on
some rank and failed on none (an expected failure passes), skipped otherwise.  A rank that left no JUnit XML
(crash, hang) and a stage that exited non-zero without any failed test each
count as one failure.  The exit status is non-zero if any stage failed, timed
out or was not run, if any test failed, or if no test ran at all.

Usage
  python tests/run_suite.py                       # everything
  python tests/run_suite.py --sizes 1,2 -k allreduce
  python tests/run_suite.py --no-serial -- -x -v  # extra args after -- go to pytest
  python tests/run_suite.py --no-serial --sizes '' --net-sizes '' --slurm-sizes ''   # only the multi-node stages
Unrecognised options are passed to pytest as well.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from support import launch as _launch
from support import ledger as _ledger
from support import rank_worker
from support.process_tree import descendants, kill_tree

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()
WORKER_FLAG = "--rank-worker"  # run_suite.py --rank-worker ...: one rank of an MPI stage (support/rank_worker.py)
# Run again on the MPI library's network path (one-sided progress needs the target).
STORE_TESTS = ["tests/stores/test_mpi_store.py", "tests/stores/test_store_contract.py"]

# pytest's arguments in every MPI stage: the mpi-marked tests, under the testing kit's plugin (one
# verdict per test across ranks, only rank 0 reports, a test past its time limit fails with a report).
MPI_PYTEST_ARGS = ["--with-mpi", "-m", "mpi", "-p", "no:cacheprovider", "-p", "hpc_c10d.testing.pytest_plugin",
                   "--hpc-c10d", "--hpc-c10d-time-limit", "600"]


@dataclass
class Stage:
    """One pytest run (serial) or job (MPI), and, once it ran, its verdict."""
    name: str
    tag: str  # its files in the results folder: TAG.xml (serial), TAG-rankR.{xml,log,rc}
    nranks: int  # 0 for the serial stage
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # added to the environment of this stage
    rc: int | None = None
    timed_out: bool = False
    not_run: str = ""
    elapsed: float = 0.0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)  # rank-level problems, counted as failures
    failed_tests: list[str] = field(default_factory=list)
    status: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("PASS", "NO TESTS")


def _rank_verdict(stage: Stage, results_dir: Path, rank: int | None, combined: dict[str, set[str]]) -> bool:
    """Add one rank's (or the serial run's) outcomes to ``combined``; whether that rank went wrong."""
    stem = results_dir / (stage.tag if rank is None else f"{stage.tag}-rank{rank}")
    label = "serial" if rank is None else f"rank {rank}"
    try:
        outcomes = _ledger.cases(stem.with_suffix(".xml"))
    except FileNotFoundError:
        stage.problems.append(f"{label}: no JUnit XML")
        return True
    except (ET.ParseError, OSError) as exc:
        stage.problems.append(f"{label}: unreadable JUnit XML ({exc})")
        return True
    for tid, outcome in outcomes.items():
        combined.setdefault(tid, set()).add(outcome)
    bad = "failed" in outcomes.values()
    if rank is not None:
        try:
            bad |= int(stem.with_suffix(".rc").read_text().strip()) not in (0, 5)  # 5: no tests collected
        except (OSError, ValueError):
            bad = True
    return bad


def evaluate(stage: Stage, results_dir: Path) -> list[int]:
    """Fill the counts and status of a finished stage; return the ranks whose log should be shown."""
    stage.passed = stage.failed = stage.skipped = 0
    stage.problems, stage.failed_tests = [], []
    if stage.not_run:
        stage.status = "NOT RUN"
        stage.problems.append(stage.not_run)
        return []
    combined: dict[str, set[str]] = {}
    show: list[int] = []
    for rank in [None] if stage.nranks == 0 else range(stage.nranks):
        went_wrong = _rank_verdict(stage, results_dir, rank, combined)
        if rank is not None and (went_wrong or stage.timed_out):
            show.append(rank)
    for tid, outcomes in sorted(combined.items()):  # a test counts once: failed on a rank, else passed on one
        if "failed" in outcomes:
            stage.failed += 1
            stage.failed_tests.append(tid)
        elif "passed" in outcomes:
            stage.passed += 1
        else:
            stage.skipped += 1
    if stage.timed_out:
        stage.status = "TIMEOUT"
        stage.problems = stage.problems or ["timed out"]
    elif stage.failed or show or stage.rc not in (0, 5) or stage.problems:
        stage.status = "FAIL"
        if not stage.failed and not stage.problems:
            stage.problems.append(f"exit status {stage.rc} without a failed test")
    elif stage.rc == 5 or stage.passed + stage.skipped == 0:
        stage.status = "NO TESTS"
    else:
        stage.status = "PASS"
    return show


def run_stage(stage: Stage, timeout: float, env: dict[str, str]) -> None:
    rule = "=" * 78
    print(f"\n{rule}\n== stage {stage.name}: {shlex.join(stage.cmd)}\n== (timeout {timeout:.0f}s)\n{rule}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(stage.cmd, cwd=ROOT, env={**env, **stage.env}, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        stage.rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stage.timed_out = True
        print(f"\nrun_suite: stage {stage.name} HUNG: no exit after {timeout:.0f}s; killing its process tree",
              flush=True)
        kill_tree(proc)
        stage.rc = proc.returncode
    except BaseException:
        kill_tree(proc)
        raise
    finally:
        stage.elapsed = time.monotonic() - t0
        # Reap stray ranks that outlived mpiexec (should not happen, but never leave them behind).
        for p in descendants(proc.pid) if proc.returncode is None else []:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def xdist_args(jobs: int) -> list[str]:
    """pytest's options that spread the serial tests over ``jobs`` workers; none for one, or without
    pytest-xdist (then saying so)."""
    if jobs <= 1:
        return []
    if importlib.util.find_spec("xdist") is None:
        print(f"run_suite: pytest-xdist is not installed: the serial tests run in one process, not {jobs}", flush=True)
        return []
    return ["-n", str(jobs), "--dist", "load"]


def print_log(path: Path, title: str, max_lines: int = 3000) -> None:
    print(f"\n{'-' * 30} {title} ({path}) {'-' * 30}")
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        print(f"(no output: {exc})")
        return
    if len(lines) > max_lines:
        print(f"... ({len(lines) - max_lines} earlier lines omitted)")
        lines = lines[-max_lines:]
    print("\n".join(lines))
    print("-" * 78, flush=True)


def slurm_problem(flavour: _launch.Flavour) -> str:
    """Why the MPI tests cannot run under srun here ('' when they can); no cluster designated comes first."""
    return _launch.slurm_cluster_problem() or _launch.srun_plugin_problem(flavour.srun_mpi)


def sim_problem(flavour: str, mpiexec: str | None, nodes: int) -> str:
    """Why the MPI tests cannot run on ``nodes`` nodes of the simulated cluster ('' when they can)."""
    problem = _launch.sim_cluster_problem(nodes)
    if not problem and mpiexec is None:
        return "mpiexec not found"
    if not problem and flavour != "mpich":
        return f"the simulated cluster runs MPICH jobs (Hydra's mpiexec, srun --mpi=pmi2); {mpiexec} is {flavour}'s"
    return problem


def has_path_arg(args: list[str]) -> bool:
    return any(not a.startswith("-") and (ROOT / a.split("::")[0]).exists() for a in args)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """run_suite's options, and the arguments for every pytest run (unrecognised ones and those after --)."""
    ap = argparse.ArgumentParser(
        description="Run the hpc_c10d test suite: a serial pytest run, then "
                    "mpiexec -n N pytest --with-mpi -m mpi for each N.",
        epilog="Unrecognised options, and everything after --, are passed to every pytest run.",
    )
    ap.add_argument("--sizes", default="1,2,3,4",
                    help="comma-separated MPI world sizes (default 1,2,3,4; '' or 0 for none)")
    ap.add_argument("--net-sizes", default="2,4",
                    help="world sizes for the network-path store stages (default 2,4; '' or 0 for none)")
    ap.add_argument("--slurm-sizes", default="4",
                    help="world sizes for the MPI tests under srun --mpi=pmi2 (pmix), when a SLURM cluster answers "
                         "(default 4; '' or 0 for none)")
    ap.add_argument("--node-layouts", default="2x2",
                    help="NODESxRANKS_PER_NODE layouts for the MPI tests on the designated simulated cluster, "
                         "each under --sim-launchers (default 2x2; '' for none)")
    ap.add_argument("--sim-launchers", default="mpiexec,srun",
                    help="which of the simulated cluster's launchers run each layout (default mpiexec,srun)")
    ap.add_argument("--timeout", type=float, default=900, help="wall-clock limit per stage in seconds (default 900)")
    ap.add_argument("--total-timeout", type=float, default=2700,
                    help="wall-clock budget for all stages together in seconds (default 2700; 0 = none)")
    ap.add_argument("--faulthandler-timeout", type=float, default=300,
                    help="dump Python tracebacks of a test running longer than this "
                         "(pytest faulthandler_timeout; 0 = off)")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression, for every stage")
    ap.add_argument("--no-serial", action="store_true", help="skip the serial stage")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ap.add_argument("--jobs", type=int, default=min(2 * cpus, 4),  # serial tests mostly wait for the jobs they start
                    help="pytest-xdist workers for the serial stage (default: two per CPU this process may use, "
                         "at most 4; 1: one process)")
    ap.add_argument("--results-dir", default=str(ROOT / "test-results"),
                    help="where JUnit XML and logs go (default test-results/)")
    ap.add_argument("--skip-ran-in", metavar="DIRS", default="",
                    help="leave out of each stage the tests that the same stage of earlier runs (their --results-dir, "
                         "comma-separated) ran: a later environment runs only what the earlier ones skipped or lacked")
    ap.add_argument("--rerun", metavar="MODULES", default="",
                    help="with --skip-ran-in: comma-separated test modules (test_compat_table, ...) run again in "
                         "full, for checks that pass both ways but mean more in this environment")
    ap.add_argument("--mpiexec", default=None,
                    help="launcher to use, also by tests that start jobs (default: $MPIEXEC, else next to "
                         "sys.executable, then PATH)")
    argv, passthrough = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args, unknown = ap.parse_known_args(argv)
    extra = [*unknown, *passthrough]
    if args.keyword is not None:
        extra = ["-k", args.keyword, *extra]

    def sizes(option: str) -> list[int]:
        return [int(s) for s in getattr(args, option).replace(" ", "").split(",") if s and int(s) > 0]

    args.sizes, args.net_sizes, args.slurm_sizes = sizes("sizes"), sizes("net_sizes"), sizes("slurm_sizes")
    layouts, launchers = args.node_layouts, args.sim_launchers
    try:
        args.node_layouts = [(int(n), int(r)) for n, r in (lay.split("x") for lay in
                             layouts.replace(" ", "").split(",") if lay and lay != "0")]
    except ValueError:
        ap.error(f"--node-layouts {layouts!r}: give NODESxRANKS_PER_NODE, e.g. 2x2 or 2x2,3x1")
    if any(n < 1 or r < 1 for n, r in args.node_layouts):
        ap.error(f"--node-layouts {layouts!r}: nodes and ranks per node must be positive")
    args.sim_launchers = set(launchers.replace(" ", "").split(","))
    if not args.sim_launchers <= {"mpiexec", "srun"}:
        ap.error(f"--sim-launchers {launchers!r}: give mpiexec, srun or both (comma-separated)")
    return args, extra


def mpi_stages(args: argparse.Namespace, mpiexec: str | None, flavour: _launch.Flavour, results_dir: Path,
               pytest_args: list[str], paths: list[str]) -> list[Stage]:
    """The stages under mpiexec: the MPI tests at each size, the store tests on the network path."""
    runs = [(f"mpi n={n}", f"n{n}", n, paths, {}) for n in args.sizes]
    where = STORE_TESTS if paths else []  # the user's paths, when given
    runs += [(f"net n={n}", f"n{n}net", n, where, flavour.network_path) for n in args.net_sizes]
    stages = []
    for name, tag, n, where, env in runs:
        stage = Stage(name, tag, n, env=env)
        if mpiexec is None:
            stage.not_run = "mpiexec not found"
        else:
            stage.cmd = [*_launch.mpiexec_command(n, mpiexec), *rank_command(results_dir, tag, pytest_args, where)]
        stages.append(stage)
    return stages


def srun_stages(args: argparse.Namespace, flavour: _launch.Flavour, results_dir: Path, pytest_args: list[str],
                paths: list[str]) -> list[Stage]:
    """The MPI tests under srun on the designated SLURM cluster, at each --slurm-sizes."""
    problem = slurm_problem(flavour) if args.slurm_sizes else ""  # --slurm-sizes '': no stage, none required
    if problem and _launch.slurm_required():
        return [Stage(f"srun n={args.slurm_sizes[0]}", "srun", 0, not_run=problem)]
    if problem:
        print(f"run_suite: no srun stage: {problem}", flush=True)
        return []
    return [Stage(f"srun n={n}", f"n{n}srun", n, cmd=[
        "timeout", "-k", "10", f"{args.timeout:.0f}", "srun", "-n", str(n), "--overcommit",
        f"--mpi={flavour.srun_mpi}", "--kill-on-bad-exit=1",
        *rank_command(results_dir, f"n{n}srun", pytest_args, paths)]) for n in args.slurm_sizes]


def sim_stages(args: argparse.Namespace, mpiexec: str | None, flavour: _launch.Flavour, results_dir: Path,
               pytest_args: list[str], paths: list[str]) -> list[Stage]:
    """The MPI tests on the designated simulated cluster: each layout under each of --sim-launchers."""
    stages = []
    for nodes, per_node in args.node_layouts:
        layout, n = f"{nodes}x{per_node}", nodes * per_node
        launch = {"mpiexec": ["mpiexec", "-n", str(n), "-ppn", str(per_node)],
                  "srun": ["srun", "-N", str(nodes), f"--ntasks-per-node={per_node}", "--overcommit", "--mpi=pmi2",
                           "--kill-on-bad-exit=1"]}
        runs = [(f"sim {name} {layout}", f"n{n}sim{'' if name == 'mpiexec' else name}{layout}", argv)
                for name, argv in launch.items() if name in args.sim_launchers]
        problem = sim_problem(flavour.name, mpiexec, nodes)
        if problem and _launch.sim_cluster_required():
            stages += [Stage(name, tag, n, not_run=problem) for name, tag, _ in runs]
        elif problem:
            print(f"run_suite: no {' or '.join(name for name, _, _ in runs)} stage: {problem}", flush=True)
        else:
            env = {"HPC_C10D_SIM_DIR": _launch.sim_cluster_env()["HPC_C10D_SIM_DIR"],  # the designated one
                   "HPC_C10D_SIM_MPIEXEC": str(mpiexec),
                   _launch.TEST_NODES: str(nodes), _launch.TEST_RANKS_PER_NODE: str(per_node)}
            stages += [Stage(name, tag, n, env=env, cmd=[
                "timeout", "-k", "10", f"{args.timeout:.0f}", *_launch.sim_cluster_command(*argv), "--",
                *rank_command(results_dir, tag, pytest_args, paths)]) for name, tag, argv in runs]
    return stages


def rank_command(results_dir: Path, tag: str, pytest_args: list[str], paths: list[str]) -> list[str]:
    """What the launcher starts on each rank: this script's rank worker, running the mpi-marked tests."""
    return [sys.executable, str(THIS), WORKER_FLAG, str(results_dir), tag, "--", *MPI_PYTEST_ARGS, *pytest_args,
            *paths]


def leave_out_what_ran(stages: list[Stage], args: argparse.Namespace, results_dir: Path) -> None:
    """--skip-ran-in: each stage deselects the ids the same stage of the earlier runs ran (but --rerun's)."""
    rerun = {m for m in args.rerun.split(",") if m}
    for stage in stages:
        if stage.cmd:
            done = set().union(*(_ledger.ran_in(Path(d), stage.tag) for d in args.skip_ran_in.split(",") if d))
            ran = results_dir / f"{stage.tag}.ran"
            ran.write_text("".join(f"{tid}\n" for tid in sorted(done) if tid.split("::")[0] not in rerun))
            stage.cmd += ["--skip-ran", str(ran)]


def run_all(stages: list[Stage], args: argparse.Namespace, env: dict[str, str], results_dir: Path) -> bool:
    """Run the stages in order within --total-timeout; whether the user interrupted."""
    start = time.monotonic()
    try:
        for stage in stages:
            if stage.not_run:
                continue
            budget = args.timeout
            if args.total_timeout > 0:
                left = args.total_timeout - (time.monotonic() - start)
                if left < 30:
                    stage.not_run = f"overall budget (--total-timeout {args.total_timeout:g}s) exhausted"
                    print(f"\nrun_suite: skipping stage {stage.name}: {stage.not_run}", flush=True)
                    continue
                budget = min(budget, left)
            run_stage(stage, budget, env)
            for r in evaluate(stage, results_dir):  # rank 0's output was already shown live
                if r != 0:
                    print_log(results_dir / f"{stage.tag}-rank{r}.log", f"{stage.name} rank {r} output")
    except KeyboardInterrupt:
        print("\nrun_suite: interrupted", flush=True)
        return True
    return False


def summarize(stages: list[Stage], results_dir: Path, launcher_note: str, interrupted: bool) -> int:
    """Print the table of stages and the closing ``N passed, N failed, N skipped`` line; the exit status."""
    total_p = total_f = total_s = 0
    rows = []
    for st in stages:
        if st.rc is None and not st.timed_out and not st.not_run:
            st.not_run = "interrupted" if interrupted else "not started"
        evaluate(st, results_dir)
        # A stage- or rank-level problem (no JUnit XML, timeout, bad exit status, not run) counts as one
        # failure; failed tests count one each.
        failed = st.failed + len(st.problems)
        total_p, total_f, total_s = total_p + st.passed, total_f + failed, total_s + st.skipped
        rows.append((st.name, str(st.nranks or 1), st.status, st.passed, failed, st.skipped, f"{st.elapsed:.1f}s",
                     "; ".join(st.problems)))

    print(f"\n{'=' * 78}\nrun_suite summary  (results in {results_dir})")
    if launcher_note:
        print(f"launcher: {launcher_note}")
    hdr = ("stage", "ranks", "status", "passed", "failed", "skipped", "time", "notes")
    widths = [max(len(str(r[i])) for r in [hdr, *rows]) for i in range(len(hdr) - 1)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    print(fmt.format(*hdr))
    print(fmt.format(*("-" * w for w in widths), "-----"))
    for r in rows:
        print(fmt.format(*r))
    failed_list = [(st.name, t) for st in stages for t in st.failed_tests]
    if failed_list:
        print("\nfailed tests:")
        for name, t in failed_list[:200]:
            print(f"  [{name}] {t}")
        if len(failed_list) > 200:
            print(f"  ... and {len(failed_list) - 200} more")

    ok = not interrupted and all(st.ok for st in stages) and total_f == 0
    if total_p + total_f + total_s == 0:
        print("run_suite: ERROR: no tests were collected")
        ok = False
    elif total_p == 0:
        print("run_suite: WARNING: no test passed")
    print(f"{total_p} passed, {total_f} failed, {total_s} skipped", flush=True)
    return 130 if interrupted else 0 if ok else 1


def main(argv: list[str]) -> int:
    if argv and argv[0] == WORKER_FLAG:
        return rank_worker.run(argv[1:])
    args, extra = parse_args(argv)
    results_dir = Path(args.results_dir).resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("serial.xml", "n*-rank*.xml", "n*-rank*.log", "n*-rank*.rc", "*.ran"):
        for old in results_dir.glob(pattern):
            old.unlink()

    pytest_args = ["-rfE", *extra]
    if args.faulthandler_timeout > 0:
        pytest_args = ["-o", f"faulthandler_timeout={args.faulthandler_timeout:g}", *pytest_args]
    paths = [] if has_path_arg(extra) else ["tests"]
    env = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **os.environ}

    stages: list[Stage] = []
    if not args.no_serial:
        stages.append(Stage("serial", "serial", 0, cmd=[
            sys.executable, "-m", "pytest", "-m", "not mpi", *xdist_args(args.jobs),
            f"--junitxml={results_dir / 'serial.xml'}", *pytest_args, *paths]))
    launcher_note = ""
    mpiexec = (args.mpiexec or _launch.mpiexec()) if args.sizes or args.net_sizes or args.node_layouts else None
    flavour = _launch.flavour(mpiexec)
    if args.sizes or args.net_sizes or args.node_layouts:
        if mpiexec is None:
            launcher_note = "mpiexec not found (looked at $MPIEXEC, next to sys.executable, then PATH)"
            print(f"run_suite: ERROR: {launcher_note}", file=sys.stderr)
        else:
            launcher_note = f"{mpiexec} [{flavour.name}: {_launch.identify(mpiexec)[1]}]"
            print(f"run_suite: launcher {launcher_note}", flush=True)
            env = {**flavour.job_env(), **env, "MPIEXEC": mpiexec}  # tests that start jobs use this launcher too
        stages += mpi_stages(args, mpiexec, flavour, results_dir, pytest_args, paths)
    stages += srun_stages(args, flavour, results_dir, pytest_args, paths)
    stages += sim_stages(args, mpiexec, flavour, results_dir, pytest_args, paths)
    if args.skip_ran_in:
        leave_out_what_ran(stages, args, results_dir)
    interrupted = run_all(stages, args, env, results_dir)
    return summarize(stages, results_dir, launcher_note, interrupted)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
