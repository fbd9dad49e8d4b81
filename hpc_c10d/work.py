"""``Work`` handles for asynchronous operations, and the ``Future`` they hand out."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable, Sequence

from .errors import DistBackendError

__all__ = ["Work", "ReceiveWork", "Future", "WaitTimedOut", "combine_works", "spin"]

_SPIN_S = 2e-4  # a bounded wait tests without sleeping this long first (a sleep costs ~50 us)
_POLL_START_S = 1e-6
_POLL_MAX_S = 1e-3


def spin(test: Callable[[], bool], seconds: float = _SPIN_S) -> bool:
    """Call ``test`` without sleeping until it returns True or ``seconds`` have passed; its last answer."""
    end = time.monotonic() + seconds
    while not test():
        if time.monotonic() > end:
            return False
    return True


class WaitTimedOut(DistBackendError):
    """``Work.wait(timeout)`` ran out of time (the operation may still complete later)."""


class Future:
    """A value that becomes available when a ``Work`` completes (torch.futures.Future subset).

    MPI has no completion callbacks, so a future attached to a Work completes when someone
    asks it (``wait``, ``value``, ``done``) or waits on the Work; ``then`` callbacks run then.
    """

    __slots__ = ("_work", "_value", "_exception", "_done", "_callbacks")

    def __init__(self, work: "Work | None" = None) -> None:
        self._work = work
        self._value: Any = None
        self._exception: BaseException | None = None
        self._done = False
        self._callbacks: list[Callable[[Future], Any]] = []

    def done(self) -> bool:
        """Return True once the value (or an exception) is set."""
        if not self._done and self._work is not None:
            self._work.is_completed()
        return self._done

    def wait(self) -> Any:
        """Block until done and return the value, raising the stored exception if any."""
        if not self._done and self._work is not None:
            self._work.wait()
        if not self._done:
            raise RuntimeError("Future.wait() on a future that nothing will complete")
        return self.value()

    def value(self) -> Any:
        """Return the value of a completed future (raise its exception if it failed)."""
        if not self.done():
            raise RuntimeError("Future.value() called before the future completed")
        if self._exception is not None:
            raise self._exception
        return self._value

    def set_result(self, result: Any) -> None:
        """Complete the future with ``result`` and run its callbacks."""
        if self._done:
            raise RuntimeError("Future already completed")
        self._value = result
        self._finish()

    def set_exception(self, exc: BaseException) -> None:
        """Complete the future with an exception and run its callbacks."""
        if self._done:
            raise RuntimeError("Future already completed")
        self._exception = exc
        self._finish()

    def _finish(self) -> None:
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[["Future"], Any]) -> None:
        """Run ``callback(self)`` when the future completes (now, if it already has)."""
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def then(self, callback: Callable[["Future"], Any]) -> "Future":
        """Return a future holding ``callback(self)``, computed when this one completes."""
        chained = type(self)(self._work)  # a GPU future chains into a GPU future

        def run(fut: Future) -> None:
            try:
                chained.set_result(callback(fut))
            except BaseException as exc:  # the chained future carries it, as torch does
                chained.set_exception(exc)

        self.add_done_callback(run)
        return chained


class Work:
    """A pending operation: MPI requests, the arrays they use, and what to do when they finish.

    The Work keeps every buffer alive until completion. ``finish`` (optional) runs once, after
    the requests complete, for post-processing such as dividing for AVG or copying out of a
    staging buffer. ``result()`` and the future's value are the output arrays, as in torch.
    """

    __slots__ = ("_requests", "_outputs", "_finish", "_keep", "_done", "_exception", "_future", "_failure",
                 "_watch")

    _status: Any = None  # receives (``ReceiveWork``) fill an MPI status
    _mpi_requests = True  # completion is exactly its MPI requests (``combine_works`` pools them)
    _future_type = Future  # what ``get_future`` hands out
    op_name = "operation"

    def __init__(
        self,
        requests: Sequence[Any] = (),
        outputs: list | None = None,
        finish: Callable[[], None] | None = None,
        keep: Any = None,
        failure: Callable[[BaseException], BaseException | None] | None = None,
        watch: Any = None,
    ) -> None:
        self._requests = requests
        self._failure = failure  # the error to raise for one out of the requests (the transport's), or None
        self._watch = watch  # what a wait also watches (the transport's refusal notices), or None
        self._outputs = [] if outputs is None else outputs
        self._finish = finish
        self._keep = keep
        self._done = not requests
        self._exception: BaseException | None = None
        self._future: Future | None = None

    def _complete(self) -> None:
        self._done = True
        self._requests = ()
        self._keep = None
        if self._finish is not None or self._future is not None:
            self._finalize()

    def _finalize(self) -> None:
        """Run the post-processing step and hand the outcome to the future, once."""
        if self._finish is not None:
            try:
                self._finish()
            except BaseException as exc:
                self._exception = exc
        future = self._future
        if future is not None and not future._done:
            if self._exception is None:
                future.set_result(self._outputs)
            else:
                future.set_exception(self._exception)
        if self._exception is not None:
            raise self._exception

    def is_completed(self) -> bool:
        """Return True if the operation finished (never blocks)."""
        if self._done:
            return True
        if self._requests and not self._test():
            return False
        self._complete()
        return True

    def _spin(self) -> bool:
        """Test without sleeping for up to ``_SPIN_S``; True, and completed, if done by then."""
        if not self._done:
            if self._requests and not spin(self._test):
                return False
            self._complete()
        return True

    def _test(self) -> bool:
        requests = self._requests
        try:
            if len(requests) == 1:
                return requests[0].Test(self._status)
            return requests[0].Testall(requests)
        except Exception as exc:
            self._raise_failure(exc)
            raise

    def _raise_failure(self, exc: Exception) -> None:
        """Raise the transport's error for ``exc`` out of the requests, where it has one (an MPI
        error: which operation, and under ULFM which ranks died); otherwise return."""
        if self._failure is not None:
            error = self._failure(exc)
            if error is not None:
                raise error from exc

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the operation finishes; with ``timeout``, raise DistBackendError past it."""
        if self._done:
            if self._exception is not None:
                raise self._exception
            return True
        requests = self._requests
        if timeout is not None:
            self._wait_until(timeout)
        else:
            try:
                if self._watch is not None:
                    if not spin(self._test):  # most small ones end within the spin: no watched wait then
                        self._watch.wait(requests, self._status, self._keep)
                elif len(requests) == 1:
                    requests[0].Wait(self._status)
                else:
                    requests[0].Waitall(requests)  # a Work without requests is created done
            except Exception as exc:
                self._raise_failure(exc)
                raise
        self._complete()
        return True

    def _wait_until(self, timeout: timedelta | float) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        deadline, pause = time.monotonic() + seconds, _POLL_START_S
        if not self._requests or spin(self._test, min(_SPIN_S, seconds)):
            return
        watch = self._watch
        while not self._test():
            if watch is not None:
                watch.check((self._requests, self._keep))
            if time.monotonic() > deadline:
                raise WaitTimedOut(f"{self.op_name}: Timed out after {seconds:g} s waiting for the "
                                       f"other ranks (Work.wait)")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def synchronize(self) -> None:
        """Same as ``wait()`` for CPU work."""
        self.wait()

    def is_success(self) -> bool:
        """Return True if the operation completed without an error."""
        return self.is_completed() and self._exception is None

    def exception(self) -> BaseException | None:
        """Return the error the operation ended with, if any."""
        return self._exception

    def result(self) -> list:
        """Return the output arrays (complete or not, as torch does)."""
        return self._outputs

    def get_future(self) -> Future:
        """Return a Future whose value is ``result()`` once the operation completes."""
        if self._future is None:
            self._future = self._future_type(self)
            if self._done:
                self._future.set_result(self._outputs)
        return self._future

    def _source_rank(self) -> int:
        """Return the group rank a receive came from (only receives know one)."""
        raise ValueError("_source_rank() is only defined for receives")

    def __repr__(self) -> str:
        state = "completed" if self._done else "pending"
        return f"<{type(self).__name__} {self.op_name} {state}>"


