"""ULFM, MPI's fault tolerance: which errors mean a process died, and what survivors can do then.

Open MPI 5 under ``mpiexec --with-ft ulfm`` reports a dead process as an error
(``MPI_ERR_PROC_FAILED``) instead of ending the job, and lets the survivors revoke a communicator
and shrink it; other MPI libraries (the ``mpich`` wheel) end the job, and mpi4py's ``Revoke``
raises NotImplementedError there. Design: docs/architecture.md, "Surviving failures".
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["enabled", "before_init", "is_process_failure", "revoke", "survivors"]

_ON = ("1", "true", "yes", "on")
_FINALIZE_FENCE = "OMPI_MCA_async_mpi_finalize"
_COLLECTIVES = "OMPI_MCA_coll"


def _open_mpi_ft_requested() -> bool:
    """Whether Open MPI was asked for ULFM (``mpiexec --with-ft ulfm`` sets this for every rank)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in _ON


def before_init() -> None:
    """Settings a job under ULFM needs before MPI starts (read from the environment then).

    Open MPI's MPI_Finalize begins with a fence over every process of the job; after a rank died
    it sometimes never completed (tests/faults/lost_rank.py async: 1 run in 10 hung there with
    every survivor done; 0 in 27 without the fence). Its ``async_mpi_finalize`` setting skips the
    fence. Its hierarchical collectives (``coll/han``, chosen for communicators that span nodes)
    are not fault tolerant: after a death on another node, all_reduce returned success with a wrong
    sum (open-mpi/ompi#13915), so they are left out. Each is set unless the user chose.
    """
    if _open_mpi_ft_requested():
        os.environ.setdefault(_FINALIZE_FENCE, "1")
        os.environ.setdefault(_COLLECTIVES, "^han")


def enabled(MPI: Any) -> bool:
    """Whether survivors outlive a dead process and can revoke and shrink (ULFM is switched on)."""
    if not hasattr(MPI.Comm, "Revoke") or MPI.ERR_PROC_FAILED == MPI.ERR_UNKNOWN:
        return False  # mpi4py built without ULFM's error classes (the mpich wheel)
    if MPI.Get_library_version().startswith("Open MPI"):
        return _open_mpi_ft_requested()
    return os.environ.get("MPIR_CVAR_ENABLE_FT", "").strip() == "1"  # an MPICH built with ULFM


def is_process_failure(MPI: Any, error_class: int) -> bool:
    """True for the error classes of a dead process, or of a communicator revoked after one."""
    return error_class != MPI.ERR_UNKNOWN and error_class in (
        MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def revoke(comm: Any) -> None:
    """Revoke ``comm`` so that every rank's calls on it end at once (local; safe to repeat)."""
    if not comm.Is_revoked():
        comm.Revoke()


def survivors(comm: Any) -> tuple[Any, list[int]]:
    """A communicator of ``comm``'s live processes (collective over them; they agree on who is
    dead), and the ranks of ``comm`` that are not in it."""
    alive = comm.Shrink()
    old, new = comm.Get_group(), alive.Get_group()
    try:
        kept = set(new.Translate_ranks(None, old))
    finally:
        old.Free()
        new.Free()
    return alive, [rank for rank in range(comm.Get_size()) if rank not in kept]
