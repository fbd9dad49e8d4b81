"""``monitored_barrier``: a barrier that names the ranks that did not arrive in time.

Group rank 0 collects one message from every other rank and then releases them all; past the
timeout it raises ``DistBackendError`` naming the first missing rank (or all of them with
``wait_all_ranks=True``). The other ranks raise if no release comes in time. Point-to-point
on the group's MPI communicator, so it works whatever backend serves the group's arrays.
"""

from __future__ import annotations

import time
from datetime import timedelta

from ..errors import DistBackendError
from ..process_group import ProcessGroup
from ..state import resolve_group, warn_not_in_group
from ..timeouts import check_timeout

__all__ = ["monitored_barrier"]

_ARRIVE_TAG = 32001
_RELEASE_TAG = 32002
_POLL_S = 1e-3


def _poll(requests: list, deadline: float) -> list[bool]:
    """Test ``requests`` until all are done or ``deadline``; return which completed."""
    done = [False] * len(requests)
    while True:
        for i, request in enumerate(requests):
            if not done[i]:
                done[i] = request.Test()
        if all(done) or time.monotonic() > deadline:
            return done
        time.sleep(_POLL_S)


def _cancel(requests: list, done: list[bool]) -> None:
    for request, finished in zip(requests, done):
        if not finished:
            request.Cancel()
            request.Wait()


def monitored_barrier(group: ProcessGroup | None = None, timeout: timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """Barrier that raises DistBackendError naming the ranks missing after ``timeout``."""
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group("monitored_barrier")
        return
    seconds = check_timeout(timeout, pg._timeout).total_seconds()
    deadline = time.monotonic() + seconds
    comm, me = pg.comm, pg.rank()
    if me != 0:
        requests = [comm.Isend(b"", 0, _ARRIVE_TAG), comm.Irecv(bytearray(0), 0, _RELEASE_TAG)]
        done = _poll(requests, deadline)
        if not all(done):
            _cancel(requests, done)
            raise DistBackendError(f"[Rank {pg.global_rank(me)}]: timed out in monitored_barrier after "
                                   f"{seconds:g} s waiting for rank {pg.global_rank(0)} to release it")
        return
    others = range(1, pg.size())
    requests = [comm.Irecv(bytearray(0), r, _ARRIVE_TAG) for r in others]
    done = _poll(requests, deadline)
    missing = [pg.global_rank(r) for r, ok in zip(others, done) if not ok]
    if missing:
        _cancel(requests, done)
        shown = missing if wait_all_ranks else missing[:1]
        noun = "Ranks" if len(shown) > 1 else "Rank"
        raise DistBackendError(f"[Rank {pg.global_rank(0)}]: {noun} {', '.join(map(str, shown))} failed to "
                               f"pass monitoredBarrier in {seconds * 1000:g} ms")
    releases = [comm.Isend(b"", r, _RELEASE_TAG) for r in others]
    if releases:
        releases[0].Waitall(releases)
