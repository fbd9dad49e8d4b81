"""The watchdog: an operation outstanding past its group's timeout is reported and acted on.

One daemon thread per process, started by ``init_process_group``: it samples what each thread is
inside (``flight_recorder.in_flight``) and, past a group's timeout, raises the alarm, holds the
roll call, dumps, reports who is where and applies ``HPC_C10D_TIMEOUT_POLICY``; an unhandled
exception takes the same road. Design: docs/architecture.md, "Hangs"; settings: docs/hangs.md.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import os
import secrets
import select
import signal
import socket
import stat
import sys
import termios
import threading
import time
import traceback
from ctypes.util import find_library
from typing import Any, Callable

from ..errors import DistBackendError
from ..settings import non_negative
from ..state import _world, default_group
from . import flight_recorder
from .logs import logger
from .roll_call import MAX_RANKS, RollCall

__all__ = ["POLICY_ENV", "EXCEPTION_ENV", "GRACE_ENV", "policy_from_env", "grace_from_env", "report_time", "Watchdog",
           "start", "stop", "explain", "raise_in", "before_fatal_report"]

POLICY_ENV = "HPC_C10D_TIMEOUT_POLICY"
_TORCH_POLICY_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
_TORCH_POLICIES = {"0": "report", "1": "abort", "2": "raise", "3": "abort"}
POLICIES = ("abort", "raise", "report", "off")
EXCEPTION_ENV = "HPC_C10D_ABORT_ON_EXCEPTION"
GRACE_ENV = "HPC_C10D_ABORT_GRACE"
_LONGEST_PERIOD = 1.0
_SHORTEST_PERIOD = 0.05
_NOTICE_PERIOD = 0.25  # where refusal notices run: how late one reaches a rank inside a blocking MPI call
_FORWARD_S = 1.0  # at most this long the launcher may take to read our last lines before MPI_Abort
_UNCOUNTED_S = 0.3  # the same into a terminal or socket, whose unread bytes we cannot count
_RELAYED_S = 0.05  # after it has read them: time to pass them on (lines were lost with an abort at once)
_ABORT_WAIT_S = 10.0  # a rank still alive this long after calling MPI_Abort is killed (a kernel timer)
_ANSWERING = "another rank raised the alarm"
#: called, without arguments, before a rank reports what it ends the job for: the testing kit hands
#: stderr back from pytest's capture there (the report would die unread with the process)
before_fatal_report: list[Callable[[], None]] = []


def _prepare_fatal_report() -> None:
    for prepare in before_fatal_report:
        try:
            prepare()
        except Exception as exc:  # the report and the abort come first
            logger.warning("watchdog: %s before the report: %s: %s", prepare, type(exc).__name__, exc)


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
    _kill_self_after(_FORWARD_S + _ABORT_WAIT_S)
    sys.stdout.flush()
    sys.stderr.flush()
    _wait_relayed(_FORWARD_S)
    MPI.COMM_WORLD.Abort(1)


def _wait_relayed(limit: float) -> None:
    """Wait until the launcher has read our last lines, up to ``limit`` seconds: ``MPI_Abort`` at
    once lost them. MPICH's ranks write into pipes, whose unread bytes we can count, as does Open
    MPI's stderr; into a terminal (Open MPI's stdout is one) or a socket we cannot tell: wait
    ``_UNCOUNTED_S`` (without a wait, a loaded CI run lost Open MPI's last stdout line)."""
    start, unread = time.monotonic(), array.array("i", [0])
    deadline = start + limit
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISFIFO(mode):
                while fcntl.ioctl(fd, termios.FIONREAD, unread) == 0 and unread[0] and time.monotonic() < deadline:
                    time.sleep(0.01)
            elif stat.S_ISSOCK(mode) or os.isatty(fd):
                time.sleep(max(0.0, min(deadline, start + _UNCOUNTED_S) - time.monotonic()))
        except OSError:  # closed
            continue
    time.sleep(_RELAYED_S)


_kill_timer: Any = None  # the POSIX timer of _kill_self_after, once made


def _kill_self_after(seconds: float) -> bool:
    """Have the kernel send this process SIGKILL in ``seconds`` (re-arming the timer if it was
    armed). A POSIX timer, so it fires whatever the threads are doing: ``MPI_Abort`` holds the
    GIL while it waits, and a blocked MPI call holds MPI's lock. False if no timer could be made."""
    global _kill_timer
    try:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, settime = libc.timer_create, libc.timer_settime  # glibc 2.34+: in libc; else librt
        except AttributeError:
            librt = ctypes.CDLL(find_library("rt") or "librt.so.1", use_errno=True)
            create, settime = librt.timer_create, librt.timer_settime

        class SigEvent(ctypes.Structure):  # struct sigevent (64 bytes on Linux)
            _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                        ("pad", ctypes.c_byte * 48)]

        class TimeSpec(ctypes.Structure):
            _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

        class ITimerSpec(ctypes.Structure):
            _fields_ = [("interval", TimeSpec), ("value", TimeSpec)]

        if _kill_timer is None:
            timer, event = ctypes.c_void_p(), SigEvent(None, int(signal.SIGKILL), 0)  # SIGEV_SIGNAL
            if create(1, ctypes.byref(event), ctypes.byref(timer)) != 0:  # CLOCK_MONOTONIC
                return False
            _kill_timer = timer
        whole = int(seconds)
        when = ITimerSpec(TimeSpec(0, 0), TimeSpec(whole, int((seconds - whole) * 1e9)))
        return settime(_kill_timer, 0, ctypes.byref(when), None) == 0
    except Exception as exc:  # never in the way of the abort itself
        logger.warning("watchdog: no timer to end this process should the abort hang: %s", exc)
        return False


