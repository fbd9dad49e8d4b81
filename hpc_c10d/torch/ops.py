"""torch's reduce ops and dtypes in hpc_c10d's terms, and raw MPI buffers over CPU tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ..arrays import bfloat16_dtype
from ..reduce_op import RedOpType, _make_nccl_premul_sum

__all__ = ["to_hpc_op", "premul_factor", "PLAIN_OPS", "cpu_buffer", "as_view", "as_views", "dtype_code"]

_TORCH_OPS = {getattr(dist.ReduceOp.RedOpType, op.name): op for op in RedOpType}

#: torch dtype -> numpy's; bfloat16 (ml_dtypes', which loads late: hpc_c10d/arrays.py) joins on first use
_NUMPY_DTYPES = {
    torch.bool: np.dtype(np.bool_), torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
    torch.int16: np.dtype(np.int16), torch.uint16: np.dtype(np.uint16), torch.int32: np.dtype(np.int32),
    torch.uint32: np.dtype(np.uint32), torch.int64: np.dtype(np.int64), torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64), torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}

_DTYPE_CODES = {dtype: code for code, dtype in enumerate((*_NUMPY_DTYPES, torch.bfloat16))}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    found = _NUMPY_DTYPES.get(dtype)
    if found is None and dtype is torch.bfloat16:
        found = _NUMPY_DTYPES[dtype] = bfloat16_dtype()
    return found


def dtype_code(dtype: torch.dtype) -> int:
    """A number for ``dtype`` that is the same in every process (-1 for one numpy has no match for)."""
    return _DTYPE_CODES.get(dtype, -1)


_fromaddress = MPI.buffer.fromaddress
#: hash of a torch ``ReduceOp`` -> hpc_c10d's op, for every op but PREMUL_SUM (which carries a
#: factor). torch's ReduceOp hashes to its op type's value (its binding's __hash__): hash() costs
#: less than reading ``op.op`` or comparing with ``==`` (each a call into the binding that makes an
#: object). A hot path looks its op up here and calls ``to_hpc_op`` only on a miss.
PLAIN_OPS = {kind.value: op for kind, op in _TORCH_OPS.items() if op is not RedOpType.PREMUL_SUM}


def to_hpc_op(op: Any) -> Any:
    """Return hpc_c10d's op for a torch ``ReduceOp`` (PREMUL_SUM keeps its factor)."""
    kind = PLAIN_OPS.get(hash(op))
    if kind is not None:
        return kind
    if hash(op) != RedOpType.PREMUL_SUM.value:
        raise ValueError(f"backend 'hpc' has no reduction for {op!r}")
    return _make_nccl_premul_sum(premul_factor(op))


def premul_factor(op: Any) -> Any:
    """The factor of a torch PREMUL_SUM ``ReduceOp`` (a number or a tensor); torch < 2.13 has no
    ``factor``, and its pickled state holds it."""
    return op.factor if hasattr(op, "factor") else op.__getstate__()[1]


def cpu_buffer(tensor: torch.Tensor) -> Any:
    """Return a writable MPI buffer over a contiguous CPU tensor's bytes (no copy, no numpy)."""
    return _fromaddress(tensor.data_ptr(), tensor.nbytes)


_views: dict[tuple, np.ndarray] = {}
_MAX_VIEWS = 4096  # views remembered (the cache is dropped when full)


def as_view(tensor: Any) -> Any:
    """Return a numpy array over a contiguous CPU tensor's memory, else the tensor unchanged.

    Not ``tensor.numpy()``: that marks the storage as not resizable, and FSDP frees its
    unsharded parameters by resizing their storage to zero. Tensors left unchanged (on another
    device, non-contiguous, with a lazy conj/neg bit, of a dtype outside the table) get
    hpc_c10d's own handling and errors. A view owns nothing, so the one made for an address,
    dtype and shape serves every tensor that has them (kept: making one costs ~1 us).
    """
    if not tensor.is_cpu:  # first, so a CUDA tensor leaves at once (a CPU one needs this check anyway)
        return tensor
    try:
        key = (tensor.data_ptr(), tensor.dtype, tensor.shape)
    except RuntimeError:  # no storage (a sparse tensor)
        return tensor
    view = _views.get(key)
    if view is not None and tensor.is_contiguous():
        return view
    np_dtype = _numpy_dtype(tensor.dtype)
    if np_dtype is None or not tensor.is_contiguous():
        return tensor
    if np_dtype.kind == "c" and (tensor.is_conj() or tensor.is_neg()):
        return tensor
    if tensor.numel() == 0:
        return np.empty(tensor.shape, np_dtype)
    view = np.frombuffer(cpu_buffer(tensor), np_dtype).reshape(tensor.shape)
    if np_dtype.kind != "c":  # a conj/neg tensor shares address, dtype and shape with its base
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        _views[key] = view
    return view


def as_views(tensors: Any) -> list:
    """``as_view`` of every tensor in a list (a non-list is returned for hpc_c10d to refuse)."""
    return [as_view(t) for t in tensors] if isinstance(tensors, (list, tuple)) else tensors
