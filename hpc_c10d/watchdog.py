"""The watchdog: an operation outstanding past its group's timeout is reported and acted on.

One daemon thread per process, started by ``init_process_group``. It wakes every second (or
a tenth of the shortest group timeout), reads which operation each thread is inside
(``flight_recorder.in_flight``: the threads' stacks, nothing on the hot path) and notices one
that stays past its group's timeout (``Work.wait()`` without a timeout uses the default
group's). Then it writes this rank's flight-recorder dump, leaves an alarm file beside it so
every other rank's watchdog dumps too, waits ``HPC_C10D_ABORT_GRACE`` seconds (default 3)
for their dumps, logs what they show (who is stuck where) and acts on the policy:

``HPC_C10D_TIMEOUT_POLICY`` (or torch's ``TORCH_NCCL_ASYNC_ERROR_HANDLING``: 0 report, 1 and 3
abort, 2 raise):

* ``abort`` (default): ``MPI_Abort`` ends the whole job;
* ``raise``: ``DistBackendError`` is raised in the stuck thread as soon as it runs Python
  again (a ``Work.wait(timeout)`` loop does; a blocking MPI call that never returns cannot be
  interrupted, use ``abort`` for those);
* ``report``: log and dump only;  ``off``: no watchdog thread.

An unhandled exception on any rank ends the job the same way (``sys.excepthook``: the
traceback, prefixed with the rank, then dumps and ``MPI_Abort``) unless
``HPC_C10D_ABORT_ON_EXCEPTION=0`` or Python runs interactively. ``SIGUSR2`` makes a rank dump
without stopping it.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, cast

from . import flight_recorder
from ._env import non_negative
from ._state import _world, default_group
from .errors import DistBackendError
from .logs import logger

if TYPE_CHECKING:
    from .nccl.backend import NCCLBackend

__all__ = ["POLICY_ENV", "EXCEPTION_ENV", "GRACE_ENV", "policy_from_env", "grace_from_env", "Watchdog", "start",
           "stop"]

POLICY_ENV = "HPC_C10D_TIMEOUT_POLICY"
_TORCH_POLICY_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
_TORCH_POLICIES = {"0": "report", "1": "abort", "2": "raise", "3": "abort"}
POLICIES = ("abort", "raise", "report", "off")
EXCEPTION_ENV = "HPC_C10D_ABORT_ON_EXCEPTION"
GRACE_ENV = "HPC_C10D_ABORT_GRACE"
_LONGEST_PERIOD = 1.0
_SHORTEST_PERIOD = 0.05
_FORWARD_S = 1.0  # seconds between the last report line and MPI_Abort (lines were lost without it)


def policy_from_env() -> str:
    """The timeout policy; ValueError for an unknown one."""
    text = os.environ.get(POLICY_ENV, "").strip().lower()
    if text:
        if text not in POLICIES:
            raise ValueError(f"{POLICY_ENV}={text!r}: use one of {', '.join(POLICIES)}")
        return text
    torch_value = os.environ.get(_TORCH_POLICY_ENV, "").strip()
    if torch_value:
        if torch_value not in _TORCH_POLICIES:
            raise ValueError(f"{_TORCH_POLICY_ENV}={torch_value!r}: use 0, 1, 2 or 3")
        return _TORCH_POLICIES[torch_value]
    return "abort"


def grace_from_env() -> float:
    """Seconds the first rank to fail waits for the others' dumps; ValueError for a bad setting."""
    grace = non_negative(GRACE_ENV, float, "a number of seconds")
    return 3.0 if grace is None else grace


def _abort_job(MPI: Any) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_FORWARD_S)  # the launcher relays our last lines from a pipe; an abort at once can lose them
    MPI.COMM_WORLD.Abort(1)


