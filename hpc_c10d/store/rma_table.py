"""A hash table sharded over a communicator's ranks, living in MPI-3 RMA windows: MPIStore's table.

A key's hash picks its owner rank and first slot; writers take the shard's sequence lock with a
compare-and-swap, readers never write. Shards MPI maps into this process are read and written as
memory, and counters live in a slot's counter word (an ``add`` to one already seen is one
compare-and-swap). The window layout and the protocol: docs/architecture.md, "Stores".
"""

from __future__ import annotations

import hashlib
import re
import struct
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np

from ..errors import DistStoreError
from . import atomics
from .key_value import DELETE, KEEP, is_hidden

__all__ = ["ShardedTable", "size_class"]

R = TypeVar("R")

_WORD = 8
_VERSION, _TOP, _VISIBLE, _LIVE, _USED = (i * _WORD for i in range(5))
_FREE_AT = 5 * _WORD
_CLASSES = 256
_SLOTS_AT = _FREE_AT + _CLASSES * _WORD
_SLOT_WORDS = 16
_SLOT_BYTES = _SLOT_WORDS * _WORD
_COUNTER_AT = 5 * _WORD  # byte offset of the counter word in a slot
_CHECKSUM_AT = 6 * _WORD
_INLINE_AT = _CHECKSUM_AT + _WORD
_INLINE_BYTES = _SLOT_BYTES - _INLINE_AT
_HEADER_BYTES = 5 * _WORD  # the header words a slot's checksum covers
_HEADER_WORDS = struct.Struct("=5q")
_SLOT_HEAD = struct.Struct(f"={_INLINE_AT // _WORD}q")  # the words before the inline record
_WORD_AT = struct.Struct("=q")
_EMPTY, _TOMBSTONE = 0, 1
_IS_COUNTER = -1
_PROBE = 4  # slots fetched per round trip
_MIN_BLOCK = 64
_LONGEST_PAUSE = 1e-3
_VALUE_BITS = 44
_VALUE_MASK = (1 << _VALUE_BITS) - 1
_GEN_MASK = (1 << (64 - _VALUE_BITS)) - 1
_LIMIT = 1 << (_VALUE_BITS - 1)
_CANONICAL = re.compile(rb"-?(?:0|[1-9][0-9]{0,13})")
_CACHED_KEYS = 1 << 16  # per cache: key placements, counter slots, value slots


