"""The one piece of module state (``_world``), group sentinels, and group/rank resolution."""

from __future__ import annotations

import warnings
from typing import Any

from .process_group import ProcessGroup

__all__ = ["_world", "GroupMember", "group", "default_group", "resolve_group", "to_group_rank"]

_NOT_INITIALIZED = ("Default process group has not been initialized, "
                    "please make sure to call init_process_group.")


class _World:
    """Process-wide state.

    Fields: ``default_pg`` (the WORLD group or None), ``groups`` (live groups this rank
    belongs to, in creation order), ``group_count`` (groups created so far, members or not, as
    torch's ``get_pg_count``), ``node_local_rank``/``node_local_size`` (from MPI's shared-memory
    split), ``thread_level`` (granted by MPI), ``default_store`` (an MPIStore unless
    ``init_process_group`` was given a store), ``notices`` (the refusal notices' board, mpi/notices.py,
    or None). torch's ``pg_map``-style views are derived from ``groups``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.default_pg: ProcessGroup | None = None
        self.groups: list[ProcessGroup] = []
        self.group_count = 0
        self.node_local_rank: int | None = None
        self.node_local_size: int | None = None
        self.thread_level: str | None = None
        self.default_store: Any = None
        self.notices: Any = None

    def operations_started(self) -> int:
        """Collectives and point-to-point operations started on this rank's live groups."""
        return sum(pg._seq + pg._p2p_seq for pg in self.groups)

    @property
    def pg_map(self) -> dict[ProcessGroup, tuple[str, None]]:
        return {pg: (pg.name(), None) for pg in self.groups}

    @property
    def pg_names(self) -> dict[ProcessGroup, str]:
        return {pg: pg.group_name for pg in self.groups}

    @property
    def pg_group_ranks(self) -> dict[ProcessGroup, dict[int, int]]:
        return {pg: dict(pg._group_rank_of) for pg in self.groups}

    @property
    def pg_backend_config(self) -> dict[ProcessGroup, str]:
        return {pg: str(pg._config) for pg in self.groups}


_world = _World()


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 - torch's name
        return _world.default_pg


class GroupMember(metaclass=_WorldMeta):
    """``GroupMember.WORLD`` is the default group; non-members get ``NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = -100


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's name
    """``group.WORLD`` is the default group."""


def default_group() -> ProcessGroup:
    """Return the default group; ValueError before ``init_process_group``."""
    pg = _world.default_pg
    if pg is None:
        raise ValueError(_NOT_INITIALIZED)
    return pg


def resolve_group(grp: Any) -> ProcessGroup | None:
    """Return the ProcessGroup for ``grp`` (None: WORLD), or None if this rank is not a member."""
    if grp is None:
        return default_group()
    if isinstance(grp, ProcessGroup):
        if grp._comm is None:
            raise ValueError("Invalid process group specified or has been destroyed.")
        return grp
    if grp is GroupMember.NON_GROUP_MEMBER or grp == GroupMember.NON_GROUP_MEMBER:
        default_group()
        return None
    raise TypeError(f"Expecting a ProcessGroup, but got a {type(grp).__name__}.")


def warn_not_in_group(op_name: str, stacklevel: int = 3) -> None:
    """Warn, as torch does, that a non-member called a collective (which does nothing); the
    warning names the line ``stacklevel`` frames up (3: the caller's caller)."""
    warnings.warn(f"Running {op_name} on global rank {default_group().rank()} "
                  "which does not belong to the given group.", stacklevel=stacklevel)


def world_if_rank_in_it(group: Any, global_rank: Any, group_rank: Any) -> ProcessGroup | None:
    """The default group when a call names it implicitly (``group`` and ``group_rank`` None) and
    ``global_rank`` is an int in its range, where global and group ranks are the same number (the
    hot paths' test, so they skip ``to_group_rank``); None otherwise."""
    if group is None and group_rank is None and type(global_rank) is int:
        pg = _world.default_pg
        if pg is not None and 0 <= global_rank < pg._size:
            return pg
    return None


def group_and_rank(group: Any, global_rank: Any, group_rank: Any, op_name: str, name: str,
                   default: int | None = None, any_source: bool = False) -> tuple[ProcessGroup | None, Any]:
    """A call's group and the group rank of its root or peer (``src``/``dst``, or ``group_src``/
    ``group_dst``): the default group and ``global_rank`` as it is where ``world_if_rank_in_it``
    allows (the hot path), else ``to_group_rank``'s answer (``default`` when both are None, or None
    for ``any_source``). (None, None), with torch's warning, where this rank is not a member."""
    pg = world_if_rank_in_it(group, global_rank, group_rank)
    if pg is not None:
        return pg, global_rank
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group(op_name, stacklevel=4)  # the line that called the operation
        return None, None
    if any_source and global_rank is None and group_rank is None:
        return pg, None
    return pg, to_group_rank(pg, global_rank, group_rank, name, default)


def to_group_rank(pg: ProcessGroup, global_rank: int | None, group_rank: int | None,
                  name: str, default: int | None = None) -> int:
    """Turn ``src``/``group_src`` (or dst/peer) into a group rank, with torch's rules."""
    if group_rank is not None:
        if global_rank is not None:
            raise ValueError(f"Can't specify both {name} and group_{name}")
        return pg._check_root(group_rank, f"group_{name}")
    if global_rank is None:
        if default is None:
            raise ValueError(f"Must specify {name} or group_{name}")
        return default  # a group rank: rank 0 of the group, also for subgroups without global rank 0
    return pg.group_rank(global_rank, name)
