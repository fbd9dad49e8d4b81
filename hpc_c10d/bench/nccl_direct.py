"""The direct NCCL call that ``--compare nccl`` times beside hpc_c10d: ``ncclAllReduce`` through
hpc_c10d's own binding, on the same communicator and the caller's current stream, with no
events, no Work and no checks. hpc_c10d's per-call overhead is the difference."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, cast

__all__ = ["direct_step"]


def direct_step(op_name: str, inp: Any, member: str) -> Callable[[], int]:
    """The direct call for ``op_name`` on the cupy array ``inp`` (all_reduce only)."""
    if op_name != "all_reduce":
        raise NotImplementedError("the direct NCCL comparison covers all_reduce only")
    import cupy

    from .._state import default_group
    from ..nccl.backend import NCCLBackend
    from ..nccl.buffers import as_device_buffer
    from ..nccl.dtypes import nccl_reduction
    from ..reduce_op import RedOpType

    buf = as_device_buffer(inp)
    # the world's cuda transport is the NCCL backend, or a debug wrapper that hands calls on to it
    transport = cast(NCCLBackend, default_group()._transport_for_device("cuda"))
    comm = transport._connect(buf.device)  # collective, once
    red = nccl_reduction(RedOpType[member.upper()], buf.dtype, "all_reduce")
    stream = cupy.cuda.get_current_stream(buf.device).ptr
    return partial(comm.nccl.ncclAllReduce, buf.ptr, buf.ptr, buf.size * red.width, red.datatype, red.op,
                   comm.handle, stream)
