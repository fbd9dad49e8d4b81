"""The pytest plugin for distributed tests under ``mpiexec``: one verdict per test, a time limit.

Inert unless asked for (``--hpc-c10d``, the ini setting ``hpc_c10d = true``, or ``-p
hpc_c10d.testing.pytest_plugin``). Then the ranks check they collected the same tests, agree on
each phase's outcome (``verdict.py``), hold each test to its time limit (``time_limit.py``), print
on rank 0 only, and get the fixtures and markers. Use: docs/testing_your_code.md; design:
docs/architecture.md, "The testing kit".
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

__all__ = ["DistributedRun"]

_DEFAULT_LIMIT_S = 300.0
_PATIENCE_MARGIN_S = 60.0  # waited beyond a test's limit for the slowest rank's verdict
_SKIPPED_FOR_THE_KIT = pytest.StashKey[int]()  # tests skipped because they need the kit and it is off


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hpc_c10d", "distributed tests under mpiexec (hpc_c10d)")
    group.addoption("--hpc-c10d", action="store_true", default=None,
                    help="one verdict per test across the MPI ranks, a time limit per test, only rank 0 reports")
    group.addoption("--hpc-c10d-time-limit", type=float, default=None, metavar="SECONDS",
                    help=f"time limit of each test (default: ini hpc_c10d_time_limit, else {_DEFAULT_LIMIT_S:g})")
    group.addoption("--hpc-c10d-every-rank", action="store_true", default=False,
                    help="every rank prints its own report (default: only rank 0)")
    parser.addini("hpc_c10d", type="bool", default=False, help="switch the hpc_c10d plugin on (as --hpc-c10d)")
    parser.addini("hpc_c10d_time_limit", default=str(_DEFAULT_LIMIT_S), help="seconds per test (hpc_c10d)")


@pytest.hookimpl(tryfirst=True)  # before the terminal and JUnit XML plugins set themselves up
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "world_size(*sizes, min_size=None, max_size=None): run only at these world "
                                       "sizes (hpc_c10d), skip with a reason otherwise")
    config.addinivalue_line("markers", "time_limit(seconds): this test's time limit under --hpc-c10d")
    enabled = config.getoption("hpc_c10d")
    if enabled is None:
        enabled = config.getini("hpc_c10d")
    if enabled:
        config.pluginmanager.register(DistributedRun(config), "hpc_c10d-run")
    config.stash[_SKIPPED_FOR_THE_KIT] = 0


def _the_run(config: pytest.Config) -> DistributedRun:
    run = config.pluginmanager.get_plugin("hpc_c10d-run")
    if run is None:
        config.stash[_SKIPPED_FOR_THE_KIT] += 1
        pytest.skip("the hpc_c10d pytest plugin is off: run pytest with --hpc-c10d")
    return run


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around the terminal reporter's: after its last line
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    """With the kit off, say at the very end that tests needing it were skipped, not run."""
    yield
    skipped = session.config.stash.get(_SKIPPED_FOR_THE_KIT, 0)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if skipped and reporter is not None:
        reporter.write_line(_kit_off_warning(skipped), yellow=True, bold=True)


def _kit_off_warning(skipped: int) -> str:
    from ..job import jobenv

    line = (f"hpc_c10d: {skipped} test(s) skipped, not run: they need the testing kit, which is off; "
            "run pytest with --hpc-c10d")
    ranks = jobenv.detect().env_size or 1
    if ranks > 1:
        line += f" (without it each of the {ranks} ranks ran the whole session on its own)"
    return line


def _size_problem(marker: Any, size: int) -> str:
    """Why a test marked ``world_size(...)`` does not run at ``size`` ('' when it does)."""
    sizes, low, high = marker.args, marker.kwargs.get("min_size"), marker.kwargs.get("max_size")
    if (sizes and size not in sizes) or (low is not None and size < low) or (high is not None and size > high):
        wanted = [f"one of {list(sizes)}"] if sizes else []
        wanted += [f">= {low}"] if low is not None else []
        wanted += [f"<= {high}"] if high is not None else []
        return f"needs world size {' and '.join(wanted)}; this run has {size}"
    return ""


class _RankReport:
    """The agreed failure report, as pytest shows a failure's long report."""

    def __init__(self, text: str, crash: str) -> None:
        self._text = text
        self.reprcrash = _Crash(crash)

    def toterminal(self, tw: Any) -> None:
        for line in self._text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self._text


class _Crash:
    def __init__(self, message: str) -> None:
        self.message, self.path, self.lineno = message, "", 0


