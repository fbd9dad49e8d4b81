"""Module-level collectives with torch.distributed's signatures.

Each function resolves the group (None: WORLD; a non-member's call does nothing, as in torch),
turns global ``src``/``dst`` into group ranks, then makes one call into the ``ProcessGroup``,
which validates the arrays before any communication. Blocking calls return None;
``async_op=True`` returns a ``Work``.
"""

from __future__ import annotations

import warnings
from typing import Any

from .process_group import ProcessGroup
from .reduce_op import ReduceOp
from .state import _world, default_group, group_and_rank, resolve_group, to_group_rank, warn_not_in_group
from .work import Work, combine_works

__all__ = [
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather",
    "gather_single", "gather_into_tensor", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "all_gather_single", "reduce_scatter_single", "all_reduce_coalesced",
    "all_gather_coalesced", "_all_gather_base", "_reduce_scatter_base",
]


def _member(group: Any, op_name: str) -> ProcessGroup | None:
    if group is None:
        pg = _world.default_pg
        return pg if pg is not None else default_group()
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group(op_name, stacklevel=4)  # the line that called the operation
    return pg


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` over the group; every rank gets the result in place."""
    pg = _world.default_pg if group is None else _member(group, "all_reduce")
    if pg is None:
        if group is None:
            default_group()
        return None
    return pg._all_reduce(tensor, op, async_op)


def broadcast(tensor: Any, src: int | None = None, group: ProcessGroup | None = None,
              async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Copy ``src``'s tensor into every rank's tensor."""
    pg, root = group_and_rank(group, src, group_src, "broadcast", "src")
    return None if pg is None else pg._broadcast(tensor, root, async_op)


def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM,
           group: ProcessGroup | None = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` over the group into ``dst``'s tensor; other ranks' stay unchanged."""
    pg, root = group_and_rank(group, dst, group_dst, "reduce", "dst")
    return None if pg is None else pg._reduce(tensor, root, op, async_op)


def all_gather(tensor_list: list, tensor: Any, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """Gather every rank's tensor into ``tensor_list`` on every rank."""
    pg = _member(group, "all_gather")
    return None if pg is None else pg._all_gather(tensor_list, tensor, async_op)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None,
                           async_op: bool = False) -> Work | None:
    """Concatenate every rank's input along dim 0 (or flat) into ``output_tensor``."""
    pg = _member(group, "all_gather_into_tensor")
    return None if pg is None else pg._all_gather_into_tensor(output_tensor, input_tensor, async_op)


