"""Creating groups (``new_group`` and friends) and translating ranks between group and world.

Groups are MPI communicators split from the world's (or a parent's). ``new_group`` is
collective over the world, as torch requires; with ``use_local_synchronization=True`` only the
members call it and MPI's ``Comm.Create_group`` builds the communicator among them alone.
A group made without ``timeout=`` takes its parent's (the default group's for ``new_group``),
which is ``HPC_C10D_TIMEOUT`` or torch's 30 minutes unless ``init_process_group`` was given one.
"""

from __future__ import annotations

import operator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from .backend import BackendConfig
from .lifecycle import instrument
from .process_group import ProcessGroup
from .state import GroupMember, _world, default_group, resolve_group
from .timeouts import check_timeout

if TYPE_CHECKING:
    from .nccl.backend import NCCLBackend

__all__ = [
    "new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
    "get_group_rank", "get_global_rank", "get_process_group_ranks",
]


def _register(comm: Any, global_ranks: Sequence[int], backend: str | None, timeout: timedelta,
              desc: str | None, name: str) -> ProcessGroup:
    parent = default_group()
    config = parent._config if backend is None else BackendConfig(backend)
    backend_name = parent.name() if backend is None else str(config) if ":" in backend else backend.lower()
    pg = ProcessGroup(comm, global_ranks, name, config, backend_name, timeout, desc or "undefined")
    instrument(pg)
    _world.groups.append(pg)
    return pg


def _checked_ranks(ranks: Any, world_size: int, what: str) -> list[int]:
    if not isinstance(ranks, (list, tuple, range)):
        raise TypeError(f"{what} must be a list of ints, got {type(ranks).__name__}")
    checked = []
    for r in ranks:
        try:
            r = operator.index(r)  # any integral index, as torch takes ranks
        except TypeError:
            raise TypeError(f"{what} must hold ints, got {r!r}") from None
        if not 0 <= r < world_size:
            raise ValueError(f"rank {r} in {what} is out of range for a world of {world_size} ranks")
        checked.append(r)
    if len(set(checked)) != len(checked):
        raise ValueError(f"{what} has duplicate ranks: {sorted(checked)}")
    return sorted(checked)


def _split_into(parent: ProcessGroup, rank_lists: list[list[int]], backend: str | None,
                timeout: timedelta, desc: str | None) -> list[Any]:
    """One ``Comm.Split`` of ``parent`` into disjoint groups (global ranks); returns per-list results."""
    me = parent._global_ranks[parent._rank]
    color = next((i for i, ranks in enumerate(rank_lists) if me in ranks), None)
    MPI = _mpi()
    comm = parent.comm.Split(MPI.UNDEFINED if color is None else color, parent._rank)
    results: list[Any] = []
    for i, ranks in enumerate(rank_lists):
        name = str(_world.group_count)
        _world.group_count += 1
        if i == color:
            results.append(_register(comm, ranks, backend, timeout, desc, name))
        else:
            results.append(GroupMember.NON_GROUP_MEMBER)
    _split_gpu_communicator(parent, color, results[color] if color is not None else None, backend)
    return results


def _split_gpu_communicator(parent: ProcessGroup, color: int | None, child: ProcessGroup | None,
                            backend: str | None) -> None:
    """Give the new groups their NCCL communicators now where every rank of the parent has a device
    bound: split from the parent's where every rank can split it, else each new group's members
    create theirs from a fresh unique ID. Every parent rank votes first (one allreduce; collective
    over the parent, as the MPI split was), so ranks that differ take the same road; where some
    have no device bound, the new groups make their communicators on first use."""
    config = parent._config if backend is None else BackendConfig(backend)
    if "cuda" not in config.device_backend_map or "cuda" not in parent._config.device_backend_map:
        return  # the same on every rank: torch requires the same backend everywhere
    bound = parent.bound_device_id is not None  # a bound group made its CUDA transport when it bound
    MPI = _mpi()
    votes = np.array([int(bound) | (int(bound and _gpu(parent)._splittable()) << 1)])
    parent.comm.Allreduce(MPI.IN_PLACE, votes, op=MPI.BAND)  # a buffer call: mpi4py lets other threads run
    agreed = int(votes[0])
    if not agreed & 1:
        return
    if agreed & 2:
        split = _gpu(parent)._split(color, child._rank if child is not None else 0,
                                    child._size if child is not None else 0)
        if child is not None and split is not None:
            child.bound_device_id = parent.bound_device_id
            _gpu(child)._adopt(split)
    elif child is not None:
        child._bind_device(parent.bound_device_id)


