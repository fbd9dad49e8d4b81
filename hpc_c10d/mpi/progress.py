"""A light thread that lets MPI serve other ranks' one-sided requests while this rank computes.

MPIStore starts it only where some shard is reached over the network. It sleeps in ``poll()`` on
the process's epoll sets and drives MPI with an ``Iprobe`` when a request arrives (or every
``HPC_C10D_STORE_PROGRESS_INTERVAL``), lowers Python's switch interval while requests keep coming,
and backs off while the rank drives MPI itself (``activity``). Design and measurements:
docs/architecture.md, "Stores" (Progress).
"""

from __future__ import annotations

import atexit
import os
import select
import sys
import threading
import time
import warnings
from typing import Any, Callable

from ..settings import non_negative

__all__ = ["INTERVAL_ENV", "SWITCH_ENV", "DEFAULT_INTERVAL", "BUSY_INTERVAL", "SWITCH_INTERVAL", "QUIET",
           "interval_from_env", "event_descriptors", "ProgressThread", "progress"]

INTERVAL_ENV = "HPC_C10D_STORE_PROGRESS_INTERVAL"
SWITCH_ENV = "HPC_C10D_STORE_SWITCH_INTERVAL"
DEFAULT_INTERVAL = 0.002
BUSY_INTERVAL = 0.064  # longest sleep while the rank keeps calling MPI on its own
SWITCH_INTERVAL = 1e-4  # the GIL switch interval while store requests arrive
QUIET = 0.05  # seconds without a request before the switch interval goes back
_IN_CALLS = 0.005  # how long after a move of the operation count the rank is taken to be in its calls, at least
_STUCK = 1000  # wake-ups in a row that leave a descriptor ready: it is not MPI's to drain
_EVENT_SETS = ("anon_inode:[eventpoll]",)


def interval_from_env() -> float:
    """Return the configured interval in seconds; ValueError for a malformed or negative one."""
    interval = non_negative(INTERVAL_ENV, float, "a number of seconds", " (0 turns the thread off)")
    return DEFAULT_INTERVAL if interval is None else interval


def _switch_from_env() -> float:
    switch = non_negative(SWITCH_ENV, float, "a number of seconds", " (0 leaves Python's switch interval alone)")
    return SWITCH_INTERVAL if switch is None else switch


def event_descriptors() -> list[int]:
    """This process's epoll sets (Linux): where network MPI libraries wait for incoming data.

    Other libraries' sets may be among them; they only cause a harmless extra wake-up."""
    found: list[int] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux: the thread sleeps on a timer instead
        return found
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") in _EVENT_SETS:
                found.append(int(name))
        except OSError:  # closed since the listing
            continue
    return found


class _Switch:
    """Lowers Python's switch interval while store requests arrive, and puts it back after."""

    def __init__(self, fast: float) -> None:
        self._fast, self._saved, self._set = fast, 0.0, 0.0

    def lower(self) -> None:
        if self._fast and not self._saved and sys.getswitchinterval() > self._fast:
            self._saved = sys.getswitchinterval()
            sys.setswitchinterval(self._fast)
            self._set = sys.getswitchinterval()  # as Python rounded it

    def restore(self) -> None:
        if self._saved:
            if sys.getswitchinterval() == self._set:  # unless someone set their own meanwhile
                sys.setswitchinterval(self._saved)
            self._saved = 0.0


