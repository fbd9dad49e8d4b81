"""The ``torch.distributed.distributed_c10d`` namespace, assembled from the modules that own each part.

Code that imports names from ``torch.distributed.distributed_c10d`` can import them from here.
"""

from typing import NewType

from .backend import Backend, BackendConfig, is_backend_available
from .state import GroupMember, _world, group  # noqa: F401 - _world: torch code reads it
from .collectives import (  # noqa: F401 - the _base aliases stay importable, as in torch
    _all_gather_base, _reduce_scatter_base, all_gather, all_gather_coalesced,
    all_gather_into_tensor, all_gather_single, all_reduce, all_reduce_coalesced, all_to_all, all_to_all_single,
    barrier, broadcast, gather, gather_into_tensor, gather_single, reduce, reduce_scatter, reduce_scatter_single,
    reduce_scatter_tensor, scatter,
)
from .diagnostics.debug import DebugLevel, get_debug_level
from .groups import (
    get_global_rank, get_group_rank, get_process_group_ranks, new_group, new_subgroups,
    new_subgroups_by_enumeration, split_group,
)
from .lifecycle import (  # noqa: F401 - _get_default_group/_get_default_store: torch code calls them
    _get_default_group, _get_default_store, default_pg_timeout, destroy_process_group, get_backend,
    get_backend_config, get_default_backend_for_device, get_node_local_rank, get_pg_count,
    get_rank, get_world_size, init_process_group, is_gloo_available, is_initialized,
    is_mpi_available, is_nccl_available, is_torchelastic_launched, is_ucc_available,
    is_xccl_available, set_timeout, supports_complex,
)
from .diagnostics.monitored_barrier import monitored_barrier
from .object_collectives import (
    all_gather_object, broadcast_object_list, gather_object, recv_object_list,
    scatter_object_list, send_object_list,
)
from .options import (
    AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions,
    BarrierOptions, BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions,
    ScatterOptions,
)
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .process_group import ProcessGroup
from .reduce_op import ReduceOp, _make_nccl_premul_sum, reduce_op  # noqa: F401
from .shrink import SHRINK_ABORT, SHRINK_DEFAULT, shrink_group
from .store import PrefixStore, Store
from .work import Work

__all__ = [
    "Backend", "BackendConfig", "GroupMember", "P2POp", "all_gather", "all_gather_coalesced",
    "all_gather_object", "all_reduce", "all_reduce_coalesced", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "send_object_list", "recv_object_list",
    "broadcast_object_list", "destroy_process_group", "gather", "gather_object",
    "get_backend_config", "get_backend", "get_default_backend_for_device", "get_rank",
    "get_world_size", "get_pg_count", "group", "init_process_group", "irecv", "is_gloo_available",
    "is_initialized", "is_mpi_available", "is_backend_available", "is_nccl_available",
    "is_torchelastic_launched", "is_ucc_available", "is_xccl_available", "isend", "new_group",
    "new_subgroups", "new_subgroups_by_enumeration", "recv", "reduce", "reduce_scatter", "scatter",
    "scatter_object_list", "send", "supports_complex", "AllreduceCoalescedOptions",
    "AllreduceOptions", "AllgatherOptions", "AllToAllOptions", "BarrierOptions",
    "BroadcastOptions", "GatherOptions", "ProcessGroup", "ReduceOp", "ReduceOptions",
    "ReduceScatterOptions", "ScatterOptions", "DebugLevel", "get_debug_level", "Work",
    "default_pg_timeout", "get_group_rank", "get_global_rank", "get_process_group_ranks",
    "reduce_op", "all_gather_into_tensor", "reduce_scatter_tensor", "get_node_local_rank",
    "split_group", "monitored_barrier", "GroupName", "all_gather_single", "reduce_scatter_single",
    "Store", "PrefixStore", "shrink_group", "SHRINK_DEFAULT", "SHRINK_ABORT", "gather_single",
    "gather_into_tensor", "set_timeout",
]

#: A process group's name (torch's NewType over str).
GroupName = NewType("GroupName", str)
