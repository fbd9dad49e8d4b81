"""``TorchWork``: torch's ``Work`` interface over an hpc_c10d ``Work`` (or over nothing, when done)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..diagnostics import watchdog
from ..work import WaitTimedOut

__all__ = ["TorchWork", "wait_within"]

_NO_TIMEOUT = timedelta(0)


def wait_within(work: Any, limit: timedelta | None, what: str | Callable[[], str]) -> None:
    """Wait for hpc_c10d ``work``, at most ``limit`` (None: GPU work, which orders the caller's
    stream); past it raise torch's DistBackendError ("Timed out"), as torch's gloo does, naming
    ``what`` (the operation, or what describes it) and, where the watchdog runs, who is where."""
    try:
        work.wait(limit)
    except WaitTimedOut as timed_out:
        if limit is None:
            raise
        message = (f"{what if isinstance(what, str) else what()}: Timed out waiting "
                   f"{round(limit.total_seconds() * 1000)}ms for the other ranks; the group may be unusable now")
        report = watchdog.explain(message)
        raise dist.DistBackendError(message if report is None else f"{message}\n{report}") from timed_out


class TorchWork(dist.Work):
    """A collective's handle for torch and its C++ callers (DDP's reducer, functional collectives).

    ``pending`` is the hpc_c10d ``Work`` of a nonblocking MPI operation, or None when the
    operation already finished. MPI has no completion callbacks, so ``get_future`` first waits
    for the operation and hands out a completed future: torch's C++ callers wait on futures
    without calling back into Python, and an incomplete one would never finish.
    """

    def __init__(self, pending: Any, outputs: list, limit: Callable[[], timedelta] | None = None,
                 what: str | Callable[[], str] = "Work.wait") -> None:
        super().__init__()
        self._pending = pending
        self._outputs = outputs
        self._limit = limit  # the operation's timeout, asked only when a wait needs it (MPI work)
        self._what = what  # the operation, for a timeout's message

    def wait(self, timeout: timedelta = _NO_TIMEOUT) -> bool:
        """Block until the operation finishes; past ``timeout`` (if nonzero) or else the operation's
        (MPI work: GPU work orders the caller's stream), raise DistBackendError, as torch's gloo does."""
        if self._pending is not None:
            limit = self._limit() if self._limit is not None else None
            wait_within(self._pending, timeout if timeout else limit, self._what)
        return True

    def is_completed(self) -> bool:
        """Return True once the operation finished (never blocks)."""
        return self._pending is None or self._pending.is_completed()

    def is_success(self) -> bool:
        """Return True if the operation finished without an error."""
        return self._pending is None or self._pending.is_success()

    def exception(self) -> BaseException | None:
        """Return the error the operation ended with, if any."""
        return None if self._pending is None else self._pending.exception()

    def synchronize(self) -> None:
        """Same as ``wait()`` for CPU work."""
        self.wait()

    def result(self) -> list:
        """Return the output tensors."""
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        """Wait for the operation, then return a completed future holding the output tensors."""
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future

    def _source_rank(self) -> int:
        """Return the group rank a receive came from (waits for it)."""
        if self._pending is None:
            raise ValueError("_source_rank() is only defined for receives")
        return self._pending._source_rank()

    source_rank = _source_rank
