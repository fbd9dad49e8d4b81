"""``torch.distributed.shrink_group`` on backend "hpc".

torch's own ``shrink_group`` asks the group's C++ backend for a shrunk one, which backend "hpc"
cannot give, so ``install`` puts this function in its place: for an "hpc" group it runs torch's
checks, lets ``hpc_c10d.shrink`` build the survivors' communicator and registers the new group as
torch's would be; other groups go to torch's function. Design: docs/architecture.md, "Surviving
failures".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .devices import BACKEND_NAME, devices
from .version import has_shrink_helpers

__all__ = ["install"]


def install() -> None:
    """Put ``shrink_group`` in place of torch's (idempotent; nothing where torch lacks it)."""
    if has_shrink_helpers() and c10d.shrink_group is not shrink_group:
        global _torch_shrink_group
        _torch_shrink_group = c10d.shrink_group
        c10d.shrink_group = dist.shrink_group = shrink_group


_torch_shrink_group: Any = None


def _leave(pg: Any, died: bool) -> None:
    """Drop ``pg`` (a group of backend "hpc") here without communicating on it, then from torch's tables."""
    from .. import shrink
    from . import rendezvous
    from .process_group import hpc_backend

    ours = hpc_backend(pg)
    if ours._is_world:
        for store in rendezvous.take_stores():
            shrink.retire(store.mpi_store, died)
    ours._leave()
    c10d._cleanup_process_group_global_state(pg)


def _new_group(comm: Any, ranks: list[int], name: str, timeout: timedelta, store: Any) -> Any:
    """The shrunk group as torch's group creation would make it: the ProcessGroupHPC itself, or
    (torch >= 2.14) torch's ProcessGroup with it as the backend of each device it serves."""
    from .process_group import PER_DEVICE_BACKEND, ProcessGroupHPC

    backend = ProcessGroupHPC(comm, ranks, name, timeout, store)
    if not PER_DEVICE_BACKEND:
        return backend
    pg = dist.ProcessGroup(store, backend.rank(), backend.size())
    custom = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(custom)
    for device in devices():
        pg._register_backend(torch.device(device), custom, backend)
    pg._set_group_name(name)
    backend._held_by(pg)
    return pg


def shrink_group(ranks_to_exclude: list[int], group: Any = None, shrink_flags: int = 0,
                 pg_options: Any = None) -> Any:
    """torch's ``shrink_group``, for backend "hpc" too (see the module's docstring)."""
    from .. import shrink
    from . import comms, rendezvous
    from .process_group import hpc_backend

    target = group if group is not None else c10d._get_default_group()
    if c10d.get_backend(target) != BACKEND_NAME:  # a group of torch's own backends
        return _torch_shrink_group(ranks_to_exclude, group, shrink_flags, pg_options)
    ours = hpc_backend(target)
    c10d._validate_shrink_inputs(ranks_to_exclude, shrink_flags)
    info = c10d._prepare_shrink_target_group(target)
    c10d._validate_shrink_backend_requirements(info)
    excluded = c10d._validate_and_process_excluded_ranks(ranks_to_exclude, info)
    comm, died = shrink.survivors_communicator(ours._inner, excluded, shrink_flags)
    timeout: timedelta = ours._inner._timeout
    if info["is_default_group"]:
        for pg in [pg for pg in c10d._world.pg_map if pg is not target and c10d.get_backend(pg) == BACKEND_NAME]:
            _leave(pg, died)
        _leave(target, died)
        comms.set_world(comm)
        ranks = list(range(comm.Get_size()))
        store = rendezvous.world_store(comm, timeout)
        name, desc = c10d._process_group_name(ranks, use_hashed_name=True), "default:shrunken"
        new = _new_group(comm, [], name, timeout, store)
        c10d._update_default_pg(new)
    else:
        ranks = [g for i, g in enumerate(c10d.get_process_group_ranks(target)) if i not in excluded]
        store = c10d._world.pg_map[target][1]
        _leave(target, died)
        name, desc = c10d._process_group_name(ranks, use_hashed_name=True), f"{info['group_name']}:shrunk"
        new = _new_group(comm, ranks, name, timeout, store)
    new._set_group_desc(desc)
    new.bound_device_id = getattr(target, "bound_device_id", None)
    c10d._register_pg_in_world(pg=new, backend_name=BACKEND_NAME, store=store, group_name=name,
                               backend_config=str(hpc_backend(new)._inner._config),
                               rank_mapping={g: i for i, g in enumerate(ranks)})
    return new