class DistributedRun:
    """The plugin's state in one pytest run on one rank."""

    def __init__(self, config: pytest.Config) -> None:
        from ..diagnostics import watchdog
        from ..mpi import bootstrap
        from .time_limit import TimeLimit

        self._config = config
        MPI = bootstrap.initialize()
        self.comm = MPI.COMM_WORLD.Dup()  # the kit's own traffic, apart from the tests'
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        limit = config.getoption("hpc_c10d_time_limit")
        self.default_limit = float(limit if limit is not None else config.getini("hpc_c10d_time_limit"))
        self.tally: Counter[str] = Counter()
        self.ended = ""  # why the run cannot go on (a rank blocked in MPI for good)
        self.renewals = 0  # times the default group was made afresh after a time limit
        self._item: pytest.Item | None = None
        self._when = "setup"  # the current phase
        self._ended_at: pytest.Item | None = None  # the test in which the run ended
        self._session: pytest.Session | None = None
        self._outcome = "passed"  # the current test's, as its phases' verdicts come in
        self._deadline = 0.0
        self._limit = 0.0
        self._shared_base: Path | None = None
        self._time_limit = TimeLimit(MPI, self._stand_in)
        watchdog.before_fatal_report.append(self._hand_back_stderr)
        xml_paths = self.comm.allgather(getattr(config.option, "xmlpath", None))
        if self.rank != 0 and not config.getoption("hpc_c10d_every_rank"):
            config.pluginmanager.set_blocked("terminalreporter")  # rank 0 speaks for every rank
            if xml_paths[self.rank] == xml_paths[0]:
                config.option.xmlpath = None  # one --junitxml file for the run: rank 0's (the verdicts agree)

    # ------------------------------------------------------------------ collection
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            marker = item.get_closest_marker("world_size")
            problem = _size_problem(marker, self.size) if marker is not None else ""
            if problem:
                item.add_marker(pytest.mark.skip(reason=problem))
        if self.size > 1:
            digest = hashlib.sha256("\n".join(item.nodeid for item in items).encode()).hexdigest()
            digests = self.comm.allgather((digest, len(items)))
            differ = [rank for rank, (d, _) in enumerate(digests) if d != digests[0][0]]
            if differ:
                counts = ", ".join(f"rank {r}: {n}" for r, (_, n) in enumerate(digests))
                raise pytest.UsageError(f"ranks {differ} collected other tests than rank 0 ({counts} tests): "
                                        "every rank must collect the same tests in the same order")

    # ------------------------------------------------------------------ each test
    def _limit_of(self, item: pytest.Item) -> float:
        marker = item.get_closest_marker("time_limit")
        return float(marker.args[0]) if marker is not None else self.default_limit

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._session = session

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        self._item, self._limit, self._outcome = item, self._limit_of(item), "passed"
        self._deadline = time.monotonic() + self._limit
        yield
        self._item = None

    def _phase(self, when: str) -> Iterator[None]:
        self._when = when
        if not self.ended:
            self._time_limit.start_phase(self._deadline, self._limit)
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._phase("setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._phase("call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield from self._phase("teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
        expiry = self._time_limit.end_phase()
        outcome = yield
        report = outcome.get_result()
        if self.ended:
            return
        from .verdict import FAILED, PASSED, SKIPPED, RankOutcome

        code = FAILED if report.failed else SKIPPED if report.skipped else PASSED
        mine = RankOutcome(code)
        if report.skipped:
            skip = report.longrepr
            mine.skip = skip if isinstance(skip, tuple) else (item.nodeid, 0, str(skip))
        if report.failed:
            mine.text = report.longreprtext
            crash = getattr(report.longrepr, "reprcrash", None)
            mine.crash = crash.message if crash is not None else (mine.text.strip().splitlines() or [""])[-1]
        if expiry is not None:
            mine.code, mine.timed_out, mine.snapshot = FAILED, expiry.message, expiry.snapshot
            mine.text = f"{expiry.message}\n{mine.text}" if mine.text else expiry.message
            mine.crash = expiry.message
        verdict = self._agree(item, report.when, mine)
        if verdict.timed_out_ranks:  # what follows (the teardown) gets a full limit again, on every rank
            self._deadline = time.monotonic() + self._limit
        self._apply(report, verdict)
        if self.ended:
            self._ended_at = item
            item.session.shouldstop = f"hpc_c10d: {self.ended}"

    def _agree(self, item: pytest.Item, when: str, mine: Any) -> Any:
        verdict = self._exchange(mine, f"{item.nodeid} ({when})")
        if verdict.stuck_ranks:
            self.ended = verdict.crash
        elif verdict.timed_out_ranks:
            self._renew_world()
        return verdict

    def _apply(self, report: pytest.TestReport, verdict: Any) -> None:
        if verdict.outcome == "failed":
            report.outcome = "failed"
            report.longrepr = cast(Any, _RankReport(verdict.text, verdict.crash))  # pytest's TerminalRepr protocol
            if hasattr(report, "wasxfail"):
                del report.wasxfail
        elif verdict.skip is not None and report.passed:  # another rank skipped
            report.outcome, report.longrepr = "skipped", verdict.skip
        if report.outcome == "failed" or (report.when == "call" and self._outcome != "failed"):
            self._outcome = report.outcome
        elif report.when == "setup" and report.skipped:
            self._outcome = "skipped"
        if report.when == "teardown":
            self.tally[self._outcome] += 1

    # ------------------------------------------------------------------ a rank blocked for good
    def _stand_in(self, expiry: Any) -> None:
        """Called from the time-limit thread: the main thread is blocked inside MPI for good.
        Take its part in the verdict; on rank 0, finish the session's report in its place; end the process."""
        from .verdict import FAILED, RankOutcome

        item = self._item
        name = item.nodeid if item is not None else "(between tests)"
        mine = RankOutcome(FAILED, f"{expiry.message}\nthe test's stack then:\n{expiry.stack}", expiry.message,
                           expiry.message, True, expiry.snapshot)
        verdict = self._exchange(mine, name)
        self.ended, self._ended_at = verdict.crash, item
        if self.rank == 0:
            try:
                self._finish_session(item, verdict)
            except Exception as exc:  # the process ends next whatever happens: say what was lost
                print(f"hpc_c10d: the report could not be finished: {type(exc).__name__}: {exc}\n{verdict.text}",
                      file=sys.stderr, flush=True)
        self._end_process(1)

    def _finish_session(self, item: pytest.Item | None, verdict: Any) -> None:
        """From the time-limit thread, in place of rank 0's blocked main thread: pytest gets the stuck
        test's report and ends the session as it would have (every failure's report, the short summary,
        ``--junitxml``, the final counts), with the tests not run reported skipped."""
        capture = self._config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)  # the stuck main thread's capture: to the terminal
        hook = self._config.hook
        if item is not None:
            report = pytest.TestReport(item.nodeid, item.location, {}, "failed",
                                       _RankReport(verdict.text, verdict.crash), self._when,  # type: ignore[arg-type]
                                       user_properties=item.user_properties)
            hook.pytest_runtest_logreport(report=report)
            hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            self.tally["failed"] += 1
        if self._session is not None:
            self._session.shouldstop = f"hpc_c10d: {self.ended}"
            self._session.exitstatus = pytest.ExitCode.TESTS_FAILED
            hook.pytest_sessionfinish(session=self._session, exitstatus=pytest.ExitCode.TESTS_FAILED)
        sys.stdout.flush()

    def _report_not_run(self, session: pytest.Session) -> None:
        """The tests after the one the run ended in, to pytest as skipped: "not run: the run ended at <test>"."""
        at = self._ended_at
        if at is None or at not in session.items:
            return
        hook, reason = self._config.hook, f"not run: the run ended at {at.nodeid}"
        for item in session.items[session.items.index(at) + 1:]:
            hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            line = (item.location[1] or 0) + 1
            hook.pytest_runtest_logreport(report=pytest.TestReport(
                item.nodeid, item.location, {}, "skipped", (str(item.path), line, f"Skipped: {reason}"), "setup"))
            hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            self.tally["not run"] += 1

    def _end_process(self, status: int) -> None:
        """Leave without MPI_Finalize (a rank is blocked in MPI): after every rank got here, or 30 s."""
        from .verdict import poll

        try:
            poll(self.comm.Ibarrier(), 30.0, "the ranks' end")
        except TimeoutError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    def _exchange(self, mine: Any, what: str) -> Any:
        """This rank's part of the verdict (``verdict.agree``); a rank that never comes within the
        test's limit and a margin ends the job."""
        from .verdict import agree

        try:
            return agree(self.comm, mine, self._limit + _PATIENCE_MARGIN_S, what)
        except TimeoutError as exc:
            print(f"hpc_c10d: {exc}; ending the job", file=sys.stderr, flush=True)
            self.comm.Abort(1)
            raise  # Abort does not return

    # ------------------------------------------------------------------ the default group
    def _renew_world(self) -> None:
        """After a time limit: drop the default group and every other without communicating (their
        communicators may hold operations that will never match) and make a fresh one."""
        from .. import lifecycle

        if not lifecycle.is_initialized():
            return
        lifecycle._drop_after_hang()
        lifecycle.init_process_group()
        self.renewals += 1

    def ensure_world(self) -> None:
        from .. import lifecycle

        if not lifecycle.is_initialized():
            lifecycle.init_process_group()

    def shared_base(self, factory: pytest.TempPathFactory) -> Path:
        """One directory for the run, the same path on every rank (made by rank 0)."""
        if self._shared_base is None:
            made = str(factory.mktemp("hpc_c10d", numbered=True)) if self.rank == 0 else None
            self._shared_base = Path(self.comm.bcast(made))
        return self._shared_base

    @pytest.hookimpl(tryfirst=True)  # before --junitxml writes its file
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from .. import lifecycle

        if self.ended:
            self._report_not_run(session)
        elif lifecycle.is_initialized():
            lifecycle.destroy_process_group()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.ended:
            where = f" at {self._ended_at.nodeid}" if self._ended_at is not None else ""
            terminalreporter.write_line(f"hpc_c10d: the run ended{where}: {self.ended}; "
                                        f"{self.tally['not run']} later test(s) not run", red=True)
        elif self.renewals:
            terminalreporter.write_line(f"hpc_c10d: the default group was made afresh {self.renewals} time(s), "
                                        "after tests that ran past their time limit")

    def _hand_back_stderr(self) -> None:
        """Before the watchdog reports what it ends the job for: pytest's capture and its log handler
        would hold the report until a test's end that never comes; stderr goes to the terminal again,
        and hpc_c10d's log records with it."""
        from ..diagnostics.logs import logger

        capture = self._config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        logger.addHandler(logging.StreamHandler(sys.stderr))
        logger.propagate = False

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from ..diagnostics import watchdog

        if self.ended:
            self._end_process(1)  # tests failed, as on the stuck rank
        watchdog.before_fatal_report.remove(self._hand_back_stderr)
        self._time_limit.stop()
        self.comm.Free()


# ---------------------------------------------------------------------- fixtures
@pytest.fixture
def dist_world(request: pytest.FixtureRequest) -> Any:
    """The default process group (made once per run, afresh after a test past its time limit)."""
    _the_run(request.config).ensure_world()
    from ..state import GroupMember

    return GroupMember.WORLD


@pytest.fixture
def dist_rank(dist_world: Any) -> int:
    """This process's rank in the default group."""
    from .. import lifecycle

    return lifecycle.get_rank()


@pytest.fixture
def dist_world_size(dist_world: Any) -> int:
    """The default group's size."""
    from .. import lifecycle

    return lifecycle.get_world_size()


@pytest.fixture
def dist_new_group(dist_world: Any) -> Iterator[Callable[..., Any]]:
    """``dist_new_group(ranks=None, **kwargs)``: ``new_group`` (collective), destroyed after the test."""
    from .. import groups, lifecycle
    from ..process_group import ProcessGroup

    made: list[Any] = []
    world = dist_world

    def make(ranks: Any = None, **kwargs: Any) -> Any:
        group = groups.new_group(ranks, **kwargs)
        made.append(group)
        return group

    yield make
    from ..state import _world

    if _world.default_pg is world:  # not made afresh meanwhile (its groups are gone then)
        for group in reversed(made):
            if isinstance(group, ProcessGroup):  # not GroupMember.NON_GROUP_MEMBER
                lifecycle.destroy_process_group(group)


@pytest.fixture
def dist_store(request: pytest.FixtureRequest, dist_world: Any) -> Any:
    """The default store, its keys prefixed with the test's id (tests do not see each other's keys)."""
    from .. import lifecycle
    from ..store import PrefixStore

    return PrefixStore(f"hpc_c10d-test/{request.node.nodeid}", lifecycle._get_default_store())


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name)[:120]


@pytest.fixture
def shared_tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for this test with the same path on every rank (one node's, or a shared file
    system's when ``--basetemp`` points at one)."""
    run = _the_run(request.config)
    path = run.shared_base(tmp_path_factory) / _safe(request.node.nodeid)
    if run.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    run.comm.Barrier()
    return path


@pytest.fixture
def rank_tmp_path(shared_tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """This rank's own directory for this test: ``shared_tmp_path / f"rank{rank}"``."""
    path = shared_tmp_path / f"rank{_the_run(request.config).rank}"
    path.mkdir(exist_ok=True)
    return path