def _gpu(pg: ProcessGroup) -> NCCLBackend:
    """``pg``'s CUDA transport, made on first use: NCCL's, or debug wrappers forwarding to it."""
    return cast("NCCLBackend", pg._transport_for_device("cuda"))


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
) -> ProcessGroup | int:
    """Create a group of ``ranks`` (all when None or empty); non-members get NON_GROUP_MEMBER.

    Every rank of the world must call it with the same ranks, unless
    ``use_local_synchronization=True``, in which case only the members call it.
    """
    world = default_group()
    timeout = check_timeout(timeout, world._timeout)
    if backend is not None:
        BackendConfig(backend)
    members = list(range(world.size())) if not ranks else _checked_ranks(ranks, world.size(), "ranks")
    if not use_local_synchronization:
        return _split_into(world, [members], backend, timeout, group_desc)[0]
    if world.rank() not in members:
        return GroupMember.NON_GROUP_MEMBER
    mpi_group = world.comm.Get_group().Incl(members)
    comm = world.comm.Create_group(mpi_group, tag=hash(tuple(members)) % 32768)
    mpi_group.Free()
    name = "local:" + ",".join(map(str, members))
    pg = _register(comm, members, backend, timeout, group_desc, name)
    pg._bind_device(device_id)
    return pg


def new_subgroups(
    group_size: int | None = None,
    group: ProcessGroup | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[Any]]:
    """Split ``group`` (default: world) into consecutive subgroups of ``group_size`` ranks.

    ``group_size`` defaults to the number of ranks per node. Returns ``(mine, all_subgroups)``.
    """
    parent = resolve_group(group)
    if parent is None:
        raise ValueError("new_subgroups: this rank is not a member of the parent group")
    if group_size is None:
        group_size = _world.node_local_size or 1
    if not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    size = parent.size()
    if group_size > size:
        raise ValueError(f"The arg 'group_size' ({group_size}) must not exceed the group size ({size})")
    if size % group_size:
        raise ValueError(f"The world size ({size}) must be divisible by 'group_size' ({group_size})")
    ranks = parent._global_ranks
    rank_lists = [list(ranks[i:i + group_size]) for i in range(0, size, group_size)]
    subgroups = _split_into(parent, rank_lists, backend, check_timeout(timeout, parent._timeout), group_desc)
    mine = next((g for g in subgroups if isinstance(g, ProcessGroup)), None)
    return mine, subgroups


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: list[list[int]],
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[Any]]:
    """Create one subgroup per list of global ranks (lists must be disjoint); all ranks call it."""
    world = default_group()
    if not ranks_per_subgroup_list:
        raise ValueError("The arg 'ranks_per_subgroup_list' cannot be empty")
    rank_lists = [_checked_ranks(r, world.size(), "ranks_per_subgroup_list") for r in ranks_per_subgroup_list]
    _check_disjoint(rank_lists)
    subgroups = _split_into(world, rank_lists, backend, check_timeout(timeout, world._timeout), group_desc)
    mine = next((g for g in subgroups if isinstance(g, ProcessGroup)), None)
    return mine, subgroups


def _check_disjoint(rank_lists: list[list[int]]) -> None:
    seen: dict[int, int] = {}
    for i, ranks in enumerate(rank_lists):
        for r in ranks:
            if r in seen:
                raise ValueError(f"Rank {r} has appeared in both subgroup {rank_lists[seen[r]]} and {ranks}")
            seen[r] = i


def split_group(
    parent_pg: ProcessGroup | None = None,
    split_ranks: list[list[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> ProcessGroup | None:
    """Split ``parent_pg`` by lists of its group ranks (one MPI ``Comm.Split``).

    Every member of the parent calls it; returns this rank's new group, or None if it is in
    no list.
    """
    parent = resolve_group(parent_pg)
    if parent is None:
        raise ValueError("split_group: this rank is not a member of parent_pg")
    if not split_ranks:
        raise ValueError("split_ranks cannot be None or empty")
    rank_lists = [_checked_ranks(r, parent.size(), "split_ranks") for r in split_ranks]
    if any(not r for r in rank_lists):
        raise ValueError("the split group cannot be empty")
    _check_disjoint(rank_lists)
    global_lists = [[parent._global_ranks[r] for r in ranks] for ranks in rank_lists]
    subgroups = _split_into(parent, global_lists, None, check_timeout(timeout, parent._timeout), group_desc)
    return next((g for g in subgroups if isinstance(g, ProcessGroup)), None)


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """Translate a global rank into ``group``'s rank (ValueError if it is not a member)."""
    pg = group if isinstance(group, ProcessGroup) else resolve_group(group)
    if pg is None:
        raise ValueError("Group is not a valid process group (this rank is not a member)")
    return pg.group_rank(global_rank)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """Translate ``group``'s rank into a global rank."""
    pg = group if isinstance(group, ProcessGroup) else resolve_group(group)
    if pg is None:
        raise ValueError("Group is not a valid process group (this rank is not a member)")
    return pg.global_rank(group_rank)


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """Return the global ranks of ``group``'s members, in group-rank order."""
    pg = resolve_group(group)
    if pg is None:
        raise ValueError("Group is not a valid process group (this rank is not a member)")
    return list(pg._global_ranks)