class Watchdog:
    """The per-process watchdog thread (see the module docstring)."""

    def __init__(self, MPI: Any, policy: str, run_id: str, directory: str, roll: RollCall | None = None) -> None:
        self._MPI, self.policy, self.run_id, self.directory = MPI, policy, run_id, directory
        self._roll = roll  # None: no roll call (one rank, or too many)
        self._roll_lock = threading.Lock()
        self.grace = grace_from_env()
        self._stop = threading.Event()
        self._seen: dict[tuple, float] = {}
        self._fired: set[tuple] = set()
        self._look_again = False  # a refusal against a call first seen at the last tick: the next one soon
        self._answered = False  # dumped for another rank's alarm already
        self.explains = False  # whether explain() raises the alarm (see start)
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
        if self._roll is not None:
            self._roll.close()

    def wake_fd(self) -> int:
        """A descriptor whose writes wake the thread at once (for ``signal.set_wakeup_fd``)."""
        return self._wake_w

    def _period(self) -> float:
        shortest = min((g._timeout.total_seconds() for g in _world.groups), default=_LONGEST_PERIOD)
        longest = _NOTICE_PERIOD if _world.notices is not None else _LONGEST_PERIOD  # a refusal is seen soon
        return _SHORTEST_PERIOD if self._look_again else min(longest, max(_SHORTEST_PERIOD, shortest / 10))

    def _run(self) -> None:
        while not self._stop.is_set():
            roll_sock = self._roll.sock if self._roll is not None else None  # open once an alarm is raised
            ready, _, _ = select.select([self._wake_r] + ([roll_sock] if roll_sock else []), [], [], self._period())
            if self._stop.is_set():
                return
            try:
                if self._wake_r in ready and signal.SIGUSR2 in os.read(self._wake_r, 512):  # a byte per signal
                    self.dump(flight_recorder.ON_REQUEST)
                if roll_sock is not None and roll_sock in ready:
                    self._roll.drain()  # type: ignore[union-attr]  # answer a late rank's roll call
                self._tick()
            except Exception as exc:  # the watchdog must outlive its own mistakes
                logger.warning("watchdog: %s: %s", type(exc).__name__, exc)

    def _tick(self) -> None:
        now, seen, look_again = time.monotonic(), {}, False
        default = _world.default_pg
        for flight in flight_recorder.in_flight(skip=threading.get_ident()):
            key = (flight.thread, flight.op, flight.group, flight.seq)
            first = seen[key] = self._seen.get(key, now)
            owner = flight.pg if flight.pg is not None else default
            if owner is None or not flight.timed or key in self._fired or owner._finish_within is not None:
                continue  # untimed waits, and groups whose blocking calls end within their timeout, police themselves
            refusal = self._refusal_against(flight, owner) if flight.pg is not None else None
            # only for a call seen at the previous tick too: a thread seen first may be about to refuse
            # the same call itself (its sequence number moved, its refusal not yet recorded); look again soon
            if refusal is not None and key not in self._seen:
                look_again = True
            elif refusal is not None:
                self._fired.add(key)
                self._end_for_refusal(flight, owner, refusal)
                continue
            limit = owner._timeout.total_seconds()
            if now - first > limit:
                self._fired.add(key)
                self._timed_out(flight.describe(), now - first, limit, lambda text, t=flight.thread: raise_in(t, text))
        self._seen, self._look_again = seen, look_again
        self._check_gpu_work()
        if not self._answered and os.path.exists(self.alarm_path):
            self._answer()

    def _refusal_against(self, flight: Any, owner: Any) -> str | None:
        """What another rank's notice (mpi/notices.py) says of the collective ``flight`` is inside: a
        refusal made before the call began, or the group's unusability; None if nothing."""
        watch = owner._watch
        if watch is None or watch.raising or flight.op in flight_recorder.P2P:
            return None
        return watch.refusal_against(flight.seq)

    def _end_for_refusal(self, flight: Any, owner: Any, refusal: str) -> None:
        """``flight``'s thread waits for a refused collective inside MPI's blocking call, which
        nothing interrupts: report it and apply the policy now, not at the timeout (no roll call:
        the cause is known)."""
        message = (f"{refusal}; rank {owner._rank} waits for it inside MPI's blocking {flight.op}, which cannot "
                   f"be interrupted (HPC_C10D_REFUSAL_NOTICES=raise makes it raise instead)")
        self._act(message, lambda text: raise_in(flight.thread, text), alarm=False)

    def _answer(self) -> None:
        """Another rank raised the alarm: take part in the roll call and dump (once)."""
        if self._answered:
            return
        self._answered = True
        self.roll_call()
        self.dump(_ANSWERING)

    def dump(self, reason: str) -> str | None:
        outcome = self._roll.outcome if self._roll is not None else None
        extra = {"roll_call": outcome} if outcome is not None else None
        return flight_recorder.dump(reason, self.directory, skip=self._thread.ident, run_id=self.run_id,
                                    extra=extra)

    def raise_alarm(self, reason: str) -> None:
        """Ask every other rank to answer and dump (the alarm file and the roll call), dump this
        rank, and wait for the dumps of the ranks that answered (each wait up to the grace)."""
        self._answered = True
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(self.alarm_path, "a") as alarm:
                alarm.write(reason + "\n")
        except OSError as exc:
            logger.warning("could not write the alarm file %s: %s", self.alarm_path, exc)
        roll = self.roll_call()
        self.dump(reason)
        pg = _world.default_pg
        size, rank = (pg._size, pg._rank) if pg is not None else (1, 0)
        expected = set(range(size)) if roll is None else {rank, *roll["answered"]}
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            if expected <= {d.get("rank") for d in flight_recorder.dumps_of(self.directory, self.run_id)}:
                break
            if self._roll is not None:
                self._roll.wait(0.05)  # a late rank's roll call is still answered
            else:
                time.sleep(0.05)

    def roll_call(self) -> dict[str, Any] | None:
        """Hold this rank's part of the roll call (``roll_call.RollCall.hold``), once per process."""
        with self._roll_lock:
            if self._roll is None or self.grace <= 0:
                return None
            return self._roll.hold(self.grace)

    def _check_gpu_work(self) -> None:
        """GPU operations run on their own streams, so no thread is seen waiting for a stuck one:
        ask each group's NCCL transport for an asynchronous error NCCL reports (a peer died, a link
        failed; torch's watchdog polls the same) and for its oldest operation still running."""
        for pg in list(_world.groups):
            for gpu in (pg._transports.get("cuda"), pg._gpu_watch):
                if gpu is not None:  # none made yet (the watchdog never makes one)
                    self._check_gpu(pg, gpu)

    def _check_gpu(self, pg: Any, gpu: Any) -> None:
        """One group's NCCL transport (nccl/backend.py, or wrappers around it), or the other NCCL
        it watches (``pg._gpu_watch``: torch's, behind backend "hpc")."""
        where = f"group {pg._name!r} ({pg._desc})"
        failure = gpu._async_failure()
        if failure is not None and ("gpu-error", id(gpu)) not in self._fired:
            self._fired.add(("gpu-error", id(gpu)))
            self._act(f"Watchdog caught an NCCL error in {where}: {failure}", lambda text: gpu.abort())
            return
        limit = pg._timeout.total_seconds()
        stuck = gpu._overdue(limit)
        if stuck is not None and ("gpu", id(stuck)) not in self._fired:
            self._fired.add(("gpu", id(stuck)))
            what = f"{stuck.op_name} on {stuck.where} in {where}"
            self._timed_out(what, stuck.age(), limit, lambda text: gpu.abort())  # its Work.wait raises

    def _timed_out(self, what: str, waited: float, limit: float, raise_error: Any) -> None:
        self._act(f"Watchdog caught collective operation timeout: {what} has not completed "
                  f"after {waited:.1f} s (timeout {limit:g} s)", raise_error)

    def _act(self, message: str, raise_error: Any, alarm: bool = True) -> None:
        """Report ``message`` and apply the policy: abort the job, ``raise_error(message)``, or only
        report; with ``alarm``, after the alarm (the roll call, every rank's dump, who is where)."""
        if self.policy == "abort":
            _prepare_fatal_report()
        logger.error("%s; policy %r", message, self.policy)
        if alarm:
            if self.policy == "abort":  # whatever blocks from here on (MPI's lock, a dead file system), the rank ends
                _kill_self_after(2 * self.grace + _FORWARD_S + _ABORT_WAIT_S)
            self.raise_alarm(message)
            from .trace_report import summarize  # late: only needed when something went wrong

            logger.error("what every rank was doing (dumps in %s):\n%s", self.directory,
                         summarize(flight_recorder.dumps_of(self.directory, self.run_id)))
        if self.policy == "abort":
            _abort_job(self._MPI)
        elif self.policy == "raise":
            raise_error(message)


