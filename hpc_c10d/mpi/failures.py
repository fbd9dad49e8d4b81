"""MPI errors inside an operation, as ``DistBackendError`` naming the rank, the operation and the cause.

Our communicators return MPI's errors (``MPI.ERRORS_RETURN``) and ``MPIBackend`` turns each into
the error made here; one that a disagreement between ranks can cause carries the ``DETAIL`` hint.
Under ULFM an error that means a rank died becomes ``ProcessFailedError``, the same on every
survivor. Design: docs/architecture.md, "Decisions" (MPI is the world), "Surviving failures".
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable

from mpi4py import MPI

from ..diagnostics import debug, flight_recorder
from ..errors import DistBackendError, ProcessFailedError
from ..state import _world
from . import ulfm

__all__ = ["mpi_failure", "failure_of", "short_receive", "Loss", "losses", "loss_of"]

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


@dataclass
class Loss:
    """What a group lost: its ranks that died, as the survivors agreed, and their communicator."""

    failed: list[int]
    survivors: Any  # the shrunk communicator: the survivors, in their old order
    size: int  # the group's size before

    @property
    def cut_off(self) -> bool:
        """Whether these survivors are the smaller side: fewer than half of the group, or exactly half
        without its rank 0. A cut link looks like a death from both sides, and only one may go on."""
        alive = self.size - len(self.failed)
        return 2 * alive < self.size or (2 * alive == self.size and 0 in self.failed)


#: The losses of the groups that saw a rank die (under ULFM), by group.
losses: weakref.WeakKeyDictionary[Any, Loss] = weakref.WeakKeyDictionary()


def loss_of(pg: Any) -> Loss:
    """``pg``'s loss: the first time, revoke its communicator (every member's calls on it end at
    once) and shrink it (collective over the survivors, who all get here: their agreement)."""
    loss = losses.get(pg)
    if loss is None:
        ulfm.revoke(pg._comm)
        alive, failed = ulfm.survivors(pg._comm)
        loss = losses[pg] = Loss(failed, alive, pg._size)
    return loss


def _process_failure(comm: Any, what: str) -> DistBackendError | None:
    """The error for a dead rank in the group of ``comm``, under ULFM (None elsewhere):
    ProcessFailedError, or DistBackendError on the smaller side of a cut (``Loss.cut_off``)."""
    pg = next((pg for pg in _world.groups if pg._comm is not None and pg._comm == comm), None)
    if pg is None or not ulfm.enabled(MPI):
        return None
    loss = loss_of(pg)
    hosts = [flight_recorder.host_of(pg._global_ranks[r]) for r in loss.failed]
    where = ", ".join(f"{r} ({host})" if host else str(r) for r, host in zip(loss.failed, hosts))
    if loss.cut_off:
        return getattr(pg, "_backend_error", DistBackendError)(
            f"{what}: this rank is among the {pg._size - len(loss.failed)} of group {pg._name!r}'s {pg._size} "
            f"ranks cut off from the others (rank(s) {where} are dead or out of reach): the side with more than "
            "half of the ranks, or half with rank 0, goes on; this one cannot")
    error = getattr(pg, "_process_failed_error", ProcessFailedError)
    return error(f"{what}: rank(s) {where} of group {pg._name!r} died; every survivor gets this error. "
                 "Go on without them: shrink_group(error.failed_ranks, group) on each survivor",
                 list(loss.failed), hosts, pg._name)


def mpi_failure(exc: MPI.Exception, comm: Any = None) -> DistBackendError:
    """The error to raise, ``from exc``, for an ``MPI.Exception`` out of the calling thread's
    operation on ``comm`` (where known: a dead process's error then names the failed ranks)."""
    error_class, text = exc.Get_error_class(), str(exc)  # MPICH: "<class>, error stack:", then the stack
    if error_class == MPI.ERR_IN_STATUS:  # its text only says to look at statuses we never see
        headline = "an error in one of its messages (MPI_ERR_IN_STATUS)"
    else:
        headline = text.splitlines()[0].removesuffix(", error stack:") if text else f"error class {error_class}"
    where, cause = _where_and_cause()
    if comm is not None and ulfm.is_process_failure(MPI, error_class):
        lost = _process_failure(comm, f"{where} failed in MPI: {headline}")
        if lost is not None:
            return lost
    if error_class not in _DISAGREEMENT_CLASSES:
        return DistBackendError(f"{where} failed in MPI: {headline}")
    return DistBackendError(f"{where} failed in MPI: {headline}; {cause}")


def failure_of(comm: Any) -> Callable[[BaseException], DistBackendError | None]:
    """What a Work on ``comm`` raises for an exception out of its requests: ``mpi_failure``'s error
    for MPI's (None for any other)."""
    def failure(exc: BaseException) -> DistBackendError | None:
        return mpi_failure(exc, comm) if isinstance(exc, MPI.Exception) else None

    return failure


def short_receive(received: int, expected: int) -> DistBackendError:
    """The error for a receive that got fewer elements than its tensor holds (MPI allows that, torch does not)."""
    where, _ = _where_and_cause()
    return DistBackendError(f"{where} received {received} elements, but the tensor holds {expected}; {_P2P_CAUSE}")
