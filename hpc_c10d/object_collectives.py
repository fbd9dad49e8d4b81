"""Collectives on picklable Python objects, over MPI with mpi4py's pickle-5 messaging.

``mpi4py.util.pkl5`` sends pickle-5 out-of-band buffers without extra copies and splits
messages past MPI's 2 GiB count limit, so objects of any size work. Object collectives always
run on MPI, whatever transport serves the group's arrays.
"""

from __future__ import annotations

from typing import Any

from .process_group import ProcessGroup
from .state import resolve_group, to_group_rank, warn_not_in_group

__all__ = [
    "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
    "send_object_list", "recv_object_list",
]

#: tag of object point-to-point messages, apart from the tags users give array sends.
OBJECT_TAG = 32000


def _object_comm(pg: ProcessGroup) -> Any:
    """The group's communicator with pickle-5 object methods (imported here: MPI loads lazily)."""
    from mpi4py.util import pkl5

    return pkl5.Intracomm(pg.comm)


def _group_for_list(group: Any, object_list: Any, op_name: str) -> ProcessGroup | None:
    """Resolve ``group`` (None for a non-member, after torch's warning) and check ``object_list``."""
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group(op_name)
        return None
    if not isinstance(object_list, list):
        raise TypeError(f"`object_list` must be a list, got {type(object_list).__name__}")
    return pg


def _check_output_list(value: Any, name: str, min_length: int) -> None:
    if not isinstance(value, list):
        raise TypeError(f"`{name}` must be a list, got {type(value).__name__}")
    if len(value) < min_length:
        raise ValueError(f"Expected argument {name} to be a list of size at least {min_length}, got {len(value)}.")


def all_gather_object(object_list: list, obj: Any, group: ProcessGroup | None = None) -> None:
    """Fill ``object_list`` (one slot per rank) with every rank's ``obj``."""
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group("all_gather_object")
        return
    _check_output_list(object_list, "object_list", pg.size())
    object_list[:pg.size()] = _object_comm(pg).allgather(obj)


def gather_object(obj: Any, object_gather_list: list | None = None, dst: int | None = None,
                  group: ProcessGroup | None = None, group_dst: int | None = None) -> None:
    """Gather every rank's ``obj`` into ``object_gather_list`` on ``dst`` (default: rank 0)."""
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group("gather_object")
        return
    root = to_group_rank(pg, dst, group_dst, "dst", 0)
    if pg.rank() == root:
        if object_gather_list is None:
            raise ValueError("Argument ``gather_list`` must be specified on destination rank.")
        _check_output_list(object_gather_list, "object_gather_list", pg.size())
    elif object_gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination ranks.")
    gathered = _object_comm(pg).gather(obj, root)
    if gathered is not None and object_gather_list is not None:  # the root: checked above
        object_gather_list[:pg.size()] = gathered


def broadcast_object_list(object_list: list, src: int | None = None, group: ProcessGroup | None = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """Replace the contents of ``object_list`` on every rank with ``src``'s (default: rank 0)."""
    pg = _group_for_list(group, object_list, "broadcast_object_list")
    if pg is None:
        return
    root = to_group_rank(pg, src, group_src, "src", 0)
    received = _object_comm(pg).bcast(object_list if pg.rank() == root else None, root)
    if pg.rank() != root:
        if len(received) != len(object_list):
            raise ValueError(f"broadcast_object_list: src sent {len(received)} objects but this rank's "
                             f"object_list has {len(object_list)} slots; give every rank a list of that size")
        object_list[:] = received


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int | None = None, group: ProcessGroup | None = None,
                        group_src: int | None = None) -> None:
    """Send ``scatter_object_input_list[i]`` from ``src`` to rank i's output list (first slot)."""
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group("scatter_object_list")
        return
    root = to_group_rank(pg, src, group_src, "src", 0)
    _check_output_list(scatter_object_output_list, "scatter_object_output_list", 1)
    inputs = None
    if pg.rank() == root:
        if scatter_object_input_list is None:
            raise ValueError("source rank must provide non-None scatter_object_input_list")
        inputs = list(scatter_object_input_list)
        if len(inputs) != pg.size():
            raise ValueError(f"scatter_object_input_list must hold one object per rank ({pg.size()}), "
                             f"got {len(inputs)}")
    scatter_object_output_list[0] = _object_comm(pg).scatter(inputs, root)


def send_object_list(object_list: list, dst: int | None = None, group: ProcessGroup | None = None,
                     device: Any = None, group_dst: int | None = None, use_batch: bool = False) -> None:
    """Send the objects in ``object_list`` to ``dst``."""
    pg = _group_for_list(group, object_list, "send_object_list")
    if pg is None:
        return
    peer = to_group_rank(pg, dst, group_dst, "dst")
    pg._check_peer(peer, "send")
    _object_comm(pg).send(object_list, peer, OBJECT_TAG)


def recv_object_list(object_list: list, src: int | None = None, group: ProcessGroup | None = None,
                     device: Any = None, group_src: int | None = None, use_batch: bool = False) -> int:
    """Receive objects into ``object_list`` from ``src`` (any rank if None); return the sender's global rank."""
    pg = _group_for_list(group, object_list, "recv_object_list")
    if pg is None:
        return -1
    peer = None if src is None and group_src is None else to_group_rank(pg, src, group_src, "src")
    if peer is not None:
        pg._check_peer(peer, "recv")
    from mpi4py import MPI

    status = MPI.Status()
    received = _object_comm(pg).recv(None, MPI.ANY_SOURCE if peer is None else peer, OBJECT_TAG, status)
    if len(received) != len(object_list):
        raise ValueError(f"recv_object_list: the sender sent {len(received)} objects but object_list "
                         f"has {len(object_list)} slots")
    object_list[:] = received
    return pg.global_rank(status.Get_source())
