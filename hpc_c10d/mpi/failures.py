"""MPI errors inside an operation, as ``DistBackendError`` naming the rank, the operation and the cause.

Our communicators return MPI's errors (``MPI.ERRORS_RETURN``, set in ``init_process_group``), so
mpi4py raises ``MPI.Exception`` and ``MPIBackend`` turns it into the error made here, where it
calls MPI. Inside a collective such an error almost always means the ranks called it with
different arguments, which MPI notices only where a receive is too small for what arrives or
where its algorithm compares sizes. Some never get here: MPICH ends the job itself when a
message is truncated in a collective's internal exchange (MPIC_Sendrecv makes the error fatal).
"""

from __future__ import annotations

from mpi4py import MPI

from .. import debug, flight_recorder
from .._state import _world
from ..errors import DistBackendError

__all__ = ["mpi_failure", "short_receive"]

_P2P = ("send", "recv")
_P2P_CAUSE = "the sending and receiving ranks may disagree on the shape or dtype"
_COLLECTIVE_CAUSE = "the ranks may disagree on the shape, dtype or operation"
_DETAIL_HINT = ": rerun with HPC_C10D_DEBUG=DETAIL to name the difference"
# The error classes a disagreement between ranks can cause: a receive too small for what arrives
# (MPICH: a collective that compares sizes reports MPI_ERR_OTHER). Others (an invalid tag, rank or
# communicator) are this rank's own and get no hint.
_DISAGREEMENT_CLASSES = frozenset({MPI.ERR_TRUNCATE, MPI.ERR_OTHER, MPI.ERR_IN_STATUS})


def _where_and_cause() -> tuple[str, str]:
    """'[rank N] <the calling thread's operation>' and what probably went wrong in it."""
    pg = _world.default_pg
    flight = flight_recorder.current()
    where = f"[rank {pg._rank if pg is not None else '-'}] {flight.describe() if flight else 'an MPI operation'}"
    if flight is not None and flight.op in _P2P:
        return where, _P2P_CAUSE
    detail = debug.get_debug_level() >= debug.DebugLevel.DETAIL
    return where, _COLLECTIVE_CAUSE if detail else _COLLECTIVE_CAUSE + _DETAIL_HINT


def mpi_failure(exc: MPI.Exception) -> DistBackendError:
    """The error to raise, ``from exc``, for an ``MPI.Exception`` out of the calling thread's operation."""
    error_class, text = exc.Get_error_class(), str(exc)  # MPICH: "<class>, error stack:", then the stack
    if error_class == MPI.ERR_IN_STATUS:  # its text only says to look at statuses we never see
        headline = "an error in one of its messages (MPI_ERR_IN_STATUS)"
    else:
        headline = text.splitlines()[0].removesuffix(", error stack:") if text else f"error class {error_class}"
    where, cause = _where_and_cause()
    if error_class not in _DISAGREEMENT_CLASSES:
        return DistBackendError(f"{where} failed in MPI: {headline}")
    return DistBackendError(f"{where} failed in MPI: {headline}; {cause}")


def short_receive(received: int, expected: int) -> DistBackendError:
    """The error for a receive that got fewer elements than its tensor holds (MPI allows that, torch does not)."""
    where, _ = _where_and_cause()
    return DistBackendError(f"{where} received {received} elements, but the tensor holds {expected}; {_P2P_CAUSE}")
