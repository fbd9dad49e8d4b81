"""A light thread that lets MPI serve other ranks' one-sided requests while this rank computes.

Passive-target RMA (what MPIStore uses) needs the target process to enter the MPI library
whenever the data path is not plain shared memory: between nodes, or on one node with
``MPIR_CVAR_NOLOCAL=1``. A rank busy in pure Python would stall every store operation aimed
at it. This thread sleeps ``interval`` seconds, makes one cheap MPI call that drives the
progress engine (``Iprobe`` on a private communicator), and sleeps again. Unlike
``MPICH_ASYNC_PROGRESS`` it never spins; its wake-ups still cost large collectives a few
percent on a machine with no idle core, so it backs off while the rank drives MPI itself:
``progress.activity()`` counts what the rank started (hpc_c10d points it at its groups'
sequence numbers), and a wake-up that finds it moved doubles the sleep (up to ``BUSY_INTERVAL``)
instead of probing. Once the rank stops calling, every wake-up probes and halves the sleep back
to ``interval``: a store operation aimed at a rank that has just left its collectives waits at
most about 2 x ``BUSY_INTERVAL``.

The thread needs the GIL for each wake-up. A rank computing in pure Python hands it over
within CPython's switch interval (5 ms); numpy or torch kernels that release the GIL for
their whole run leave it free. The weak case is a loop that drops and retakes the GIL every
few hundred microseconds (tiny I/O or tiny-array calls back to back): CPython then rarely
lets a waiting thread in, and store operations aimed at that rank can wait for seconds,
until it next calls MPI. Jobs whose interconnect does RMA in hardware (InfiniBand, Slingshot,
or one node's shared memory) do not need this thread at all.

Configure with ``HPC_C10D_STORE_PROGRESS_INTERVAL`` (seconds, default 0.002; 0 turns it off).
"""

from __future__ import annotations

import atexit
import threading
import warnings
from typing import Any, Callable

from .._env import non_negative

__all__ = ["INTERVAL_ENV", "DEFAULT_INTERVAL", "BUSY_INTERVAL", "interval_from_env", "ProgressThread",
           "progress"]

INTERVAL_ENV = "HPC_C10D_STORE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 0.002
BUSY_INTERVAL = 0.064  # longest sleep while the rank keeps calling MPI on its own


def interval_from_env() -> float:
    """Return the configured interval in seconds; ValueError for a malformed or negative one."""
    interval = non_negative(INTERVAL_ENV, float, "a number of seconds", " (0 turns the thread off)")
    return DEFAULT_INTERVAL if interval is None else interval


class ProgressThread:
    """One per process, shared by every MPIStore: started by the first user, stopped by the last."""

    def __init__(self) -> None:
        #: A count that grows while the rank calls MPI by itself: hpc_c10d sets it to the number
        #: of operations started on its groups (read once per wake-up, never on the hot path).
        self.activity: Callable[[], int] = lambda: 0
        self._users = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._comm: Any = None
        self._exit_hook = False

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread is not None

    def join(self, MPI: Any, comm: Any, interval: float) -> None:
        """Register a user; start the thread if it is the first and the interval is not 0.

        The thread probes a duplicate of ``comm`` (collective over it: call this at the same
        point on every rank of ``comm``, as MPIStore's construction does). MPICH's probe on
        ``COMM_SELF`` does not reach the network progress engine.
        """
        with self._lock:
            self._users += 1
            if self._thread is not None or interval == 0:
                return
            if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                warnings.warn("MPI did not grant MPI_THREAD_MULTIPLE: MPIStore operations aimed at this "
                              "rank wait until it next calls MPI (no progress thread)", stacklevel=3)
                return
            self._comm = comm.Dup()
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, args=(interval, MPI.ANY_SOURCE, MPI.ANY_TAG),
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

    def _run(self, interval: float, any_source: int, any_tag: int) -> None:
        comm, stop = self._comm, self._stop
        sleep, seen = interval, self.activity()
        while not stop.wait(sleep):
            started = self.activity()
            if started != seen:  # the rank is in MPI often enough by itself
                seen, sleep = started, min(2 * sleep, BUSY_INTERVAL)
                continue
            sleep = max(interval, sleep / 2)  # ease back: the rank may only be between calls
            comm.Iprobe(any_source, any_tag)

    def _halt(self) -> None:
        with self._lock:
            self._halt_locked()

    def _halt_locked(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._comm.Free()
        self._comm = None


#: The process's progress thread.
progress = ProgressThread()
