"""numpy dtype and ReduceOp -> NCCL datatype and reduction, with torch's NCCL rules.

Operations that only move data send any dtype as bytes. Reductions need an NCCL type:
bool reduces as uint8 (SUM becomes MAX, "any", as torch does), complex as twice as many reals
(SUM, AVG and a real PREMUL_SUM only), float8 e4m3fn and e5m2 as NCCL's own fp8 types (NCCL
2.24 and newer, sm_90 GPUs; the fnuz variants only move). int16/uint16 have no NCCL type, so they
raise TypeError as torch's NCCL backend does. Bitwise reductions raise ValueError: NCCL has none.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..arrays import bfloat16_dtype, raise_unsupported
from ..reduce_op import BITWISE, RedOpType, check_op_for_dtype
from .buffers import FLOAT8_NAMES, device_supported, float8_dtypes
from .library import DataType, RedOp

__all__ = ["BYTES", "NcclReduction", "nccl_reduction"]

#: the datatype that moves any dtype as bytes.
BYTES = DataType.UINT8

# dtype -> (NCCL datatype, numpy dtype of one NCCL element, NCCL elements per array element)
_REDUCIBLE: dict[np.dtype, tuple[int, np.dtype, int]] = {
    np.dtype(name): (code, np.dtype(name), 1)
    for name, code in (("int8", DataType.INT8), ("uint8", DataType.UINT8), ("int32", DataType.INT32),
                       ("uint32", DataType.UINT32), ("int64", DataType.INT64), ("uint64", DataType.UINT64),
                       ("float16", DataType.FLOAT16), ("float32", DataType.FLOAT32),
                       ("float64", DataType.FLOAT64))
}
_REDUCIBLE[np.dtype(bool)] = (DataType.UINT8, np.dtype(np.uint8), 1)
_REDUCIBLE[np.dtype(np.complex64)] = (DataType.FLOAT32, np.dtype(np.float32), 2)
_REDUCIBLE[np.dtype(np.complex128)] = (DataType.FLOAT64, np.dtype(np.float64), 2)
# ml_dtypes' types load here: this module loads with NCCL only
_REDUCIBLE.update({dtype: (code, dtype, 1) for dtype, code in (
    (bfloat16_dtype(), DataType.BFLOAT16), (float8_dtypes()["float8_e4m3fn"], DataType.FLOAT8E4M3),
    (float8_dtypes()["float8_e5m2"], DataType.FLOAT8E5M2))})

_OPS = {RedOpType.SUM: RedOp.SUM, RedOpType.AVG: RedOp.AVG, RedOpType.PRODUCT: RedOp.PROD,
        RedOpType.MIN: RedOp.MIN, RedOpType.MAX: RedOp.MAX}


class NcclReduction(NamedTuple):
    """How to reduce one array with NCCL."""

    datatype: int
    op: int | None  # None: a PREMUL_SUM built per call from ``factor``
    width: int  # NCCL elements per array element
    factor: bytes | None  # the PREMUL_SUM factor in the NCCL datatype


def _factor_bytes(factor: Any, element: np.dtype, name: str) -> bytes:
    if hasattr(factor, "item"):
        factor = factor.item()
    if isinstance(factor, complex):
        if factor.imag:
            raise ValueError(f"{name}: NCCL reduces complex tensors as pairs of reals, so a PREMUL_SUM "
                             f"factor must be real, got {factor}")
        factor = factor.real
    return np.asarray(factor, dtype=element).tobytes()


def nccl_reduction(op: Any, dtype: np.dtype, name: str, native_fp8: bool = True) -> NcclReduction:
    """The NCCL datatype and op for ``op`` (a RedOpType or ReduceOp) on ``dtype``; torch's errors.
    ``native_fp8``: the NCCL library has float8 datatypes (2.24 and newer)."""
    kind, factor = (op, None) if type(op) is RedOpType else (op.op, op.factor)
    if not device_supported(dtype):
        raise_unsupported(dtype, f"{name}: the array")
    if kind in BITWISE:
        raise ValueError(f"Cannot use ReduceOp.{kind.name} with NCCL")
    check_op_for_dtype(kind, dtype, name)
    entry = _REDUCIBLE.get(dtype)
    if dtype.name in FLOAT8_NAMES and (entry is None or not native_fp8):
        raise TypeError(f"Unsupported Float8 type for NCCL reduction: {dtype}")
    if entry is None:
        raise TypeError(f"Input tensor data type is not supported for NCCL process group: {dtype}")
    datatype, element, width = entry
    if kind is RedOpType.PREMUL_SUM:
        return NcclReduction(datatype, None, width, _factor_bytes(factor, element, name))
    nccl_op = RedOp.MAX if kind is RedOpType.SUM and dtype.kind == "b" else _OPS[kind]
    return NcclReduction(datatype, nccl_op, width, None)