def gather(tensor: Any, gather_list: list | None = None, dst: int | None = None,
           group: ProcessGroup | None = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    """Gather every rank's tensor into ``gather_list`` on ``dst`` (default: rank 0)."""
    pg, root = group_and_rank(group, dst, group_dst, "gather", "dst", 0)
    return None if pg is None else pg._gather(tensor, gather_list, root, async_op)


def gather_single(tensor: Any, gather_tensor: Any = None, dst: int | None = None,
                  group: ProcessGroup | None = None, async_op: bool = False,
                  group_dst: int | None = None) -> Work | None:
    """Gather every rank's tensor into the one array ``gather_tensor`` on ``dst`` (default: rank
    0), in rank order: contiguous, with ``world_size * tensor.numel()`` elements (flat or stacked)."""
    pg = _member(group, "gather_single")
    if pg is None:
        return None
    return pg._gather_single(gather_tensor, tensor, to_group_rank(pg, dst, group_dst, "dst", 0), async_op)


def gather_into_tensor(*args: Any, **kwargs: Any) -> Work | None:
    """torch 2.14's deprecated name for ``gather_single`` (the same arguments)."""
    _deprecated("gather_into_tensor", "gather_single")
    return gather_single(*args, **kwargs)


def scatter(tensor: Any, scatter_list: list | None = None, src: int | None = None,
            group: ProcessGroup | None = None, async_op: bool = False,
            group_src: int | None = None) -> Work | None:
    """Send ``scatter_list[i]`` from ``src`` (default: rank 0) to rank i's tensor."""
    pg, root = group_and_rank(group, src, group_src, "scatter", "src", 0)
    return None if pg is None else pg._scatter(tensor, scatter_list, root, async_op)


def reduce_scatter(output: Any, input_list: list, op: Any = ReduceOp.SUM,
                   group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Reduce ``input_list[i]`` over the group into rank i's ``output``."""
    pg = _member(group, "reduce_scatter")
    return None if pg is None else pg._reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,
                          group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Reduce ``input`` (group-size blocks) and leave block i in rank i's ``output``."""
    pg = _member(group, "reduce_scatter_tensor")
    return None if pg is None else pg._reduce_scatter_tensor(output, input, op, async_op)


def all_to_all(output_tensor_list: list, input_tensor_list: list,
               group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Send ``input_tensor_list[i]`` to rank i; receive rank i's into ``output_tensor_list[i]``."""
    pg = _member(group, "all_to_all")
    return None if pg is None else pg._all_to_all(output_tensor_list, input_tensor_list, async_op)


def all_to_all_single(output: Any, input: Any, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: ProcessGroup | None = None,
                      async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0, send block i to rank i, concatenate what arrives in ``output``."""
    pg = _member(group, "all_to_all_single")
    if pg is None:
        return None
    return pg._all_to_all_single(output, input, output_split_sizes, input_split_sizes, async_op)


def barrier(group: ProcessGroup | None = None, async_op: bool = False,
            device_ids: list[int] | None = None) -> Work | None:
    """Wait until every rank of the group has called ``barrier``."""
    pg = _member(group, "barrier")
    return None if pg is None else pg._barrier(async_op)


def all_gather_single(output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None,
                      async_op: bool = False) -> Work | None:
    """torch 2.13's name for ``all_gather_into_tensor``."""
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def reduce_scatter_single(output: Any, input: Any, op: Any = ReduceOp.SUM,
                          group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """torch 2.13's name for ``reduce_scatter_tensor``."""
    return reduce_scatter_tensor(output, input, op, group, async_op)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"hpc_c10d.{old} is deprecated (as in torch.distributed); use hpc_c10d.{new} instead.",
                  FutureWarning, stacklevel=3)


def _wait_or_future(works: list[Work], outputs: list, async_op: bool) -> Any:
    work = combine_works(works, outputs)
    if async_op:
        return work.get_future()
    work.wait()
    return None


def all_reduce_coalesced(tensors: list, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
                         async_op: bool = False) -> Any:
    """Deprecated: ``all_reduce`` each tensor; with ``async_op`` returns a Future."""
    _deprecated("all_reduce_coalesced", "all_reduce")
    pg = _member(group, "all_reduce_coalesced")
    if pg is None:
        return None
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    works = [pg._all_reduce(t, op, True) for t in tensors]
    return _wait_or_future(works, list(tensors), async_op)


def all_gather_coalesced(output_tensor_lists: list, input_tensor_list: list,
                         group: ProcessGroup | None = None, async_op: bool = False) -> Any:
    """Deprecated: gather input j of rank r into ``output_tensor_lists[r][j]``; ``async_op`` gives a Future."""
    _deprecated("all_gather_coalesced", "all_gather")
    pg = _member(group, "all_gather_coalesced")
    if pg is None:
        return None
    if not isinstance(output_tensor_lists, list) or not isinstance(input_tensor_list, list):
        raise TypeError("Invalid function argument: output_tensor_lists and input_tensor_list should be lists")
    return _wait_or_future([pg.allgather_coalesced(output_tensor_lists, input_tensor_list)], output_tensor_lists,
                           async_op)


def _all_gather_base(output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None,
                     async_op: bool = False) -> Work | None:
    """Deprecated alias of ``all_gather_into_tensor``."""
    _deprecated("_all_gather_base", "all_gather_into_tensor")
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def _reduce_scatter_base(output: Any, input: Any, op: Any = ReduceOp.SUM,
                         group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Deprecated alias of ``reduce_scatter_tensor``."""
    _deprecated("_reduce_scatter_base", "reduce_scatter_tensor")
    return reduce_scatter_tensor(output, input, op, group, async_op)
