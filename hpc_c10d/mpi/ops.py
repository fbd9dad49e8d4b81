"""numpy dtype -> MPI datatype, and (ReduceOp, dtype) -> MPI.Op, with torch's rules.

dtypes that MPI lacks (bfloat16 everywhere, float16 where the MPI library has no float16
type) travel as same-size unsigned integers, and their reductions are user-defined MPI ops
that reinterpret the bytes and reduce with numpy (ml_dtypes for bfloat16), in place.
Measured with the MPICH wheel: a bfloat16 user op was as fast as upcasting to float32 for
small arrays and 25% faster at 2 MiB, with no extra copies, so user ops it is.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from ..arrays import raise_unsupported, supported
from ..reduce_op import RedOpType, check_op_for_dtype

__all__ = ["mpi_datatype", "Reduction", "REDUCTIONS", "reduction"]

_CARRIER = {2: MPI.UINT16_T, 4: MPI.UINT32_T, 8: MPI.UINT64_T}


def _native_datatype(dtype: np.dtype) -> MPI.Datatype | None:
    """The predefined MPI datatype for ``dtype`` (reductions need a predefined one), or None."""
    if dtype.kind == "V":  # ml_dtypes' bfloat16 has no MPI counterpart
        return None
    try:
        datatype = dtlib.from_numpy_dtype(dtype)
    except (ValueError, KeyError):
        return None
    if datatype == MPI.DATATYPE_NULL:
        return None
    if datatype.is_predefined:
        return datatype
    base = datatype.decode()[0]  # dtlib hands out duplicates of the predefined type
    if datatype.combiner == MPI.COMBINER_DUP and base.is_predefined:
        datatype.Free()
        return base
    return None


_datatypes: dict[np.dtype, tuple[MPI.Datatype, bool]] = {}


def _lookup(dtype: np.dtype) -> tuple[MPI.Datatype, bool]:
    entry = _datatypes.get(dtype)
    if entry is None:
        native = _native_datatype(dtype)
        entry = (native, True) if native is not None else (_CARRIER[dtype.itemsize], False)
        _datatypes[dtype] = entry
    return entry


def mpi_datatype(dtype: np.dtype) -> MPI.Datatype:
    """Return the MPI datatype that moves elements of ``dtype`` (a carrier type if MPI has none)."""
    entry = _datatypes.get(dtype)
    return (entry or _lookup(dtype))[0]


class Reduction(NamedTuple):
    """How to reduce one dtype with one ReduceOp over MPI."""

    datatype: MPI.Datatype
    op: MPI.Op
    average: bool  # divide by the group size afterwards (AVG)


_NATIVE_OPS = {
    RedOpType.SUM: MPI.SUM, RedOpType.AVG: MPI.SUM, RedOpType.PREMUL_SUM: MPI.SUM,
    RedOpType.PRODUCT: MPI.PROD, RedOpType.MIN: MPI.MIN, RedOpType.MAX: MPI.MAX,
    RedOpType.BAND: MPI.BAND, RedOpType.BOR: MPI.BOR, RedOpType.BXOR: MPI.BXOR,
}
# bool: sums and maxima are "any", products and minima are "all", as torch's backends give.
_BOOL_OPS = {
    RedOpType.SUM: MPI.LOR, RedOpType.MAX: MPI.LOR, RedOpType.BOR: MPI.LOR,
    RedOpType.PRODUCT: MPI.LAND, RedOpType.MIN: MPI.LAND, RedOpType.BAND: MPI.LAND,
    RedOpType.BXOR: MPI.LXOR,
}
_NUMPY_FUNCS = {
    RedOpType.SUM: np.add, RedOpType.AVG: np.add, RedOpType.PREMUL_SUM: np.add,
    RedOpType.PRODUCT: np.multiply, RedOpType.MIN: np.minimum, RedOpType.MAX: np.maximum,
}

# One dict per op, indexed by the op's value: the hot path looks up ``REDUCTIONS[op].get(dtype)``
# without building a key tuple.
REDUCTIONS: tuple[dict[np.dtype, Reduction], ...] = tuple({} for _ in RedOpType)
_user_ops: dict[tuple[RedOpType, np.dtype], MPI.Op] = {}


def _user_op(op: RedOpType, dtype: np.dtype) -> MPI.Op:
    user_op = _user_ops.get((op, dtype))
    if user_op is None:
        func = _NUMPY_FUNCS[op]

        def apply(inbuf, inoutbuf, datatype, _func=func, _dtype=dtype):
            inout = np.frombuffer(inoutbuf, dtype=_dtype)
            _func(np.frombuffer(inbuf, dtype=_dtype), inout, out=inout)

        user_op = _user_ops[(op, dtype)] = MPI.Op.Create(apply, commute=True)
    return user_op


def _build(op: RedOpType, dtype: np.dtype, name: str) -> Reduction:
    if not supported(dtype):
        raise_unsupported(dtype, f"{name}: the array")
    check_op_for_dtype(op, dtype, name)
    datatype, native = _lookup(dtype)
    average = op is RedOpType.AVG
    if dtype.kind == "b":
        return Reduction(datatype, _BOOL_OPS[op], average)
    if native:
        return Reduction(datatype, _NATIVE_OPS[op], average)
    return Reduction(datatype, _user_op(op, dtype), average)


def reduction(op: RedOpType, dtype: np.dtype, name: str = "reduction") -> Reduction:
    """Return the MPI datatype and op for ``op`` on ``dtype``; ValueError for pairs torch refuses."""
    found = REDUCTIONS[op].get(dtype)
    if found is None:
        found = REDUCTIONS[op][dtype] = _build(op, dtype, name)
    return found
