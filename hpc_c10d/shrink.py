"""Going on without dead ranks: the error a lost process causes, and ``shrink_group``.

Under ULFM the first error that involves a dead rank revokes the group's communicator and the
survivors shrink it, so each raises ``ProcessFailedError`` naming the same ranks;
``shrink_group(err.failed_ranks, group)`` then gives the survivors' group. Without a failure (any
MPI) the ranks that stay build it among themselves (``Comm.Create_group``). Design:
docs/architecture.md, "Surviving failures".
"""

from __future__ import annotations

import threading
import zlib
from typing import Any, cast

from .diagnostics import watchdog
from .diagnostics.logs import logger
from .lifecycle import _start_watchdog, instrument
from .mpi import bootstrap, ulfm
from .process_group import ProcessGroup
from .state import _world, resolve_group
from .store import MPIStore

__all__ = ["SHRINK_DEFAULT", "SHRINK_ABORT", "shrink_group", "survivors_communicator", "retire", "drop"]

SHRINK_DEFAULT = 0  #: build the new group; operations in flight on the old one are left to finish
SHRINK_ABORT = 1  #: first stop what is in flight on the old group (ULFM: revoke it)

_left_behind: list[MPIStore] = []  # default stores of worlds shrunk without a death, open until exit
_NEEDS_ULFM = ("needs an MPI that outlives a dead process (ULFM): Open MPI 5 started with "
               "`mpiexec --with-ft ulfm`")


# ------------------------------------------------------------------------------ shrink_group
def _checked_flags(ranks_to_exclude: Any, shrink_flags: Any) -> None:
    if not isinstance(ranks_to_exclude, list):
        raise TypeError(f"ranks_to_exclude must be a list, but got {type(ranks_to_exclude).__name__}. "
                        "Example: [1, 3, 5] to exclude ranks 1, 3, and 5.")
    if not ranks_to_exclude:
        raise ValueError("ranks_to_exclude cannot be empty. To shrink a group, you must specify at least "
                         "one rank to exclude. Example: [failed_rank_id]")
    if not isinstance(shrink_flags, int) or shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise ValueError(f"Invalid shrink_flags value: {shrink_flags}. Must be one of: SHRINK_DEFAULT "
                         f"({SHRINK_DEFAULT}) or SHRINK_ABORT ({SHRINK_ABORT}). Use SHRINK_ABORT to abort "
                         "ongoing operations before shrinking.")


def _checked_ranks(ranks_to_exclude: list, pg: ProcessGroup) -> set[int]:
    """torch's checks of the excluded ranks, in its order and words."""
    excluded: set[int] = set()
    for i, rank in enumerate(ranks_to_exclude):
        if not isinstance(rank, int):
            raise TypeError(f"All elements in ranks_to_exclude must be integers. "
                            f"Element at index {i} is {type(rank).__name__}: {rank}")
        if not 0 <= rank < pg._size:
            raise ValueError(f"Rank {rank} at index {i} is out of bounds for group size {pg._size}. "
                             f"Valid ranks are in range [0, {pg._size - 1}].")
        if rank in excluded:
            raise ValueError(f"Duplicate rank {rank} found in ranks_to_exclude at index {i}. "
                             "Each rank can only be excluded once.")
        excluded.add(rank)
    if len(excluded) >= pg._size:
        raise ValueError(f"Cannot exclude all {pg._size} ranks from process group. At least one rank must "
                         f"remain. Excluding {len(excluded)} ranks.")
    if pg._rank in excluded:
        raise RuntimeError(f"Current rank {pg._rank} is in the exclusion list and should not call shrink_group(). "
                           "Only non-excluded ranks should participate in the shrinking operation. "
                           "Excluded ranks should terminate their processes instead.")
    return excluded


def _create_group(comm: Any, ranks: list[int]) -> Any:
    """A communicator of ``comm``'s ``ranks`` (collective over them only)."""
    whole = comm.Get_group()
    part = whole.Incl(ranks)
    try:
        return comm.Create_group(part)
    finally:
        part.Free()
        whole.Free()


def _agreed(comm: Any, excluded: set[int], failed: list[int], pg: ProcessGroup) -> None:
    """Every rank of the new group passed the same ranks (the dead ones aside) and excluded every
    dead rank; ValueError on all of them otherwise (collective over the new group)."""
    alive = sorted(excluded - set(failed))
    key = zlib.crc32(repr(alive).encode()), not set(failed) <= excluded
    keys = comm.allgather(key)
    if len({k for k, _ in keys}) > 1:
        raise ValueError(f"shrink_group: the ranks of group {pg._name!r} passed different ranks_to_exclude")
    if any(missing for _, missing in keys):
        raise ValueError(f"shrink_group: rank(s) {failed} of group {pg._name!r} died and must be in "
                         "ranks_to_exclude (ProcessFailedError.failed_ranks names them)")


