"""torch's reduce ops and dtypes in hpc_c10d's terms, and raw MPI buffers over CPU tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ..arrays import bfloat16
from ..mpi.ops import Reduction, reduction
from ..reduce_op import RedOpType, _make_nccl_premul_sum

__all__ = ["to_hpc_op", "lean_reduction", "cpu_buffer", "as_view", "as_views", "dtype_code"]

_TORCH_OPS = {getattr(dist.ReduceOp.RedOpType, op.name): op for op in RedOpType}

_NUMPY_DTYPES = {
    torch.bool: np.dtype(np.bool_), torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
    torch.int16: np.dtype(np.int16), torch.uint16: np.dtype(np.uint16), torch.int32: np.dtype(np.int32),
    torch.uint32: np.dtype(np.uint32), torch.int64: np.dtype(np.int64), torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16), torch.bfloat16: bfloat16, torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64), torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}

_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_NUMPY_DTYPES)}


def dtype_code(dtype: torch.dtype) -> int:
    """A number for ``dtype`` that is the same in every process (-1 for one numpy has no match for)."""
    return _DTYPE_CODES.get(dtype, -1)


_fromaddress = MPI.buffer.fromaddress


def to_hpc_op(op: Any) -> Any:
    """Return hpc_c10d's op for a torch ``ReduceOp`` (PREMUL_SUM keeps its factor)."""
    kind = _TORCH_OPS[op.op]
    if kind is RedOpType.PREMUL_SUM:  # torch < 2.13 has no ``factor``: its pickled state holds it
        return _make_nccl_premul_sum(op.factor if hasattr(op, "factor") else op.__getstate__()[1])
    return kind


_SUM = dist.ReduceOp.SUM
_KINDS = list(dist.ReduceOp.RedOpType.__members__.values())  # indexed by the op type's value
# torch dtype -> (op type value -> the MPI reduction, or None where the general path must serve:
# AVG and PREMUL_SUM need a second step, complex tensors a view, bad pairs its error message).
_lean: dict[torch.dtype, list[Reduction | None]] = {}


def _build_lean(op_type: Any, dtype: torch.dtype) -> Reduction | None:
    kind = _TORCH_OPS[op_type]
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if np_dtype is None or np_dtype.kind == "c" or kind in (RedOpType.AVG, RedOpType.PREMUL_SUM):
        return None
    try:
        return reduction(kind, np_dtype, "all_reduce")
    except (TypeError, ValueError):
        return None


def lean_reduction(op: Any, dtype: torch.dtype) -> Reduction | None:
    """Return the cached MPI datatype and op that reduce ``dtype`` with torch ``ReduceOp`` ``op``
    in one MPI call, or None. SUM, by far the most common, is recognised without ``op.op``."""
    row = _lean.get(dtype)
    if row is None:
        row = _lean[dtype] = [_build_lean(kind, dtype) for kind in _KINDS]
    return row[0 if op == _SUM else op.op.value]


def cpu_buffer(tensor: torch.Tensor) -> Any:
    """Return a writable MPI buffer over a contiguous CPU tensor's bytes (no copy, no numpy)."""
    return _fromaddress(tensor.data_ptr(), tensor.nbytes)


def as_view(tensor: Any) -> Any:
    """Return a numpy array over a contiguous CPU tensor's memory, else the tensor unchanged.

    Not ``tensor.numpy()``: that marks the storage as not resizable, and FSDP frees its
    unsharded parameters by resizing their storage to zero. Tensors left unchanged (on another
    device, non-contiguous, with a lazy conj/neg bit, of a dtype outside the table) get
    hpc_c10d's own handling and errors.
    """
    np_dtype = _NUMPY_DTYPES.get(tensor.dtype)
    if np_dtype is None or not tensor.is_cpu or not tensor.is_contiguous():
        return tensor
    if np_dtype.kind == "c" and (tensor.is_conj() or tensor.is_neg()):
        return tensor
    if tensor.numel() == 0:
        return np.empty(tensor.shape, np_dtype)
    return np.frombuffer(cpu_buffer(tensor), np_dtype).reshape(tensor.shape)


def as_views(tensors: Any) -> list:
    """``as_view`` of every tensor in a list (a non-list is returned for hpc_c10d to refuse)."""
    return [as_view(t) for t in tensors] if isinstance(tensors, (list, tuple)) else tensors
