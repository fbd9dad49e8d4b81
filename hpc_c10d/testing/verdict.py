"""One verdict per test phase across ranks: every rank says how its phase went, all agree.

On the testing kit's own communicator: four integers per rank, then, only when a rank failed or
some but not all skipped, the failing ranks' reports or the skip reasons. Failed if any rank
failed, else skipped if any skipped, else passed; every rank builds the same report. Design:
docs/architecture.md, "The testing kit".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..diagnostics import flight_recorder
from ..diagnostics.trace_report import rank_ranges, summarize

__all__ = ["PASSED", "SKIPPED", "FAILED", "RankOutcome", "Verdict", "agree", "poll"]

PASSED, SKIPPED, FAILED = 0, 1, 2


@dataclass
class RankOutcome:
    """How one phase went on this rank."""

    code: int
    text: str = ""  # the failure's report (traceback and message)
    crash: str = ""  # its one-line message
    timed_out: str = ""  # what the phase was inside when its time limit passed ('' when it did not)
    stuck: bool = False  # blocked inside MPI for good: the run cannot go on
    snapshot: dict[str, Any] | None = None  # this rank's flight-recorder snapshot at the time limit
    skip: tuple[str, int, str] | None = None  # a skip's (path, line, reason)


@dataclass
class Verdict:
    """The ranks' agreed outcome of one phase."""

    outcome: str
    failed_ranks: list[int] = field(default_factory=list)
    timed_out_ranks: list[int] = field(default_factory=list)
    stuck_ranks: list[int] = field(default_factory=list)
    text: str = ""  # the report every rank shows (empty unless failed)
    crash: str = ""  # its first line, for pytest's short summary
    skip: tuple[str, int, str] | None = None  # for ranks that did not skip: the skipping ranks' reason


def poll(request: Any, patience_s: float, what: str) -> None:
    """Wait for an MPI request by testing it: yield the core between tests for the first 50 ms, so
    ranks that share a core get to run, then sleep 2 ms between tests. Raise TimeoutError naming
    ``what`` after ``patience_s``. Polled, not blocking, so a rank that never comes cannot hold the
    others. On 4 ranks over 2 cores this added 1.4 ms to a test of three phases; a growing sleep
    added 4.9 ms, and spinning 13 ms."""
    start = time.monotonic()
    deadline = start + patience_s
    while not request.Test():
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{what}: no answer from some rank within {patience_s:g} s")
        time.sleep(0 if now - start < 0.05 else 0.002)


def agree(comm: Any, mine: RankOutcome, patience_s: float, what: str) -> Verdict:
    """Exchange ``mine`` with every rank of ``comm`` (collective) and return the verdict."""
    size = comm.Get_size()
    codes = np.array([[mine.code, bool(mine.timed_out), mine.stuck, 0]], dtype=np.int64)
    if size > 1:
        row, codes = codes, np.empty((size, 4), dtype=np.int64)
        poll(comm.Iallgather(row, codes), patience_s, what)
    failed = [int(r) for r in np.flatnonzero(codes[:, 0] == FAILED)]
    timed_out = [int(r) for r in np.flatnonzero(codes[:, 1])]
    stuck = [int(r) for r in np.flatnonzero(codes[:, 2])]
    skipped = [int(r) for r in np.flatnonzero(codes[:, 0] == SKIPPED)]
    if not failed and len(skipped) in (0, size):
        return Verdict("skipped" if skipped else "passed")
    if not failed:  # some ranks skipped: the test cannot run without them, so every rank skips
        reasons = comm.allgather(mine.skip)
        path, line, reason = reasons[skipped[0]]
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason  # pytest.skip()'s prefix
        return Verdict("skipped", skip=(path, line, f"skipped on {rank_ranges(skipped)}: {reason}"))
    own = mine if mine.code == FAILED or timed_out else RankOutcome(mine.code)
    if not timed_out:
        own.snapshot = None
    elif own.snapshot is None:  # where this rank is now, for the "who is where" report
        own.snapshot = flight_recorder.snapshot(f"finished {what}")
    details = [own] if size == 1 else comm.allgather(own)  # all ranks: each one's report shows everything
    text, crash = _report(details, failed, timed_out, stuck, what)
    return Verdict("failed", failed, timed_out, stuck, text, crash)


def _report(details: list[RankOutcome], failed: list[int], timed_out: list[int], stuck: list[int],
            what: str) -> tuple[str, str]:
    heading = f"failed on ranks {failed}"
    lines = [heading]
    by_crash: dict[str, list[int]] = {}  # ranks that failed with the same message: the first one's report
    for rank in failed:
        by_crash.setdefault(details[rank].crash or details[rank].text, []).append(rank)
    for ranks in by_crash.values():
        alike = f" (rank {ranks[0]}'s report; the others failed with the same message)" if len(ranks) > 1 else ""
        lines += ["", f"---------- {rank_ranges(ranks)}{alike} ----------", details[ranks[0]].text.rstrip()]
    if timed_out:
        snapshots = [dict(d.snapshot, run=what) for d in details if d.snapshot is not None]
        lines += ["", "---------- who is where (flight recorder, at the time limit) ----------", summarize(snapshots)]
    if stuck:
        lines += ["", f"{rank_ranges(stuck)} stayed blocked inside MPI, which cannot cancel a call in progress "
                      "(an MPI with ULFM can: Open MPI 5 under `mpiexec --with-ft ulfm`): the run ends here"]
    first = details[failed[0]]
    return "\n".join(lines), f"{heading}: {first.crash or first.timed_out or 'see the report'}"