class ProgressThread:
    """One per process, shared by every MPIStore: started by the first user, stopped by the last."""

    def __init__(self) -> None:
        #: A count that grows while the rank calls MPI by itself: hpc_c10d sets it to the number
        #: of operations started on its groups (read once per wake-up, never on the hot path).
        self.activity: Callable[[], int] = lambda: 0
        #: How many times the thread has driven MPI's progress engine (a diagnostic).
        self.probes = 0
        self._users = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = (-1, -1)  # a pipe (read, write): _halt writes to end a poll() at once
        self._comm: Any = None
        self._exit_hook = False

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread is not None

    def join(self, MPI: Any, comm: Any, interval: float, needed: bool = True) -> None:
        """Register a user; start the thread if it is the first, the interval is not 0 and
        ``needed`` (some rank of ``comm`` reaches another's window over the network).

        The thread probes a duplicate of ``comm`` (collective over it: call this at the same
        point on every rank of ``comm``, with the same ``interval`` and ``needed``, as
        MPIStore's construction does). MPICH's probe on ``COMM_SELF`` does not reach the
        network progress engine.
        """
        with self._lock:
            self._users += 1
            if self._thread is not None and not self._thread.is_alive():  # ended by a dead rank
                self._halt_locked()
            if self._thread is not None or interval == 0 or not needed:
                return
            if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                warnings.warn("MPI did not grant MPI_THREAD_MULTIPLE: MPIStore operations aimed at this "
                              "rank wait until it next calls MPI (no progress thread)", stacklevel=3)
                return
            switch = _switch_from_env()
            self._comm = comm.Dup()
            self._stop.clear()
            self._wake = os.pipe()
            self._thread = threading.Thread(target=self._run, args=(interval, switch, self._wake[0], MPI),
                                            name="hpc_c10d-mpi-progress", daemon=True)
            self._thread.start()
            if not self._exit_hook:  # stop before mpi4py finalizes MPI at exit
                atexit.register(self._halt)
                self._exit_hook = True

    def leave(self) -> None:
        """Drop a user; stop the thread when none is left."""
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self._halt_locked()

    def _run(self, interval: float, switch: float, wake_read: int, MPI: Any) -> None:
        try:
            self._serve(interval, _Switch(switch), wake_read, MPI.ANY_SOURCE, MPI.ANY_TAG)
        except MPI.Exception:  # a rank of the communicator died (ULFM): nothing left to serve; join
            pass              # restarts the thread for the next store

    def _serve(self, interval: float, switch: _Switch, wake_read: int, any_source: int, any_tag: int) -> None:
        stop, iprobe = self._stop, self._comm.Iprobe

        def probe(source: int, tag: int) -> None:
            self.probes += 1
            iprobe(source, tag)

        poller, stuck = select.poll(), {}
        poller.register(wake_read, select.POLLIN)
        for fd in event_descriptors():
            poller.register(fd, select.POLLIN)
            stuck[fd] = 0
        sleep, seen, last_request, moved_at, gap = interval, self.activity(), 0.0, 0.0, 0.0
        try:
            while not stop.is_set():
                started, now = self.activity(), time.monotonic()
                if started != seen:  # the rank is in MPI often enough by itself
                    seen, gap, moved_at = started, now - moved_at, now
                    sleep = min(2 * sleep, BUSY_INTERVAL)
                    switch.restore()  # its own calls serve the requests: no need to take the GIL quickly
                    last_request = 0.0
                    stuck.update(dict.fromkeys(stuck, 0))  # its own traffic keeps descriptors ready
                    stop.wait(sleep)
                    continue
                # in a run of operations, as long as the count last took to move (seen at most
                # BUSY_INTERVAL apart, plus a late wake-up); after a quiet stretch (a lone barrier
                # between two phases of computing), _IN_CALLS
                window = min(BUSY_INTERVAL, max(_IN_CALLS, gap)) if gap <= 2 * BUSY_INTERVAL else _IN_CALLS
                in_calls = window - (now - moved_at)
                if in_calls > 0:  # probably still inside the operation it started, driving MPI itself
                    stop.wait(in_calls)
                    continue
                sleep = max(interval, sleep / 2)  # ease back: the rank may only be between calls
                if not stuck:  # no descriptor to wait on: a timer
                    stop.wait(sleep)
                    probe(any_source, any_tag)
                    continue
                if not poller.poll(1000 * sleep):  # a tick, as without descriptors: not every
                    probe(any_source, any_tag)      # library signals its set (UCX must be armed)
                    if last_request and time.monotonic() - last_request > QUIET:
                        switch.restore()
                        last_request = 0.0
                    continue
                if stop.is_set():
                    break
                switch.lower()
                last_request = time.monotonic()
                probe(any_source, any_tag)
                still_ready = {fd for fd, _ in poller.poll(0)} - {wake_read}
                self._drop_stuck(poller, stuck, still_ready)
                if still_ready:  # data the probe did not drain: most likely the rank's own long
                    stop.wait(interval)  # operation, which it drives itself; do not probe in a loop
        finally:
            switch.restore()

    @staticmethod
    def _drop_stuck(poller: Any, stuck: dict[int, int], still_ready: set[int]) -> None:
        """Stop waiting on a descriptor that stays ready however often MPI runs (another
        library's, or closed: poll() reports POLLNVAL for ever)."""
        for fd in list(stuck):
            stuck[fd] = stuck[fd] + 1 if fd in still_ready else 0
            if stuck[fd] >= _STUCK:
                poller.unregister(fd)
                del stuck[fd]

    def _halt(self) -> None:
        with self._lock:
            self._halt_locked()

    def _halt_locked(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        os.write(self._wake[1], b"x")  # the thread may have ended already: both ends stay open until joined
        self._thread.join()
        for fd in self._wake:
            os.close(fd)
        self._wake = (-1, -1)
        self._thread = None
        self._comm.Free()
        self._comm = None


#: The process's progress thread.
progress = ProgressThread()
