"""Start MPI (or join an application that already did) and describe the job's layout."""

from __future__ import annotations

import atexit
import sys
from typing import Any

from . import ulfm

__all__ = ["initialize", "thread_level_name", "node_local_comm", "library_version"]

_THREAD_NAMES = ("single", "funneled", "serialized", "multiple")


def _mpi() -> Any:
    """Import mpi4py.MPI, asking for MPI_THREAD_MULTIPLE when we are first to load it."""
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        if mpi4py.rc.thread_level not in ("multiple",):
            mpi4py.rc.thread_level = "multiple"
        ulfm.before_init()
    from mpi4py import MPI

    return MPI


def initialize() -> Any:
    """Make sure MPI is initialised (MPI_THREAD_MULTIPLE requested, less accepted); return ``MPI``."""
    MPI = _mpi()
    if MPI.Is_finalized():
        raise RuntimeError("MPI has already been finalized in this process; it cannot be started again")
    if not MPI.Is_initialized():  # the application set mpi4py.rc.initialize = False
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
    return MPI


def thread_level_name(MPI: Any) -> str:
    """Return the thread level MPI granted, e.g. ``"multiple"``."""
    return _THREAD_NAMES[MPI.Query_thread()]


def node_local_comm(comm: Any) -> Any:
    """Split ``comm`` into the ranks that share this node's memory."""
    MPI = _mpi()
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def library_version() -> str:
    """Return the first line of the MPI library's version string (Open MPI's ends in a NUL byte)."""
    MPI = _mpi()
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
