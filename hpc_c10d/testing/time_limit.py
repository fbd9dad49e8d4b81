"""The per-test time limit: a thread that frees, or stands in for, a test stuck past its limit.

At a phase's deadline it records the "who is where" snapshot, then, until the main thread comes
back to pytest: raises ``TimeLimitExceeded`` there (enough for Python code), revokes the groups'
communicators under ULFM (ends a blocking MPI call), else calls ``on_stuck`` to take the main
thread's part in the verdict and end the run. Design: docs/architecture.md, "The testing kit".
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..diagnostics import flight_recorder
from ..diagnostics.watchdog import raise_in
from ..mpi import ulfm
from ..state import _world

__all__ = ["TimeLimitExceeded", "Expiry", "TimeLimit"]

_INTERRUPT_WAIT_S = 1.0  # for the main thread to come back once interrupted
_REVOKE_WAIT_S = 5.0  # for a blocking MPI call to return once its communicator is revoked
_HARNESS = (f"{os.sep}_pytest{os.sep}", f"{os.sep}pluggy{os.sep}")  # the frames left out of a stack


class TimeLimitExceeded(TimeoutError):
    """A test phase ran past its time limit."""


@dataclass
class Expiry:
    """What the main thread was doing when its phase's time limit passed."""

    message: str  # "time limit of 2 s exceeded in all_reduce seq 3 of group 0 float32[4]"
    snapshot: dict[str, Any]  # this rank's flight-recorder snapshot then
    stack: str  # the main thread's Python stack then


def _own_frames(frame: Any) -> traceback.StackSummary:
    """The stack that ends in ``frame``, from the first frame below pytest's and pluggy's own."""
    frames = traceback.extract_stack(frame)
    theirs = [i for i, f in enumerate(frames) if any(part in f.filename for part in _HARNESS)]
    return traceback.StackSummary.from_list(frames[theirs[-1] + 1 if theirs else 0:])


class TimeLimit:
    """The watching thread; ``start_phase``/``end_phase`` bracket each phase, from the main thread."""

    def __init__(self, MPI: Any, on_stuck: Callable[[Expiry], None]) -> None:
        self._MPI, self._on_stuck = MPI, on_stuck
        self._main: int = threading.main_thread().ident or 0
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._limit = 0.0
        self._running = False  # a phase is between start_phase and end_phase
        self._waking_at: float | None = None  # when the thread wakes next (None: when notified)
        self._phases = 0  # phases started so far
        self._expiry: Expiry | None = None
        self._stuck = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hpc_c10d-test-time-limit", daemon=True)
        self._thread.start()

    def start_phase(self, deadline: float, limit: float) -> None:
        with self._cond:
            self._deadline, self._limit, self._running, self._expiry = deadline, limit, True, None
            self._phases += 1
            if self._waking_at is None or deadline < self._waking_at:  # else it wakes early and sleeps on:
                self._cond.notify()  # no thread switch per phase (each costs the main thread the GIL)

    def end_phase(self) -> Expiry | None:
        """The phase is over (the main thread is back in pytest): its expiry, if its limit passed.
        Never returns once the thread has taken over a stuck rank (the run is ending)."""
        while True:
            try:
                with self._cond:
                    while self._stuck:
                        self._cond.wait()
                    self._running = False
                    self._deadline = None
                    if self._expiry is not None:  # the thread waits for this; an interruption still
                        self._cond.notify_all()  # pending must not hit pytest
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main), None)
                    return self._expiry
            except TimeLimitExceeded:  # it arrived here, after the phase: the phase has failed already
                continue

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._stop:
                self._waking_at = self._deadline if self._running else None
                if self._waking_at is None:
                    self._cond.wait()
                    continue
                left = self._waking_at - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = self._waking_at = None
                self._expire()

    def _expire(self) -> None:
        """Called with the condition held, the deadline passed and the phase still running."""
        frame = sys._current_frames().get(self._main)
        mine = [f for f in flight_recorder.in_flight() if f.thread == self._main]
        inside = mine[0].describe() if mine else "Python code (no hpc_c10d operation)"
        message = f"time limit of {self._limit:g} s exceeded in {inside}"
        snapshot = flight_recorder.snapshot(message, skip=threading.get_ident())
        stack = "".join(traceback.format_list(_own_frames(frame))) if frame is not None else ""
        self._expiry = Expiry(message, snapshot, stack)
        raise_in(self._main, message, TimeLimitExceeded)
        if self._wait_for_main(_INTERRUPT_WAIT_S):
            return
        if ulfm.enabled(self._MPI):
            for pg in list(_world.groups):
                pg._comm.Revoke()
            if self._wait_for_main(_REVOKE_WAIT_S):
                return
        self._stuck = True
        self._cond.release()
        try:
            self._on_stuck(self._expiry)  # ends the process
        finally:
            self._cond.acquire()

    def _wait_for_main(self, seconds: float) -> bool:
        """Whether the main thread ended the expired phase within ``seconds`` (it may have started
        the next one since)."""
        phase = self._phases
        return self._cond.wait_for(lambda: not self._running or self._phases != phase, seconds)