class ReceiveWork(Work):
    """A receive: its MPI status tells which rank the message came from."""

    __slots__ = ("_status",)
    op_name = "recv"

    def __init__(self, request: Any, outputs: list, keep: Any, status: Any,
                 failure: Callable[[BaseException], BaseException | None] | None = None,
                 watch: Any = None) -> None:
        super().__init__([request], outputs, None, keep, failure, watch)
        self._status = status

    def _source_rank(self) -> int:
        """Return the group rank the message came from (waits for it)."""
        self.wait()
        return self._status.Get_source()


class _WorkList(Work):
    """Works of different kinds (GPU ones track CUDA events, not MPI requests) as one."""

    __slots__ = ("_works",)
    _mpi_requests = False

    def __init__(self, works: Sequence[Work], outputs: list) -> None:
        super().__init__((), outputs, None, None)
        self._done = False
        self._works = list(works)

    def is_completed(self) -> bool:
        if not self._done and all(work.is_completed() for work in self._works):
            self._complete()
        return self._done

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        for work in self._works:
            work.wait(timeout)
        if not self._done:
            self._complete()
        return True


def combine_works(works: Sequence[Work], outputs: list) -> Work:
    """Return one Work that completes when every Work in ``works`` has."""
    if not all(work._mpi_requests for work in works):  # GPU work among them: wait on each
        return _WorkList(works, outputs)
    requests = [request for work in works for request in work._requests]

    def finish() -> None:
        for work in works:
            if not work._done:
                work._complete()

    failure, watch = (works[0]._failure, works[0]._watch) if works else (None, None)
    return Work(requests, outputs, finish, list(works), failure, watch)
