"""``assert_same_on_ranks``: every rank holds an equal array or object, or every rank fails alike."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..diagnostics.trace_report import rank_ranges

__all__ = ["assert_same_on_ranks"]


def _portable(value: Any) -> Any:
    """``value`` as something every rank can compare: numpy, torch and CuPy arrays (any device) as
    numpy arrays (copies: what is compared is the value at the call), anything else as it is."""
    from ..arrays import as_array

    if type(value).__module__.startswith("cupy"):
        return value.get()
    if hasattr(value, "detach") and hasattr(value, "device"):  # a torch tensor
        return np.array(as_array(value.detach().cpu()))
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def _equal(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind in "fc":
            if rtol or atol:
                return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
            return bool(np.array_equal(a, b, equal_nan=True))
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)} {np.array2string(value, threshold=8, edgeitems=2)}"
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def assert_same_on_ranks(value: Any, group: Any = None, *, rtol: float = 0.0, atol: float = 0.0,
                         what: str = "value") -> None:
    """Raise AssertionError on every rank of ``group`` (default: the world) unless all hold an
    equal ``value``: numpy arrays, torch tensors and CuPy arrays by shape, dtype and elements
    (within ``rtol``/``atol`` for floating point; NaNs equal), anything else by ``==``.
    Collective: every rank of the group must call it."""
    __tracebackhide__ = True  # pytest: the report ends at the caller's line
    from ..lifecycle import get_world_size
    from ..object_collectives import all_gather_object

    gathered: list[Any] = [None] * get_world_size(group)
    all_gather_object(gathered, _portable(value), group=group)
    reference = gathered[0]
    differ = [rank for rank, other in enumerate(gathered) if rank and not _equal(reference, other, rtol, atol)]
    if differ:
        raise AssertionError(f"{what} differs between ranks: {rank_ranges(differ)} hold(s) something else than "
                             f"rank 0\n  rank 0: {_show(reference)}\n  rank {differ[0]}: {_show(gathered[differ[0]])}")
