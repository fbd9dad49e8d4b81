"""``ReduceOp`` with torch's equality, hashing and pickling rules."""

from __future__ import annotations

import enum
import warnings
from typing import Any, TypeAlias

__all__ = ["ReduceOp", "RedOpType", "reduce_op", "_make_nccl_premul_sum", "check_op_for_dtype"]


class RedOpType(enum.IntEnum):
    """The nine reduction kinds; ``ReduceOp.SUM`` and friends are its members."""

    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8

    __hash__ = int.__hash__  # Enum's Python-level hash would cost ~0.3 us per table lookup

    def __repr__(self) -> str:
        return f"<RedOpType.{self.name}: {self.value}>"

    def __str__(self) -> str:
        return f"RedOpType.{self.name}"


class ReduceOp:
    """A reduction: one of the ``RedOpType`` members, plus a factor for PREMUL_SUM.

    As in torch, ``ReduceOp.SUM`` is a ``RedOpType`` member and ``ReduceOp(ReduceOp.SUM)``
    is an instance that compares equal to it; instances hash like their member and pickle.
    """

    RedOpType: TypeAlias = RedOpType  # an alias, so annotations in the class body still name the enum
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM

    __slots__ = ("op", "factor")
    op: RedOpType
    factor: Any

    def __init__(self, op: RedOpType = RedOpType.SUM) -> None:
        if not isinstance(op, RedOpType):
            raise TypeError(
                f"ReduceOp() takes a ReduceOp.RedOpType member such as ReduceOp.SUM, got {op!r}"
            )
        if op is RedOpType.PREMUL_SUM:
            raise ValueError("use _make_nccl_premul_sum(factor) to build a PREMUL_SUM ReduceOp")
        self.op = op
        self.factor = None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReduceOp):
            return self.op == other.op and self.factor == other.factor
        if isinstance(other, RedOpType):
            return self.op == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(int(self.op))

    def __repr__(self) -> str:
        extra = "" if self.factor is None else f", factor={self.factor!r}"
        return f"ReduceOp({self.op.name}{extra})"

    def __getstate__(self) -> tuple:
        return (int(self.op), self.factor)

    def __setstate__(self, state: tuple) -> None:
        self.op = RedOpType(state[0])
        self.factor = state[1]


_COMPLEX_OK = frozenset({RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM})
BITWISE = frozenset({RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR})


def check_op_for_dtype(op: RedOpType, dtype: Any, name: str) -> None:
    """ValueError for the (op, dtype) pairs torch refuses on every backend (``dtype``: a numpy dtype)."""
    kind = dtype.kind
    if kind == "c" and op not in _COMPLEX_OK:
        raise ValueError(f"{name} does not support {op} on complex tensors")
    if kind in "fcV" and op in BITWISE:
        raise ValueError(f"{name} does not support bitwise {op} on floating-point dtype {dtype}")
    if kind == "b" and op in (RedOpType.AVG, RedOpType.PREMUL_SUM):
        raise ValueError(f"{name} does not support {op} on bool tensors")
    if kind in "biu" and op is RedOpType.PREMUL_SUM:
        raise ValueError(f"{name} supports PREMUL_SUM only on floating-point and complex dtypes, got {dtype}")


def _make_nccl_premul_sum(factor: Any) -> ReduceOp:
    """Return the reduction ``sum(factor * x_i)``; factor is a Python number or 1-element array."""
    op = ReduceOp.__new__(ReduceOp)
    op.op = RedOpType.PREMUL_SUM
    op.factor = factor
    return op


class _ReduceOpAliasMeta(type):
    def __getattribute__(cls, name: str) -> Any:
        if not name.startswith("_"):
            warnings.warn(
                "`hpc_c10d.reduce_op` is deprecated, please use `hpc_c10d.ReduceOp` instead",
                FutureWarning,
                stacklevel=2,
            )
        return type.__getattribute__(cls, name)


class reduce_op(metaclass=_ReduceOpAliasMeta):  # noqa: N801 - torch's name
    """Deprecated alias of ``ReduceOp`` (SUM, PRODUCT, MIN, MAX); warns on use."""

    SUM = RedOpType.SUM
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
