"""A list of separately allocated arrays as one MPI message, read or written where the arrays lie.

The message is a buffer from the lowest block to the end of the highest, with one element per rank
of the block's datatype resized to a one-byte extent, at the blocks' byte offsets, so MPI reads or
writes every block in place. Why, the limits and the measurements: docs/architecture.md,
"Decisions" (List-shaped collectives).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .ops import mpi_datatype

__all__ = ["address", "block_type", "place", "lay_out", "apart"]

_MAX_TYPES = 256  # block types kept (one per dtype and block size); past this, they and the layouts are dropped
_MAX_OFFSET = 2**31 - 1  # an MPI displacement (C int)
_types: dict[tuple[np.dtype, int], MPI.Datatype] = {}
_MAX_LAYOUTS = 256  # answers of place() kept
_layouts: dict[tuple, tuple[tuple | None, bool]] = {}

address = MPI.Get_address  # the address of an array's first element (a tenth of __array_interface__'s cost)


def block_type(dtype: np.dtype, n: int) -> MPI.Datatype:
    """``n`` elements of ``dtype`` as one MPI element whose extent is one byte (cached)."""
    found = _types.get((dtype, n))
    if found is None:
        if len(_types) >= _MAX_TYPES:  # start again; MPI lets an operation in flight finish with a freed type
            _layouts.clear()
            for old in _types.values():
                old.Free()
            _types.clear()
        block = mpi_datatype(dtype).Create_contiguous(n)
        found = _types[(dtype, n)] = block.Create_resized(0, 1).Commit()
        block.Free()
    return found


def place(blocks: Sequence[np.ndarray], mine: np.ndarray, rank: int) -> tuple[tuple | None, bool]:
    """How MPI takes ``blocks`` (one per rank, each the size and dtype of ``mine``, this rank's
    array): ``(message spec, mine is blocks[rank] itself)``. The spec is ``(buffer, counts,
    displacements, datatype)`` for a ``v`` collective, or None where MPI cannot take the blocks as
    they lie (``mine`` overlaps another block, they lie too far apart, or they are empty).

    Cached by the addresses: a loop over the same arrays (or new ones where the old ones were)
    finds its answer in one lookup."""
    start, starts = address(mine), [address(b) for b in blocks]
    key = (rank, start, mine.nbytes, mine.dtype, *starts)
    found = _layouts.get(key)
    if found is None:
        if len(_layouts) >= _MAX_LAYOUTS:
            del _layouts[next(iter(_layouts))]
        found = _layouts[key] = _layout(starts, start, mine, rank)  # after block_type: it may clear _layouts
    return found


def _layout(starts: list[int], start: int, mine: np.ndarray, rank: int) -> tuple[tuple | None, bool]:
    """place()'s answer, worked out (``starts``: the blocks' addresses, ``start``: mine's)."""
    size = mine.nbytes
    if not size:
        return None, False
    in_place = False
    for i, first in enumerate(starts):
        if first < start + size and start < first + size:
            if i != rank or first != start:
                return None, False
            in_place = True
    low = min(starts)
    high = max(starts) - low
    if high > _MAX_OFFSET:
        return None, False
    whole = MPI.buffer.fromaddress(low, high + size)
    return (whole, [1] * len(starts), [first - low for first in starts], block_type(mine.dtype, mine.size)), in_place


def lay_out(blocks: Sequence[np.ndarray], starts: Sequence[int]) -> tuple[Any, list[int]] | None:
    """``blocks`` (at addresses ``starts``) where they lie, for a ``w`` collective: one buffer from
    the lowest block to the end of the highest and each block's byte displacement in it (0 for an
    empty block); None when they lie more than 2 GiB apart."""
    spans = [(start, start + block.nbytes) for block, start in zip(blocks, starts) if block.nbytes]
    if not spans:
        return MPI.buffer.fromaddress(0, 0), [0] * len(starts)
    low = min(start for start, _ in spans)
    high = max(end for _, end in spans)
    if high - low > _MAX_OFFSET:
        return None
    return (MPI.buffer.fromaddress(low, high - low),
            [start - low if block.nbytes else 0 for block, start in zip(blocks, starts)])


def apart(reads: Sequence[np.ndarray], read_starts: Sequence[int],
          writes: Sequence[np.ndarray], write_starts: Sequence[int]) -> bool:
    """Whether no block written overlaps another one written or one read (MPI's rule for a send
    and a receive buffer; reads may overlap each other)."""
    spans = sorted([(start, start + b.nbytes, True) for b, start in zip(writes, write_starts) if b.nbytes]
                   + [(start, start + b.nbytes, False) for b, start in zip(reads, read_starts) if b.nbytes])
    written_end = read_end = 0
    for start, end, written in spans:
        if start < written_end or (written and start < read_end):
            return False
        if written:
            written_end = max(written_end, end)
        else:
            read_end = max(read_end, end)
    return True
