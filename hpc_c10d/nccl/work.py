"""``CUDAWork``: a GPU operation queued on a communicator's stream, tracked by a CUDA event.

As in torch's ProcessGroupNCCL, ``wait()`` does not block the host: it makes the caller's
current stream wait for the operation's event. ``wait(timeout)`` and ``synchronize()``-style
host blocking are opt-in. The Work keeps every buffer alive until the event has passed, so a
caller that drops its array early cannot hand the memory back to the allocator mid-operation.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any

from ..errors import DistBackendError
from ..work import Future, Work
from . import cuda
from .buffers import DeviceBuffer

__all__ = ["CUDAWork"]

_POLL_S = 1e-4


class _EventFuture(Future):
    """A future whose ``wait`` blocks the host until the event passes (torch's NCCL futures
    make the current stream wait instead; a host wait is the safe superset)."""

    __slots__ = ()
    _work: CUDAWork | None

    def wait(self) -> Any:
        if not self._done and self._work is not None:
            self._work.block_host()
        return self.value()


class CUDAWork(Work):
    """One operation (or one group of NCCL calls) on one communicator."""

    __slots__ = ("_event", "_comm", "_caller", "op_name", "_started")
    _mpi_requests = False
    _future_type = _EventFuture  # its wait blocks on the event

    def __init__(self, event: Any, comm: Any, outputs: list, keep: Any, op_name: str, caller: DeviceBuffer) -> None:
        super().__init__((), outputs, None, keep)
        self._done = False
        self._event = event
        self._comm = comm
        self._caller = caller  # whose current stream ``wait`` holds back
        self.op_name = op_name
        self._started = time.monotonic()

    def _raise_async_error(self) -> None:
        if self._exception is None:
            error = self._comm.async_error()
            if error is not None:
                self._exception = DistBackendError(f"{self.op_name} failed on cuda:{self._comm.device}: {error}")
        if self._exception is not None:
            raise self._exception

    def _passed(self) -> bool:
        """True once the GPU has passed the operation, or failed before it (a CUDA error is sticky:
        it is kept as the operation's error and the operation counts as finished)."""
        try:
            return cuda.event_passed(self._event)
        except DistBackendError as exc:
            if self._exception is None:
                self._exception = self._failed(exc)
            return True

    def _failed(self, cuda_error: DistBackendError) -> DistBackendError:
        """The operation's error for a CUDA error met while waiting for it."""
        return DistBackendError(f"{self.op_name} on cuda:{self._comm.device}: {cuda_error}")

    def _retire(self) -> None:
        """Complete an operation found finished while pruning; an error stays on the Work (and its
        future), for whoever asks."""
        with contextlib.suppress(Exception):  # kept in self._exception: raised to whoever waits
            self._complete()

    def is_completed(self) -> bool:
        """True once the GPU has passed the operation (never blocks); raises NCCL's async error
        or the CUDA error it failed with."""
        if not self._done:
            passed = self._passed()
            self._raise_async_error()  # the CUDA error _passed kept, or NCCL's
            if not passed:
                return False
            self._complete()
        return True

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Make the caller's current stream wait for the operation (the host does not block).

        With ``timeout`` the host waits too, and DistBackendError is raised past it (the
        communicator is aborted first, as torch does, so no rank stays stuck in NCCL).
        """
        if timeout is not None:
            self._wait_host(timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout))
        elif not self._done:
            self._raise_async_error()
            if self._passed():
                self._complete()
            else:
                cuda.caller_stream(self._caller).wait_event(self._event)
        if self._exception is not None:
            raise self._exception
        return True

    def _wait_host(self, seconds: float | None) -> None:
        """Poll until the operation has finished, raising NCCL's asynchronous error as soon as the
        communicator reports one (a dead peer); past ``seconds`` (None: no limit) abort the
        communicator and raise."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.is_completed():
            if deadline is not None and time.monotonic() > deadline:
                self._comm.abort()
                self._exception = DistBackendError(
                    f"Work.wait timed out after {seconds:g} s waiting for {self.op_name} on cuda:{self._comm.device}; "
                    "its NCCL communicator was aborted")
                raise self._exception
            time.sleep(_POLL_S)

    def synchronize(self) -> None:
        """Same as ``wait()``: the caller's stream waits for the operation."""
        self.wait()

    def block_host(self) -> None:
        """Block the host until the GPU has finished the operation, within its group's timeout (a
        poll, so NCCL's asynchronous error ends the wait at once). An operation that failed at
        launch, its error raised to its caller then, is waited for without raising it again: the
        part it launched may still be running."""
        if self._done:
            return
        if self._exception is None:
            self._wait_host(self._comm.timeout_s)
            return
        deadline = time.monotonic() + self._comm.timeout_s
        while not self._passed() and time.monotonic() < deadline and self._comm.async_error() is None:
            time.sleep(_POLL_S)

    @property
    def where(self) -> str:
        """The device it runs on, ``cuda:N``."""
        return f"cuda:{self._comm.device}"

    def age(self) -> float:
        """Seconds since the operation was queued."""
        return time.monotonic() - self._started