class Watchdog:
    """The per-process watchdog thread (see the module docstring)."""

    def __init__(self, MPI: Any, policy: str, run_id: str, directory: str) -> None:
        self._MPI, self.policy, self.run_id, self.directory = MPI, policy, run_id, directory
        self.grace = grace_from_env()
        self._stop = threading.Event()
        self._seen: dict[tuple, float] = {}
        self._fired: set[tuple] = set()
        self._answered = False  # dumped for another rank's alarm already
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="hpc_c10d-watchdog", daemon=True)

    @property
    def alarm_path(self) -> str:
        return os.path.join(self.directory, f"alarm-{self.run_id}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def wake_fd(self) -> int:
        """A descriptor whose writes wake the thread at once (for ``signal.set_wakeup_fd``)."""
        return self._wake_w

    def _period(self) -> float:
        shortest = min((g._timeout.total_seconds() for g in _world.groups), default=_LONGEST_PERIOD)
        return min(_LONGEST_PERIOD, max(_SHORTEST_PERIOD, shortest / 10))

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._wake_r], [], [], self._period())
            if self._stop.is_set():
                return
            try:
                if ready and signal.SIGUSR2 in os.read(self._wake_r, 512):  # one byte per caught signal
                    self.dump("SIGUSR2")
                self._tick()
            except Exception as exc:  # the watchdog must outlive its own mistakes
                logger.warning("watchdog: %s: %s", type(exc).__name__, exc)

    def _tick(self) -> None:
        now, seen = time.monotonic(), {}
        default = _world.default_pg
        for flight in flight_recorder.in_flight(skip=threading.get_ident()):
            key = (flight.thread, flight.op, flight.group, flight.seq)
            first = seen[key] = self._seen.get(key, now)
            owner = flight.pg if flight.pg is not None else default
            if owner is None or key in self._fired:
                continue
            limit = owner._timeout.total_seconds()
            if now - first > limit:
                self._fired.add(key)
                self._timed_out(flight.describe(), now - first, limit, lambda text, t=flight.thread: _raise_in(t, text))
        self._seen = seen
        self._check_gpu_work()
        if not self._answered and os.path.exists(self.alarm_path):
            self._answered = True
            self.dump("another rank raised the alarm")

    def dump(self, reason: str) -> str | None:
        return flight_recorder.dump(reason, self.directory, skip=threading.get_ident(), run_id=self.run_id)

    def raise_alarm(self, reason: str) -> None:
        """Dump this rank, ask every other rank to dump, and wait for their dumps (up to the grace)."""
        self._answered = True
        self.dump(reason)
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(self.alarm_path, "a") as alarm:
                alarm.write(reason + "\n")
        except OSError as exc:
            logger.warning("could not write the alarm file %s: %s", self.alarm_path, exc)
        deadline = time.monotonic() + self.grace
        size = _world.default_pg._size if _world.default_pg is not None else 1
        while time.monotonic() < deadline and len(flight_recorder.dumps_of(self.directory, self.run_id)) < size:
            time.sleep(0.05)

    def _check_gpu_work(self) -> None:
        """GPU operations run on their own streams, so no thread is seen waiting for a stuck one:
        ask each group's NCCL transport for its oldest operation still running."""
        for pg in list(_world.groups):
            gpu = cast("NCCLBackend | None", pg._transports.get("cuda"))  # or wrappers forwarding to it
            if gpu is None:  # none made yet (the watchdog never makes one)
                continue
            limit = pg._timeout.total_seconds()
            stuck = gpu._overdue(limit)
            if stuck is not None and ("gpu", id(stuck)) not in self._fired:
                self._fired.add(("gpu", id(stuck)))
                what = f"{stuck.op_name} on cuda:{stuck._comm.device} in group {pg._name!r} ({pg._desc})"
                self._timed_out(what, stuck.age(), limit, lambda text, gpu=gpu: gpu.abort())  # its Work.wait raises

    def _timed_out(self, what: str, waited: float, limit: float, raise_error: Any) -> None:
        message = (f"Watchdog caught collective operation timeout: {what} has not completed "
                   f"after {waited:.1f} s (timeout {limit:g} s)")
        logger.error("%s; policy %r", message, self.policy)
        self.raise_alarm(message)
        from .trace_report import summarize  # late: only needed when something went wrong

        logger.error("what every rank was doing (dumps in %s):\n%s", self.directory,
                     summarize(flight_recorder.dumps_of(self.directory, self.run_id)))
        if self.policy == "abort":
            _abort_job(self._MPI)
        elif self.policy == "raise":
            raise_error(message)


def _raise_in(thread: int, message: str) -> None:
    """Raise DistBackendError(message) in ``thread`` as soon as it runs Python again."""
    error = type("CollectiveTimeout", (DistBackendError,),
                 {"__init__": lambda e: DistBackendError.__init__(e, message)})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(error))


_watchdog: Watchdog | None = None
_previous_hook: Any = None
_owns_wakeup = False  # SIGUSR2 and signal.set_wakeup_fd were free and are ours


def _excepthook(kind: type, value: BaseException, tb: Any) -> None:
    watchdog = _watchdog
    rank = _world.default_pg._rank if _world.default_pg is not None else "-"
    text = "".join(traceback.format_exception(kind, value, tb))
    # the process's own stderr: torch's hook around ours swaps sys.stderr for a buffer it would
    # print only after we return, and we do not return from an abort
    stream = sys.__stderr__ or sys.stderr
    stream.write("".join(f"[rank {rank}]: {line}\n" for line in text.splitlines()))
    stream.flush()
    if watchdog is None:
        return
    watchdog.raise_alarm(f"unhandled {kind.__name__} on rank {rank}: {value}")
    stream.write(f"[rank {rank}]: aborting the job (set {EXCEPTION_ENV}=0 to let other ranks go on)\n")
    _abort_job(watchdog._MPI)


def _interactive() -> bool:
    return bool(sys.flags.interactive) or hasattr(sys, "ps1")


def start(MPI: Any, run_id: str) -> None:
    """Start the watchdog, the exception hook and the SIGUSR2 dump (``init_process_group``)."""
    global _watchdog, _previous_hook, _owns_wakeup
    policy = policy_from_env()
    abort_on_exception = os.environ.get(EXCEPTION_ENV, "1").strip() not in ("0", "false", "no", "off")
    if policy == "off":
        return
    _watchdog = Watchdog(MPI, policy, run_id, flight_recorder.trace_dir())
    _watchdog.start()
    if abort_on_exception and not _interactive() and default_group()._size > 1:
        _previous_hook, sys.excepthook = sys.excepthook, _excepthook
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR2"):
        if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR2, lambda signum, frame: None)  # the watchdog thread dumps
            os.set_blocking(_watchdog.wake_fd(), False)
            previous = signal.set_wakeup_fd(_watchdog.wake_fd(), warn_on_full_buffer=False)
            _owns_wakeup = previous == -1
            if not _owns_wakeup:  # someone else (asyncio) owns it: leave theirs and SIGUSR2 alone
                signal.set_wakeup_fd(previous)
                signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def stop() -> None:
    """Undo ``start`` (``destroy_process_group``)."""
    global _watchdog, _previous_hook, _owns_wakeup
    if _owns_wakeup:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        _owns_wakeup = False
    if _previous_hook is not None and sys.excepthook is _excepthook:
        sys.excepthook = _previous_hook
    _previous_hook = None
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None
