"""Stop cleanly when SLURM preempts the job or its time limit nears.

``Preemption.should_stop()`` turns a signal that reaches only some ranks, or reaches them at
different times (SIGTERM, ``sbatch --signal``'s SIGUSR1, or ``HPC_C10D_STOP_SIGNALS``), into one
answer per step: one small all-reduce (MAX) on a communicator of its own. The training loop that
uses it: docs/slurm.md, "Preemption and time limits"; design: docs/architecture.md, "The job".
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterable

import numpy as np

from ..diagnostics.logs import logger
from ..mpi import bootstrap
from ..state import resolve_group
from . import jobenv

__all__ = ["Preemption", "requeue_file", "SIGNALS_ENV", "REQUEUE_FILE_ENV"]

SIGNALS_ENV = "HPC_C10D_STOP_SIGNALS"
REQUEUE_FILE_ENV = "HPC_C10D_REQUEUE_FILE"
_DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
_TIME_LIMIT = 1000  # the flag for "past the time margin": above every signal number, so MAX keeps it


def _signal_of(name: Any) -> signal.Signals:
    if isinstance(name, int):
        return signal.Signals(name)
    text = str(name).strip().upper()
    try:
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except KeyError:
        raise ValueError(f"{name!r} is not a signal name (use e.g. TERM, USR1, SIGUSR2)") from None


def _signals_from(signals: Iterable[Any] | None) -> list[signal.Signals]:
    if signals is None:
        configured = os.environ.get(SIGNALS_ENV, "").strip()
        signals = configured.split(",") if configured else _DEFAULT_SIGNALS
    return [_signal_of(s) for s in signals if str(s).strip()]


def requeue_file(job: jobenv.JobEnv | None = None) -> str:
    """Where ``Preemption.requeue()`` leaves its request: ``HPC_C10D_REQUEUE_FILE`` or requeue-<job id>."""
    job = jobenv.detect() if job is None else job
    return os.environ.get(REQUEUE_FILE_ENV, "").strip() or f"requeue-{job.job_id}"


class Preemption:
    """Agree across a group, once per step, whether to stop (collective construction)."""

    def __init__(self, signals: Iterable[Any] | None = None, *, group: Any = None,
                 time_margin: float | None = None) -> None:
        """Catch ``signals`` (default SIGTERM, SIGUSR1); with ``time_margin`` (seconds), also stop
        once the SLURM job's end is that close. Must be made in the main thread, on every rank."""
        chosen = _signals_from(signals)
        if time_margin is not None and not time_margin >= 0:
            raise ValueError(f"time_margin must be a non-negative number of seconds, got {time_margin!r}")
        pg = resolve_group(group)
        if pg is None:
            raise ValueError("Preemption: this rank is not a member of the group; make it on members only")
        self._comm = pg.comm.Dup()
        self._max = bootstrap.initialize().MAX  # MPI is up: the group exists
        self._rank = pg.rank()
        self._flag = np.zeros(1, np.int32)  # 0: carry on; else the signal's number, or _TIME_LIMIT
        self._agreed = np.zeros(1, np.int32)
        self._deadline = None
        if time_margin is not None:
            end = jobenv.job_end_time()
            self._deadline = None if end is None else end - time_margin
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in chosen}
        self.stopped_by: str | None = None  # what the group agreed on, once should_stop() said True

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._flag[0] = signum

    def _check_deadline(self) -> None:
        if self._flag[0] == 0 and self._deadline is not None and time.time() >= self._deadline:
            self._flag[0] = _TIME_LIMIT

    @property
    def requested(self) -> bool:
        """Whether this rank has seen a stop signal or passed its deadline (no communication)."""
        self._check_deadline()
        return bool(self._flag[0])

    def should_stop(self) -> bool:
        """Collective: True on every rank if any rank saw a stop signal or passed its deadline."""
        if self._comm is None:
            raise ValueError("this Preemption has been closed")
        self._check_deadline()
        self._comm.Allreduce(self._flag, self._agreed, op=self._max)
        agreed = int(self._agreed[0])
        if agreed and self.stopped_by is None:
            self.stopped_by = "time limit" if agreed == _TIME_LIMIT else signal.Signals(agreed).name
            logger.info("stopping: %s (agreed by every rank)", self.stopped_by)
        return agreed != 0

    def requeue(self) -> bool:
        """Ask for this SLURM job to be requeued once its ranks have exited; True if asked.

        Rank 0 of the group writes the file ``HPC_C10D_REQUEUE_FILE`` (default
        ``requeue-<job id>`` in the working directory); the batch script runs ``scontrol requeue``
        when it finds it after ``srun`` returns (slurm/preemptible.sbatch). Requeueing from inside
        the step would kill the ranks mid-exit, and the requeued MPICH job then fails in MPI_Init
        (measured with the mpich wheel and SLURM 22.05). Other ranks and non-SLURM jobs: False.
        """
        job = jobenv.detect()
        if self._rank != 0 or not job.in_slurm_job:
            return False
        path = requeue_file(job)
        with open(path, "w") as marker:
            marker.write(f"{job.job_id} stopped by {self.stopped_by or 'request'}\n")
        logger.info("requeue requested: %s", path)
        return True

    def close(self) -> None:
        """Give the signals their previous handlers back and free the communicator (collective)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def __enter__(self) -> "Preemption":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