def survivors_communicator(pg: ProcessGroup, excluded: set[int], shrink_flags: int) -> tuple[Any, bool]:
    """The communicator of the ranks that stay (collective over them), and whether ranks died."""
    MPI = bootstrap.initialize()
    from .mpi import failures  # loads MPI: not at import

    tolerant = ulfm.enabled(MPI)
    if shrink_flags == SHRINK_ABORT:
        if not tolerant:
            raise RuntimeError(f"shrink_group(shrink_flags=SHRINK_ABORT): stopping MPI operations in flight "
                               f"{_NEEDS_ULFM}; without it, SHRINK_DEFAULT builds the new group")
        ulfm.revoke(pg._comm)
    remaining = [r for r in range(pg._size) if r not in excluded]
    loss = failures.losses.get(pg)
    if loss is None:
        try:
            comm = _create_group(pg._comm, remaining)
        except MPI.Exception as exc:
            if not (tolerant and ulfm.is_process_failure(MPI, exc.Get_error_class())):
                raise failures.mpi_failure(exc, pg._comm) from exc
            loss = failures.loss_of(pg)  # a rank that stays died, or a survivor revoked the group: shrink
        else:
            _agreed(comm, excluded, [], pg)
            return comm, False
    if loss.cut_off:
        raise RuntimeError(f"shrink_group: this rank is on the smaller side of group {pg._name!r}, cut off from "
                           f"rank(s) {loss.failed}: the side with more than half of the ranks (or half with "
                           "rank 0) goes on, this one cannot")
    # The survivors' communicator keeps the old order: drop the live ranks excluded too.
    failed = set(loss.failed)
    survivors = [r for r in range(pg._size) if r not in failed]
    keep = [i for i, r in enumerate(survivors) if r not in excluded]
    comm = loss.survivors if len(keep) == len(survivors) else _create_group(loss.survivors, keep)
    _agreed(comm, excluded, loss.failed, pg)
    return comm, True


def retire(store: MPIStore, died: bool) -> None:
    """Put aside the store of a world being shrunk (its keys are not carried over): abandoned where
    ranks died (its windows span them: nothing collective can free them), else kept open until
    exit, when every rank of that world, those left out included, frees it together (MPIStore's
    exit hook)."""
    if died:
        store.abandon()
    else:
        _left_behind.append(store)


def drop(pg: ProcessGroup) -> None:
    """Forget a group without communicating on it (it may hold a dead rank)."""
    if pg in _world.groups:
        _world.groups.remove(pg)
    gpu = pg._transports.get("cuda")
    if gpu is not None:
        _abort_within(cast(Any, gpu), pg._timeout.total_seconds())
    pg._destroy()


def _abort_within(gpu: Any, seconds: float) -> None:
    """Abort ``gpu``'s NCCL communicators on a thread of their own, waiting at most ``seconds``:
    from NCCL 2.16 an abort may wait for the node's other ranks, and a dead one never comes. Past
    that the survivors go on and the communicators' resources stay held until the process ends."""
    failure: list[BaseException] = []

    def abort() -> None:
        try:
            gpu.abort()
        except BaseException as exc:  # reported below, on the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=abort, name="hpc_c10d-nccl-abort", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() or failure:
        why = f"{failure[0]}" if failure else f"it had not returned after {seconds:g} s"
        logger.warning("shrink_group: aborting the old group's NCCL communicators failed (%s); going on without "
                       "them", why)


def shrink_group(ranks_to_exclude: list[int], group: ProcessGroup | None = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Any = None) -> ProcessGroup:
    """Return a new group of ``group``'s ranks but ``ranks_to_exclude`` (group ranks), as torch's.

    Only the ranks that stay call it. Shrinking the default group makes the result the default
    group (ranks renumbered 0..n-1, a new default store) and destroys every other group; otherwise
    the old group is destroyed. After a rank died (ULFM) the dead ranks must be among those
    excluded (``ProcessFailedError.failed_ranks``); live ranks may be excluded with any MPI.
    ``shrink_flags=SHRINK_ABORT`` first revokes the old group (ULFM only).
    """
    _checked_flags(ranks_to_exclude, shrink_flags)
    pg = resolve_group(group)
    if pg is None:
        raise ValueError("Invalid process group specified")
    if pg._size <= 1:
        raise ValueError(f"Cannot shrink a process group with size {pg._size}. "
                         "Group must have at least 2 ranks to support shrinking.")
    excluded = _checked_ranks(ranks_to_exclude, pg)
    comm, died = survivors_communicator(pg, excluded, shrink_flags)
    comm.Set_errhandler(bootstrap.initialize().ERRORS_RETURN)
    if pg is _world.default_pg:
        return _new_default(pg, comm, died)
    ranks = [g for r, g in enumerate(pg._global_ranks) if r not in excluded]
    drop(pg)
    name = str(_world.group_count)
    _world.group_count += 1
    return _replacement(pg, comm, ranks, name, f"{pg._desc}:shrunk")


def _replacement(old: ProcessGroup, comm: Any, ranks: list[int], name: str, desc: str) -> ProcessGroup:
    new = ProcessGroup(comm, ranks, name, old._config, old._backend_name, old._timeout, desc)
    instrument(new)
    _world.groups.append(new)
    if old.bound_device_id is not None:
        new._bind_device(old.bound_device_id)  # a fresh NCCL communicator from an MPI-broadcast ID
    return new


def _new_default(old: ProcessGroup, comm: Any, died: bool) -> ProcessGroup:
    """The survivors' world: every other group destroyed, a fresh store and watchdog over it."""
    watchdog.stop()
    for pg in list(reversed(_world.groups)):
        drop(pg)
    store = _world.default_store
    if isinstance(store, MPIStore):
        retire(store, died)
        _world.default_store = MPIStore(comm, timeout=old._timeout)
    _world.default_pg = None
    new = _replacement(old, comm, list(range(comm.Get_size())), old._name, "default:shrunken")
    _world.default_pg = new
    _start_watchdog(bootstrap.initialize(), comm)
    return new