def explain(reason: str) -> str | None:
    """Raise the alarm for ``reason`` (every rank that can dumps; the roll call names those that
    cannot) and return the report of who is where; None unless a watchdog started for torch's
    groups runs. For a caller that found an operation past its timeout itself (backend "hpc")."""
    watchdog = _watchdog
    if watchdog is None or not watchdog.explains:
        return None
    watchdog.raise_alarm(reason)
    from .trace_report import summarize  # late: only needed when something went wrong

    return summarize(flight_recorder.dumps_of(watchdog.directory, watchdog.run_id))


def raise_in(thread: int, message: str, kind: type[Exception] = DistBackendError) -> None:
    """Raise ``kind(message)`` in ``thread`` as soon as it runs Python again (a subclass named
    CollectiveTimeout for DistBackendError, else ``kind``'s name)."""
    name = "CollectiveTimeout" if kind is DistBackendError else kind.__name__
    error = type(name, (kind,), {"__init__": lambda e: kind.__init__(e, message), "__module__": kind.__module__})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(error))


_watchdog: Watchdog | None = None
_previous_hook: Any = None
_owns_wakeup = False  # SIGUSR2 and signal.set_wakeup_fd were free and are ours


def _excepthook(kind: type, value: BaseException, tb: Any) -> None:
    watchdog = _watchdog
    if watchdog is not None:  # the job ends below
        _prepare_fatal_report()
    rank = _world.default_pg._rank if _world.default_pg is not None else "-"
    text = "".join(traceback.format_exception(kind, value, tb))
    # the process's own stderr: torch's hook around ours swaps sys.stderr for a buffer it would
    # print only after we return, and we do not return from an abort
    stream = sys.__stderr__ or sys.stderr
    stream.write("".join(f"[rank {rank}]: {line}\n" for line in text.splitlines()))
    stream.flush()
    if watchdog is None:
        return
    _kill_self_after(2 * watchdog.grace + _FORWARD_S + _ABORT_WAIT_S)
    watchdog.raise_alarm(f"unhandled {kind.__name__} on rank {rank}: {value}")
    from .trace_report import summarize  # late: only needed when something went wrong

    report = summarize(flight_recorder.dumps_of(watchdog.directory, watchdog.run_id))
    stream.write("".join(f"[rank {rank}]: {line}\n" for line in
                         [f"what every rank was doing (dumps in {watchdog.directory}):", *report.splitlines()]))
    stream.write(f"[rank {rank}]: aborting the job (set {EXCEPTION_ENV}=0 to let other ranks go on)\n")
    _abort_job(watchdog._MPI)


