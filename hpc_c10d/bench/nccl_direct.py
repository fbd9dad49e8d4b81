"""The direct NCCL call that ``--compare nccl`` times beside hpc_c10d: ``ncclAllReduce``,
``ncclBroadcast``, ``ncclReduce``, ``ncclAllGather``, ``ncclReduceScatter``, and for all_to_all
one ``ncclSend``/``ncclRecv`` per peer in a group, through hpc_c10d's own binding, on the same
communicator and the caller's current stream, with no events, no Work and no checks. hpc_c10d's
per-call overhead is the difference."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, cast

__all__ = ["direct_step"]

_MOVING = ("broadcast", "all_gather", "all_to_all")


def direct_step(op_name: str, inp: Any, out: Any, member: str) -> Callable[[], Any]:
    """The direct call for ``op_name`` from the cupy array ``inp`` into ``out`` (the same array when
    in place); NotImplementedError for the list forms, gather, scatter and barrier."""
    import cupy

    from ..nccl.backend import NCCLBackend
    from ..nccl.buffers import as_device_buffer
    from ..nccl.dtypes import BYTES, nccl_reduction
    from ..reduce_op import RedOpType
    from ..state import default_group

    if op_name not in ("all_reduce", "reduce", "reduce_scatter", *_MOVING):
        raise NotImplementedError(f"the direct NCCL comparison has no {op_name}")
    src, dst = as_device_buffer(inp), as_device_buffer(out)
    # the world's cuda transport is the NCCL backend, or a debug wrapper that hands calls on to it
    transport = cast(NCCLBackend, default_group()._transport_for_device("cuda"))
    comm = transport._connect(src.device)  # collective, once
    nccl, handle = comm.nccl, comm.handle
    stream = cupy.cuda.get_current_stream(src.device).ptr
    if op_name in _MOVING:
        if op_name == "broadcast":
            return partial(nccl.ncclBroadcast, src.ptr, src.ptr, src.nbytes, BYTES, 0, handle, stream)
        if op_name == "all_gather":
            return partial(nccl.ncclAllGather, src.ptr, dst.ptr, src.nbytes, BYTES, handle, stream)
        return partial(_all_to_all, nccl, src.ptr, dst.ptr, src.nbytes // comm.size, comm.size, handle, stream,
                       BYTES)
    red = nccl_reduction(RedOpType[member.upper()], src.dtype, op_name)
    if op_name == "all_reduce":
        return partial(nccl.ncclAllReduce, src.ptr, src.ptr, src.size * red.width, red.datatype, red.op, handle,
                       stream)
    if op_name == "reduce":
        return partial(nccl.ncclReduce, src.ptr, src.ptr, src.size * red.width, red.datatype, red.op, 0, handle,
                       stream)
    return partial(nccl.ncclReduceScatter, src.ptr, dst.ptr, dst.size * red.width, red.datatype, red.op, handle,
                   stream)


def _all_to_all(nccl: Any, send: int, recv: int, block: int, ranks: int, handle: int, stream: int,
                bytes_type: int) -> None:
    """One block of ``block`` bytes to and from every rank, in one NCCL group."""
    nccl.ncclGroupStart()
    for peer in range(ranks):
        nccl.ncclSend(send + peer * block, block, bytes_type, peer, handle, stream)
        nccl.ncclRecv(recv + peer * block, block, bytes_type, peer, handle, stream)
    nccl.ncclGroupEnd()
