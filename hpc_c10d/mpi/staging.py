"""Kept staging buffers: small list collectives move one contiguous buffer and copy per block.

Up to ``STAGE_MAX_BYTES`` in all, ``all_gather`` into a list and ``gather`` stage (``scatter`` up to
``SEND_STAGE_MAX_BYTES``); ``reduce_scatter`` from a list whose blocks are not back to back, and
lists whose blocks cannot be taken as they lie, stage at any size (``pack``, ``landing_for``). A
buffer comes from a free list per (dtype, block shape, block count) and goes back when its operation
completes (256 MiB kept at most). Why, and the measurements: docs/architecture.md, "Decisions".
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = ["STAGE_MAX_BYTES", "SEND_STAGE_MAX_BYTES", "Staging", "take", "pack", "landing_for", "unpack"]

STAGE_MAX_BYTES = 1 << 15  # total bytes of a list collective staged through a kept buffer
SEND_STAGE_MAX_BYTES = 1 << 12  # the same for scatter, whose staged copy is what MPI then sends
_KEEP_PER_KIND = 4  # free buffers kept per (dtype, shape, count): more are dropped when given back
_MAX_KINDS = 64  # past this many kinds the free lists start again (what is in flight is unaffected)
_MAX_KEPT_BYTES = 1 << 28  # free buffers kept in all; past it one given back is dropped
_SPAN_MIN_BYTES = 1 << 16  # below this, checking addresses costs more than staging a copy
_free: dict[tuple, list[Staging]] = {}
_kept = [0]  # bytes in the free lists (a soft limit: threads may race on it)


def _copy_all(targets: Sequence[np.ndarray], sources: Sequence[np.ndarray]) -> None:
    """``target[...] = source`` pairwise, for arrays of one size (a block may have another shape
    than its part: then element order is what counts)."""
    try:
        for i, source in enumerate(sources):
            targets[i][...] = source
    except ValueError:  # shapes that do not broadcast
        for target, source in zip(targets, sources):
            target.reshape(-1)[...] = source.reshape(-1)


class Staging:
    """One contiguous buffer (``whole``) and its ``parts``: one view per block, in block order."""

    __slots__ = ("whole", "parts", "_home")

    def __init__(self, dtype: np.dtype, shape: tuple, count: int, home: list[Staging]) -> None:
        self.whole = np.empty((count, *shape), dtype)
        self.parts = [self.whole[i:i + 1].reshape(shape) for i in range(count)]  # views, also of 0-d blocks
        self._home = home

    def fill_from(self, blocks: Sequence[np.ndarray]) -> None:
        """Copy ``blocks`` into the parts (before a send)."""
        _copy_all(self.parts, blocks)

    def release(self, outs: Sequence[np.ndarray] | None = None, then: Callable[[], None] | None = None) -> None:
        """After the operation: copy the parts into ``outs`` (None: nothing was received here),
        return the buffer to its free list, then run ``then`` (AVG's division) if given."""
        if outs is not None:
            _copy_all(outs, self.parts)
        home, size = self._home, self.whole.nbytes
        if len(home) < _KEEP_PER_KIND and _kept[0] + size <= _MAX_KEPT_BYTES:
            _kept[0] += size
            home.append(self)
        if then is not None:
            then()


def take(dtype: np.dtype, shape: tuple, count: int) -> Staging:
    """A staging buffer for ``count`` blocks of ``shape`` and ``dtype``: a kept one, or a new one."""
    key = (dtype, shape, count)
    home = _free.get(key)
    if home is None:
        if len(_free) >= _MAX_KINDS:
            _free.clear()
            _kept[0] = 0
        home = _free[key] = []
    try:
        found = home.pop()
    except IndexError:  # none free (first call, or all in flight)
        return Staging(dtype, shape, count, home)
    _kept[0] -= found.whole.nbytes
    return found


def _span(blocks: Sequence[np.ndarray], avoid: Sequence[np.ndarray]) -> np.ndarray | None:
    """One flat array over ``blocks`` when they lie back to back in memory, in order (as the
    blocks of ``list(buffer.chunk(n))`` do) and overlap nothing in ``avoid``; else None."""
    if sum(b.nbytes for b in blocks) < _SPAN_MIN_BYTES or not all(b.flags.c_contiguous for b in blocks):
        return None
    dtype, start = blocks[0].dtype, blocks[0].__array_interface__["data"][0]
    end = start
    for block in blocks:
        if block.dtype != dtype or block.__array_interface__["data"][0] != end:
            return None
        end += block.nbytes
    span = np.lib.stride_tricks.as_strided(blocks[0].reshape(-1), shape=((end - start) // dtype.itemsize,),
                                           strides=(dtype.itemsize,))
    return None if any(np.may_share_memory(span, other) for other in avoid) else span


def landing_for(blocks: Sequence[np.ndarray], dtype: np.dtype,
                avoid: Sequence[np.ndarray]) -> tuple[np.ndarray, Staging | None]:
    """One flat buffer to receive ``blocks``' contents in order: a view over them when they lie
    back to back (and overlap nothing in ``avoid``), else a kept buffer, the second item, which
    ``unpack`` copies into them afterwards."""
    span = _span(blocks, avoid)
    if span is not None:
        return span, None
    kept = take(dtype, (sum(b.size for b in blocks),), 1)
    return kept.parts[0], kept


def pack(blocks: Sequence[np.ndarray], dtype: np.dtype,
         avoid: Sequence[np.ndarray]) -> tuple[np.ndarray, Staging | None]:
    """``blocks`` as one flat buffer to send, in order: a view as in ``landing_for``, else a kept
    buffer they are copied into, the second item, to release once the operation is done."""
    flat, kept = landing_for(blocks, dtype, avoid)
    if kept is not None:
        np.concatenate(blocks, axis=None, out=flat)
    return flat, kept


def unpack(kept: Staging, blocks: Sequence[np.ndarray]) -> None:
    """Copy a kept flat buffer (``landing_for``) into ``blocks`` in order and release it."""
    flat, start = kept.parts[0], 0
    for block in blocks:
        stop = start + block.size
        block.reshape(-1)[...] = flat[start:stop]
        start = stop
    kept.release()