def size_class(nbytes: int) -> tuple[int, int]:
    """Return (class index, block size) of the smallest block holding ``nbytes``."""
    n = max(nbytes, _MIN_BLOCK)
    exp = n.bit_length() - 1
    quarter = 1 << (exp - 2)
    steps = -(-(n - (1 << exp)) // quarter)
    return 4 * exp + steps, (1 << exp) + steps * quarter


def _counter(gen: int, value: int) -> int:
    word = ((gen & _GEN_MASK) << _VALUE_BITS) | (value & _VALUE_MASK)
    return word - (1 << 64) if word >= 1 << 63 else word


def _gen(word: int) -> int:
    return (word >> _VALUE_BITS) & _GEN_MASK


def _value(word: int) -> int:
    value = word & _VALUE_MASK
    return value - (1 << _VALUE_BITS) if value >= _LIMIT else value


def _as_counter(value: bytes) -> int | None:
    """The int a canonical decimal ``value`` spells if it fits a counter word, else None."""
    if _CANONICAL.fullmatch(value) is None or value == b"-0":
        return None
    number = int(value)
    return number if -_LIMIT <= number < _LIMIT else None


def _cache(table: dict, key: bytes, value: Any) -> None:
    """Store ``value`` in one of the per-key caches, emptying it first once it is full."""
    if len(table) >= _CACHED_KEYS:
        table.clear()
    table[key] = value


def _checksum(header: bytes, record: bytes) -> int:
    """The word a writer stores beside an inline record: a hash of the header words (as they lie
    in memory) and the record."""
    digest = hashlib.blake2b(header + record, digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _words(raw: bytes) -> list[int]:
    return np.frombuffer(raw, np.int64).tolist()


class _Torn(Exception):
    """A lock-free read saw a half-written slot; read again."""


class _Slot:
    """One slot as read: its index, its words, and its key and text value once fetched."""

    __slots__ = ("index", "value_size", "key_size", "offset", "block", "word", "value")

    def __init__(self, index: int, words: list[int]) -> None:
        self.index = index
        _, self.value_size, self.key_size, self.offset, self.block, self.word = words[:6]
        self.value: bytes | None = None

    @property
    def counter(self) -> bool:
        return self.value_size == _IS_COUNTER

    def record_size(self) -> int:
        return self.key_size + (0 if self.counter else self.value_size)


class ShardedTable:
    """The distributed hash table behind MPIStore (collective construction over ``comm``)."""

    def __init__(self, MPI: Any, comm: Any, capacity: int, max_keys: int) -> None:
        self._MPI = MPI
        self._size, self.rank = comm.Get_size(), comm.Get_rank()
        self.capacity, self.max_keys = capacity, max_keys
        self._nslots = 2 * max_keys
        self._heap = -(-(_SLOTS_AT + self._nslots * _SLOT_BYTES) // 64) * 64
        self.lock_timeout = 300.0
        self._win = MPI.Win.Allocate(self._heap + capacity, 1, comm=comm)
        # errors raise, as on hpc_c10d's communicators (mpi4py's rc.errors may make them fatal),
        # so that probing with Shared_query where MPI does not share the window is not an abort
        self._win.Set_errhandler(MPI.ERRORS_RETURN)
        meta = np.frombuffer(self._win.tomemory(), np.uint8, self._heap)
        if meta.any():  # fresh pages are usually zero already; writing would touch them all
            meta[:] = 0
        comm.Barrier()
        self._win.Lock_all(MPI.MODE_NOCHECK)
        self._guard = threading.Lock()
        self._shared = [self._shared_memory(MPI, rank) for rank in range(self._size)]
        #: True where some shard is reached through MPI calls (another node, or MPIR_CVAR_NOLOCAL).
        self.over_network = any(shared is None for shared in self._shared)
        self._atomics = atomics.pick(MPI, comm, self._win, self._shared)
        self._fetch, self._swap = self._atomics.fetch, self._atomics.swap
        self._pending: list[Any] = []  # origin buffers of puts not yet flushed
        self._versions = [0] * self._size  # last even version seen per rank (first CAS guess)
        self._counters: dict[bytes, list[int]] = {}  # key -> [rank, counter word's disp, counter word]
        self._places: dict[bytes, tuple[int, int, int]] = {}  # key -> (owner, tag, first slot)
        self._hints: dict[bytes, int] = {}  # key -> the slot its value was last found in

    # --- placement --------------------------------------------------------------------------
    def owner(self, key: bytes) -> int:
        """The rank whose window holds ``key``."""
        return self._locate(key)[0]

    def _locate(self, key: bytes) -> tuple[int, int, int]:
        """(owner rank, tag, first slot) of ``key``: hashed once, then remembered."""
        found = self._places.get(key)
        if found is None:
            found = self._place(key)
            _cache(self._places, key, found)
        return found

    def _place(self, key: bytes) -> tuple[int, int, int]:
        digest = hashlib.blake2b(key, digest_size=16).digest()
        tag = int.from_bytes(digest[8:], "little", signed=True)
        return (int.from_bytes(digest[:8], "little") % self._size, tag + 2 if tag in (0, 1) else tag,
                (tag & 0x7FFFFFFFFFFFFFFF) % self._nslots)

    # --- raw RMA ----------------------------------------------------------------------------
    def _shared_memory(self, MPI: Any, rank: int) -> memoryview | None:
        """``rank``'s window as memory of this process, if MPI shares it (one node, unified model)."""
        if self._win.model != MPI.WIN_UNIFIED:
            return None
        try:
            memory, _ = self._win.Shared_query(rank)
        except MPI.Exception:  # MPI libraries that share only Allocate_shared windows
            return None
        shared = memoryview(memory).cast("B")
        return shared if shared.nbytes == self._heap + self.capacity else None

    def _flush(self, rank: int) -> None:
        """Complete this rank's writes to ``rank``'s window before what follows (an unlock)."""
        if self._shared[rank] is not None:
            self._win.Sync()  # plain stores: a memory barrier is enough
        else:
            self._win.Flush(rank)
            self._pending.clear()

    def _read(self, rank: int, disp: int, nbytes: int) -> bytes:
        """``nbytes`` at ``disp`` of ``rank``'s window: a copy of shared memory, else a Get."""
        if self._pending:  # a read is not ordered after an unflushed put
            self._flush(rank)
        shared = self._shared[rank]
        if shared is not None:
            return bytes(shared[disp:disp + nbytes])
        buf = bytearray(nbytes)
        self._win.Get([buf, self._MPI.BYTE], rank, (disp, nbytes, self._MPI.BYTE))
        self._flush(rank)
        return bytes(buf)

    def _put(self, rank: int, disp: int, data: Any) -> None:
        view = memoryview(data).cast("B")
        shared = self._shared[rank]
        if shared is not None:
            shared[disp:disp + view.nbytes] = view
            return
        self._pending.append(data)
        self._win.Put([view, self._MPI.BYTE], rank, (disp, view.nbytes, self._MPI.BYTE))

    def _put_words(self, rank: int, disp: int, *words: int) -> None:
        self._put(rank, disp, struct.pack(f"={len(words)}q", *words))

    def _read_words(self, rank: int, disp: int, count: int) -> list[int]:
        return _words(self._read(rank, disp, count * _WORD))

    # --- the sequence lock ------------------------------------------------------------------
    def _held_too_long_error(self, rank: int) -> DistStoreError:
        return DistStoreError(f"MPIStore: the table lock on rank {rank} stayed taken for {self.lock_timeout:g} s "
                              "(a rank died or stopped inside a store operation)")

    def _backoff(self, rank: int, pause: float, deadline: float) -> float:
        if time.monotonic() > deadline:
            raise self._held_too_long_error(rank)
        time.sleep(pause)
        return min(2 * pause, _LONGEST_PAUSE)

    def _lock(self, rank: int) -> int:
        shared = self._shared[rank]  # the version as it lies in memory is a better first guess
        seen = _WORD_AT.unpack_from(shared, _VERSION)[0] if shared is not None else self._versions[rank]
        pause, deadline = 1e-6, time.monotonic() + self.lock_timeout
        while True:
            if seen % 2 == 0:
                found = self._swap(rank, _VERSION, seen, seen + 1)
                if found == seen:
                    return seen + 1
                seen = found
                if seen % 2 == 0:
                    continue
            pause = self._backoff(rank, pause, deadline)
            seen = self._fetch(rank, _VERSION)

    def _unlock(self, rank: int, held: int) -> None:
        self._swap(rank, _VERSION, held, held + 1)
        self._versions[rank] = held + 1

    def _consistent(self, rank: int, read: Callable[[], R]) -> R:
        """Run ``read`` between two equal even versions of ``rank``'s window.

        The first version is the last one this process saw (``_versions``), read by an earlier,
        completed operation: if the version after ``read`` still equals it, no writer held the
        lock in between, so a read costs its own round trips plus one."""
        pause, deadline = 1e-6, time.monotonic() + self.lock_timeout
        before = self._versions[rank]
        while True:
            if before % 2 == 0:
                try:
                    result, torn = read(), False
                except _Torn:
                    torn = True
                if self._shared[rank] is not None:  # plain loads: keep them before the version's
                    self._win.Sync()
                after = self._fetch(rank, _VERSION)
                if not torn and after == before:
                    return result
                before = after
                if after % 2 == 0:
                    self._versions[rank] = after
                    if time.monotonic() < deadline:
                        continue
            pause = self._backoff(rank, pause, deadline)
            before = self._fetch(rank, _VERSION)

    # --- slots ------------------------------------------------------------------------------
    def _find(self, rank: int, key: bytes, tag: int, start: int,
              with_value: bool) -> tuple[_Slot | None, tuple[int, bool] | None]:
        """Return (the key's slot or None, (first reusable slot index, whether it is empty) or None)."""
        reusable, index, seen = None, start, 0
        while seen < self._nslots:
            count = min(_PROBE, self._nslots - index, self._nslots - seen)
            raw = self._read(rank, _SLOTS_AT + index * _SLOT_BYTES, count * _SLOT_BYTES)
            words, inline = _words(raw), memoryview(raw)
            for j in range(count):
                first = j * _SLOT_WORDS
                slot_tag = words[first]
                if slot_tag == _EMPTY:
                    return None, (index + j, True) if reusable is None else reusable
                if slot_tag == _TOMBSTONE:
                    reusable = (index + j, False) if reusable is None else reusable
                elif slot_tag == tag:  # other keys' slots: no slicing, no record read
                    slot = self._match(rank, key, tag, index + j, words[first:first + _SLOT_WORDS],
                                       inline[j * _SLOT_BYTES + _INLINE_AT:(j + 1) * _SLOT_BYTES], with_value)
                    if slot is not None:
                        return slot, reusable
            seen += count
            index = (index + count) % self._nslots
        return None, reusable

    def _at(self, rank: int, key: bytes, tag: int, index: int) -> _Slot | None:
        """The key's slot if it is still at ``index`` (one slot read), else None."""
        raw = self._read(rank, _SLOTS_AT + index * _SLOT_BYTES, _SLOT_BYTES)
        return self._match(rank, key, tag, index, _words(raw), memoryview(raw)[_INLINE_AT:], True)

    def _vouched(self, rank: int, key: bytes, tag: int, index: int) -> bytes | None:
        """The key's inline text value if the slot at ``index`` holds it and its checksum vouches
        for it (one read, no lock); None when only a locked read can tell."""
        raw = self._read(rank, _SLOTS_AT + index * _SLOT_BYTES, _SLOT_BYTES)
        slot_tag, value_size, key_size, offset, _, _, checksum = _SLOT_HEAD.unpack_from(raw)
        size = key_size + value_size
        if slot_tag != tag or key_size != len(key) or offset >= 0 or value_size < 0 or size > _INLINE_BYTES:
            return None
        record = raw[_INLINE_AT:_INLINE_AT + size]
        if record[:key_size] != key or checksum != _checksum(raw[:_HEADER_BYTES], record):
            return None
        return record[key_size:]

    def _match(self, rank: int, key: bytes, tag: int, index: int, words: list[int], inline: memoryview,
               with_value: bool) -> _Slot | None:
        """The slot at ``index`` (its words as read, its inline bytes) if it holds ``key``, with
        the text value when ``with_value``; None otherwise."""
        if words[0] != tag or words[2] != len(key):
            return None
        slot = _Slot(index, words[:6])
        record = self._record(rank, slot, inline, with_value)
        if record[:slot.key_size] != key:
            return None
        if with_value and not slot.counter:
            slot.value = record[slot.key_size:]
        return slot

    def _record(self, rank: int, slot: _Slot, inline: memoryview, with_value: bool) -> bytes:
        size = slot.record_size() if with_value else slot.key_size
        if slot.offset < 0:
            if slot.record_size() > _INLINE_BYTES:
                raise _Torn
            return bytes(inline[:size])
        if slot.offset + slot.block > self.capacity or slot.record_size() > slot.block:
            raise _Torn
        return self._read(rank, self._heap + slot.offset, size)

    # --- lock-free reads --------------------------------------------------------------------
    def load(self, key: bytes) -> bytes | None:
        """Return the value of ``key`` or None."""
        with self._guard:
            cached = self._counters.get(key)
            if cached is not None:
                rank, disp, word = cached
                now = self._fetch(rank, disp)
                if _gen(now) == _gen(word):
                    cached[2] = now
                    return str(_value(now)).encode()
                del self._counters[key]
            rank, tag, start = self._locate(key)
            hint = self._hints.get(key)
            slot = None
            if hint is not None:
                value = self._vouched(rank, key, tag, hint)
                if value is not None:
                    return value
                slot = self._consistent(rank, lambda: self._at(rank, key, tag, hint))
            if slot is None:
                slot, _ = self._consistent(rank, lambda: self._find(rank, key, tag, start, True))
                if slot is not None and not slot.counter:
                    _cache(self._hints, key, slot.index)
        if slot is None:
            return None
        if slot.counter:
            self._remember(key, rank, slot.index, slot.word)
            return str(_value(slot.word)).encode()
        return slot.value

    def contains(self, key: bytes) -> bool:
        """Return True if ``key`` is set."""
        rank, tag, start = self._locate(key)
        with self._guard:
            slot, _ = self._consistent(rank, lambda: self._find(rank, key, tag, start, False))
        return slot is not None

    def count(self) -> int:
        """Return the number of visible keys over all ranks."""
        with self._guard:
            return sum(self._consistent(rank, partial(self._read_words, rank, _VISIBLE, 1))[0]
                       for rank in range(self._size))

    def keys(self) -> list[bytes]:
        """Return every key (internal ones included)."""
        with self._guard:
            return [key for rank in range(self._size) for key in self._consistent(rank, partial(self._keys_of, rank))]

    def _keys_of(self, rank: int) -> list[bytes]:
        table = self._read(rank, _SLOTS_AT, self._nslots * _SLOT_BYTES)
        raw, words, keys = memoryview(table), _words(table), []
        for first in range(0, len(words), _SLOT_WORDS):
            if words[first] not in (_EMPTY, _TOMBSTONE):
                slot = _Slot(first // _SLOT_WORDS, words[first:first + 6])
                inline = raw[first * _WORD + _INLINE_AT:(first + _SLOT_WORDS) * _WORD]
                keys.append(self._record(rank, slot, inline, False))
        return keys

    # --- counters without the lock ----------------------------------------------------------
    def _remember(self, key: bytes, rank: int, index: int, word: int) -> None:
        _cache(self._counters, key, [rank, self._counter_disp(index), word])

    def add(self, key: bytes, amount: int) -> int | None:
        """Add to a counter this rank has seen, with compare-and-swap only; None if that cannot be done."""
        with self._guard:
            cached = self._counters.get(key)
            if cached is None:
                return None
            rank, disp, word = cached
            while True:
                total = _value(word) + amount
                if not -_LIMIT <= total < _LIMIT:
                    return None
                desired = (word & ~_VALUE_MASK) | (total & _VALUE_MASK)  # same generation
                found = self._swap(rank, disp, word, desired)
                if found == word:
                    cached[2] = desired
                    return total
                if (found ^ word) & ~_VALUE_MASK:  # another generation: the slot changed hands
                    del self._counters[key]
                    return None
                word = found

    # --- locked updates ---------------------------------------------------------------------
    def update(self, key: bytes, change: Callable[[bytes | None], tuple[Any, R]], reads_old: bool) -> R:
        """Atomically apply ``change(old) -> (new, result)`` to ``key`` (see KeyValueStore)."""
        rank, tag, start = self._locate(key)
        with self._guard:
            held = self._lock(rank)
            try:
                slot, reusable = self._find(rank, key, tag, start, reads_old)
                while True:
                    counter = slot if slot is not None and slot.counter else None  # the slot, if a counter's
                    old = None if slot is None else str(_value(slot.word)).encode() if counter else \
                        slot.value if reads_old else b""
                    new, result = change(old)
                    if new is KEEP:
                        return result
                    number = None if new is DELETE else _as_counter(new)
                    if counter and number is not None:  # stays a counter: one swap, same generation
                        desired = _counter(_gen(counter.word), number)
                        found = self._swap(rank, self._counter_disp(counter.index), counter.word, desired)
                        if found == counter.word:
                            self._remember(key, rank, counter.index, desired)
                            return result
                        counter.word = found  # an add got in first: decide again on its value
                        continue
                    plan = None if new is DELETE else self._plan(rank, key, slot, reusable, new, number)
                    if not counter:
                        break
                    sealed = _counter(_gen(counter.word) + 1, 0)  # stale lock-free adds now fail
                    found = self._swap(rank, self._counter_disp(counter.index), counter.word, sealed)
                    if found == counter.word:
                        counter.word, counter.value_size = sealed, 0
                        break
                    if plan is not None:
                        self._unplan(rank, counter, plan)
                    counter.word = found
                if plan is None:  # new is DELETE
                    if slot is not None:
                        self._remove(rank, key, slot)
                else:
                    self._commit(rank, key, tag, slot, plan, new, number)
                self._flush(rank)
                return result
            finally:
                self._unlock(rank, held)

    @staticmethod
    def _counter_disp(index: int) -> int:
        return _SLOTS_AT + index * _SLOT_BYTES + _COUNTER_AT

    def _full_error(self, rank: int, what: str) -> DistStoreError:
        return DistStoreError(f"MPIStore is full on rank {rank}: {what}. Nothing was changed. Create the store "
                              "with a larger capacity=/max_keys= or set HPC_C10D_STORE_CAPACITY / "
                              "HPC_C10D_STORE_MAX_KEYS (they apply per rank).")

    def _plan(self, rank: int, key: bytes, slot: _Slot | None, reusable: tuple[int, bool] | None, value: bytes,
              number: int | None) -> tuple[int, int, int, list[int] | None]:
        """Check room and reserve a block for ``key``'s new value, changing nothing visible.

        Returns (slot index, heap offset or -1 for inline, block size, new header words or None).
        """
        need = len(key) if number is not None else len(key) + len(value)
        header = None
        if slot is None:
            if reusable is None:
                raise self._full_error(rank, "its slot table has no free slot")
            visible, live, used = self._read_words(rank, _VISIBLE, 3)
            index, empty = reusable
            if live >= self.max_keys:
                raise self._full_error(rank, f"it holds {live} keys, the most it may (max_keys={self.max_keys})")
            if empty and used >= self._nslots - 1:
                raise self._full_error(rank, "its slot table is clogged by deleted keys")
            header = [visible + (not is_hidden(key)), live + 1, used + empty]
        else:
            index = slot.index
        if need <= _INLINE_BYTES:
            return index, -1, 0, header
        if slot is not None and slot.offset >= 0 and need <= slot.block:
            return index, slot.offset, slot.block, header
        return (index, *self._allocate(rank, need), header)

    def _unplan(self, rank: int, slot: _Slot | None, plan: tuple[int, int, int, list[int] | None]) -> None:
        """Give back a block ``_plan`` reserved and that will not be used."""
        _, offset, block, _ = plan
        if offset >= 0 and (slot is None or offset != slot.offset):
            self._release(rank, offset, block)

    def _commit(self, rank: int, key: bytes, tag: int, slot: _Slot | None,
                plan: tuple[int, int, int, list[int] | None], value: bytes, number: int | None) -> None:
        index, offset, block, counts = plan
        if slot is not None and slot.offset >= 0 and slot.offset != offset:
            self._release(rank, slot.offset, slot.block)
        if counts is not None:
            self._put_words(rank, _VISIBLE, *counts)
        if number is not None:  # a text slot or a fresh one becomes a counter: a new generation
            word = slot.word if slot is not None else self._fetch(rank, self._counter_disp(index))
            desired = _counter(_gen(word) + 1, number)
            self._swap(rank, self._counter_disp(index), word, desired)
            self._remember(key, rank, index, desired)
        at = _SLOTS_AT + index * _SLOT_BYTES
        header = _HEADER_WORDS.pack(tag, _IS_COUNTER if number is not None else len(value), len(key), offset, block)
        if offset < 0:  # the checksum word and the inline record lie back to back
            record = key if number is not None else key + value
            self._put(rank, at + _CHECKSUM_AT, _WORD_AT.pack(_checksum(header, record)) + record)
        else:
            self._put(rank, self._heap + offset, key)
            if number is None:
                self._put(rank, self._heap + offset + len(key), value)
        self._put(rank, at, header)

    def _allocate(self, rank: int, need: int) -> tuple[int, int]:
        cls, size = size_class(need)
        head = self._read_words(rank, _FREE_AT + cls * _WORD, 1)[0]
        if head:
            following = self._read_words(rank, self._heap + head - 1, 1)[0]
            self._put_words(rank, _FREE_AT + cls * _WORD, following)
            return head - 1, size
        top = self._read_words(rank, _TOP, 1)[0]
        if size > self.capacity - top:
            raise self._full_error(rank, f"a {need}-byte entry needs a {size}-byte block and {self.capacity - top} of "
                                   f"its {self.capacity} bytes are unused (capacity={self.capacity})")
        self._put_words(rank, _TOP, top + size)
        return top, size

    def _release(self, rank: int, offset: int, block: int) -> None:
        cls = size_class(block)[0]
        head = self._read_words(rank, _FREE_AT + cls * _WORD, 1)[0]
        self._put_words(rank, self._heap + offset, head)
        self._put_words(rank, _FREE_AT + cls * _WORD, offset + 1)

    def _remove(self, rank: int, key: bytes, slot: _Slot) -> None:
        self._counters.pop(key, None)
        visible, live = self._read_words(rank, _VISIBLE, 2)
        if slot.offset >= 0:
            self._release(rank, slot.offset, slot.block)
        self._put_words(rank, _SLOTS_AT + slot.index * _SLOT_BYTES, _TOMBSTONE)
        self._put_words(rank, _VISIBLE, visible - (not is_hidden(key)), live - 1)

    def free(self) -> None:
        """Release the window (collective)."""
        for shared in self._shared:
            if shared is not None:
                shared.release()
        self._win.Unlock_all()
        self._win.Free()
