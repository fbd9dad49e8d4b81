"""What a state dict holds, rank by rank, and where each rank's slab sits in the global arrays.

A state dict is a nested dict whose leaves are ``Shard``s (this rank's slab of a global array),
plain arrays (the same on every rank: replicated), or scalars and strings. ``Leaf`` describes one
leaf; ``agree`` gathers every rank's leaves, checks that they describe the same checkpoint and
returns the global view, so that every rank raises the same error before any file is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .. import arrays

__all__ = ["Shard", "Leaf", "leaves", "agree", "storage_dtype", "SCALAR_TYPES"]

#: scalar leaves, by the name stored with them.
SCALAR_TYPES = {"bool": bool, "int": int, "float": float, "complex": complex, "str": str, "bytes": bytes}


@dataclass(frozen=True)
class Shard:
    """This rank's slab of a global array: slabs join along ``axis`` in group-rank order."""

    array: Any
    axis: int = 0


@dataclass(frozen=True)
class Leaf:
    """One entry of a state dict, as this rank sees it (picklable: no array inside)."""

    path: str  # "model/layer1/weight"
    kind: str  # "sharded", "replicated" or "scalar"
    dtype: str = ""  # numpy name ("bfloat16" included); for scalars the Python type's name
    shape: tuple[int, ...] = ()  # the local array's shape
    axis: int = 0

    def describe(self) -> str:
        if self.kind == "scalar":
            return f"a {self.dtype}"
        where = f" split along axis {self.axis}" if self.kind == "sharded" else ""
        return f"{self.kind} {self.dtype}{list(self.shape)}{where}"


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, complex, str, bytes, np.generic))


def _scalar_type(value: Any) -> str:
    if isinstance(value, np.generic):
        return f"numpy.{value.dtype.name}"
    return next(name for name, kind in SCALAR_TYPES.items() if type(value) is kind)


def leaves(state: dict, prefix: str = "") -> Iterator[tuple[Leaf, Any]]:
    """Walk ``state`` depth-first in key order: (Leaf, value) for every leaf."""
    if not isinstance(state, dict):
        raise TypeError(f"a state dict must be a dict, got {type(state).__name__} at {prefix or 'the top'!r}")
    for key in sorted(state):
        if not isinstance(key, str) or not key or "/" in key:
            raise ValueError(f"state dict keys must be non-empty strings without '/', got {key!r} in {prefix or '/'}")
        path, value = f"{prefix}{key}", state[key]
        if isinstance(value, dict):
            yield from leaves(value, path + "/")
        elif isinstance(value, Shard):
            arr = _describe_array(value.array, path)
            axis = value.axis + arr.ndim if value.axis < 0 else value.axis
            if not 0 <= axis < max(arr.ndim, 1) or arr.ndim == 0:
                raise ValueError(f"{path}: Shard axis {value.axis} is out of range for a {arr.ndim}-d array")
            yield Leaf(path, "sharded", arrays_name(arr.dtype), arr.shape, axis), value.array
        elif _is_scalar(value):
            yield Leaf(path, "scalar", _scalar_type(value)), value
        else:
            arr = _describe_array(value, path)
            yield Leaf(path, "replicated", arrays_name(arr.dtype), arr.shape), value


def _describe_array(value: Any, path: str) -> Any:
    """Something with .shape/.dtype for any array we accept (no copy, device arrays included)."""
    try:
        if arrays.device_type(value) == "cuda":
            return _Described(tuple(value.shape), np.dtype(str(value.dtype).replace("torch.", "")))
        return arrays.as_array(value, path)
    except TypeError:
        raise TypeError(f"state_dict entry {path!r}: a checkpoint holds arrays, Shards, scalars and strings, "
                        f"not {type(value).__name__}") from None


@dataclass(frozen=True)
class _Described:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def arrays_name(dtype: np.dtype) -> str:
    return "bfloat16" if arrays.is_bfloat16(np.dtype(dtype)) else np.dtype(dtype).name


def storage_dtype(name: str) -> np.dtype:
    """The dtype HDF5 stores ``name`` as (bfloat16, unknown to HDF5, as its 16-bit pattern)."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def agree(mine: list[Leaf] | Exception, comm: Any) -> list[list[int]]:
    """Check that every rank describes the same checkpoint; return ``extents``, where
    ``extents[i][r]`` is rank r's length along leaf i's shard axis. ``mine`` may be the error this
    rank met reading its state dict: then every rank raises it (its type, the rank named)."""
    everyone = comm.allgather(mine)  # metadata only: a few bytes per leaf, once per checkpoint
    for rank, theirs in enumerate(everyone):
        if isinstance(theirs, Exception):
            raise type(theirs)(f"rank {rank}: {theirs}")
    problems = []
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if [leaf.path for leaf in theirs] != [leaf.path for leaf in reference]:
            missing = sorted({leaf.path for leaf in reference} ^ {leaf.path for leaf in theirs})
            problems.append(f"ranks 0 and {rank} hold different keys (differing: {', '.join(missing)})")
            continue
        for a, b in zip(reference, theirs):
            if (a.kind, a.dtype, a.axis) != (b.kind, b.dtype, b.axis) or len(a.shape) != len(b.shape):
                problems.append(f"{a.path}: rank 0 holds {a.describe()}, rank {rank} holds {b.describe()}")
            elif a.kind == "replicated" and a.shape != b.shape:
                problems.append(f"{a.path}: replicated, but rank 0 holds {list(a.shape)} and rank {rank} "
                                f"holds {list(b.shape)} (wrap a rank's slab in Shard)")
            elif a.kind == "sharded" and _without(a.shape, a.axis) != _without(b.shape, b.axis):
                problems.append(f"{a.path}: slabs must agree off axis {a.axis}: rank 0 holds {list(a.shape)}, "
                                f"rank {rank} holds {list(b.shape)}")
    if problems:
        raise ValueError("the ranks' state dicts do not describe one checkpoint:\n  " + "\n  ".join(problems))
    return [[theirs[i].shape[leaf.axis] if leaf.kind == "sharded" else 0 for theirs in everyone]
            for i, leaf in enumerate(reference)]


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1:]