def report_time() -> float:
    """Seconds the running watchdog may take, after an operation's timeout, to report it and end
    the job (0 without a watchdog): another library's watchdog on the same operations waits this
    much longer, so this report, naming the ranks behind, comes first."""
    if _watchdog is None:
        return 0.0
    return _LONGEST_PERIOD + 2 * _watchdog.grace + _FORWARD_S + _ABORT_WAIT_S


def _interactive() -> bool:
    return bool(sys.flags.interactive) or hasattr(sys, "ps1")


def start(MPI: Any, run_id: str, explains: bool = False) -> None:
    """Start the watchdog, the exception hook and the SIGUSR2 dump (``init_process_group``);
    ``explains``: ``explain`` answers (torch's default group on backend "hpc" started it)."""
    global _watchdog, _previous_hook, _owns_wakeup
    policy = policy_from_env()
    abort_on_exception = os.environ.get(EXCEPTION_ENV, "1").strip() not in ("0", "false", "no", "off")
    pg = default_group()
    roll = None
    if pg._size <= MAX_RANKS:  # every rank, whatever its policy: a collective
        secret = secrets.token_bytes(8) if pg._rank == 0 else b""
        cards = pg._comm.allgather((socket.gethostname(), secret))
        hosts = [host for host, _ in cards]
        flight_recorder.set_hosts(hosts)  # reports name the hosts of lost ranks
        if pg._size > 1:
            roll = RollCall(flight_recorder.trace_dir(), run_id, pg._rank, hosts, cards[0][1])
    if policy == "off":
        return
    _watchdog = Watchdog(MPI, policy, run_id, flight_recorder.trace_dir(), roll)
    _watchdog.explains = explains
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
    flight_recorder.set_hosts(None)
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None
