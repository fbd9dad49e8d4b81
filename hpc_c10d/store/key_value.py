"""The whole Store contract built on three atomic primitives; HashStore, FileStore and MPIStore.

A concrete store provides ``_load`` (read one value), ``_update`` (atomic read-modify-write of
one key) and ``_keys``; this class turns them into torch's semantics: counters as decimal text,
compare_set's return rules, blocking ``get``/``wait`` with back-off, append, queues. Internal
keys (queues, bookkeeping) start with a byte no UTF-8 string can start with, so they never
collide with user keys and are left out of ``num_keys``/``list_keys``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import DistStoreError, QueueEmptyError
from .base import Store, as_amount, as_key, as_keys, as_timeout, as_value

__all__ = ["KeyValueStore", "KEEP", "DELETE", "HIDDEN", "is_hidden"]

R = TypeVar("R")

#: Returned by an update's change function: leave the key as it is.
KEEP = object()
#: Returned by an update's change function: remove the key.
DELETE = object()
#: First byte of internal keys (never the first byte of a UTF-8 encoded str).
HIDDEN = b"\xff"

_QUEUE = HIDDEN + b"queue/"
_LENGTH = 8  # bytes of the length prefix of each queued item
_COUNTER = re.compile(rb"\s*([+-]?\d+)")  # what C++ stoll accepts, as torch parses counters
_INT64 = 1 << 64
_FIRST_PAUSE, _LONGEST_PAUSE = 20e-6, 10e-3  # back-off of blocking reads, seconds


def is_hidden(key: bytes) -> bool:
    """Return True for internal keys."""
    return key[:1] == HIDDEN


def _as_counter(key: bytes, value: bytes) -> int:
    match = _COUNTER.match(value)
    if match is None:
        raise ValueError(f"add() on key {key.decode(errors='replace')!r}: its value {value[:32]!r} "
                         "is not an integer")
    return int(match.group(1))


def _wrap_int64(n: int) -> int:
    return (n + (1 << 63)) % _INT64 - (1 << 63)


def _queue_items(blob: bytes) -> list[bytes]:
    items, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at:at + _LENGTH], "little")
        items.append(blob[at + _LENGTH:at + _LENGTH + size])
        at += _LENGTH + size
    return items


class KeyValueStore(Store):
    """A Store whose every operation is built on ``_load``, ``_update`` and ``_keys``."""

    # --- primitives a concrete store implements ---------------------------------------------
    def _load(self, key: bytes) -> bytes | None:
        """Return the value of ``key`` or None, atomically."""
        raise NotImplementedError

    def _update(self, key: bytes, change: Callable[[bytes | None], tuple[Any, R]], reads_old: bool = True) -> R:
        """Atomically apply ``change(old) -> (new, result)``; new may be KEEP or DELETE.

        With ``reads_old=False`` the change only asks whether the key exists, and a store may
        pass ``b""`` for a present key instead of fetching its value.
        """
        raise NotImplementedError

    def _keys(self) -> list[bytes]:
        """Return every key, internal ones included."""
        raise NotImplementedError

    def _contains(self, key: bytes) -> bool:
        return self._load(key) is not None

    def _count(self) -> int:
        return sum(not is_hidden(key) for key in self._keys())

    def _describe(self) -> str:
        return type(self).__name__

    # --- blocking ---------------------------------------------------------------------------
    def _poll(self, attempt: Callable[[], R | None], timeout: timedelta, waiting_for: Callable[[], list[str]]) -> R:
        """Call ``attempt`` with growing pauses until it returns non-None; DistStoreError at timeout."""
        result = attempt()
        if result is not None:
            return result
        deadline = time.monotonic() + timeout.total_seconds()
        pause = _FIRST_PAUSE
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DistStoreError(f"{self._describe()}: wait timeout after {timeout.total_seconds():g} s; "
                                     f"keys not set: {waiting_for()}")
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, _LONGEST_PAUSE)
            result = attempt()
            if result is not None:
                return result

    # --- the contract -----------------------------------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        data = as_value(value)
        self._update(as_key(key).encode(), lambda old: (data, None), reads_old=False)

    def get(self, key: str) -> bytes:
        name = as_key(key)
        raw = name.encode()
        return self._poll(lambda: self._load(raw), self._timeout, lambda: [name])

    def add(self, key: str, amount: int) -> int:
        raw, amount = as_key(key).encode(), as_amount(amount)

        def change(old: bytes | None) -> tuple[bytes, int]:
            total = _wrap_int64((_as_counter(raw, old) if old else 0) + amount)  # empty counts as 0, as torch
            return str(total).encode(), total

        return self._update(raw, change)

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        expected, desired = as_value(expected_value), as_value(desired_value)

        def change(old: bytes | None) -> tuple[Any, bytes]:
            if old is None:
                return (desired, desired) if expected == b"" else (KEEP, expected)
            return (desired, desired) if old == expected else (KEEP, old)

        return self._update(as_key(key).encode(), change)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        names = as_keys(keys)
        timeout = self._timeout if timeout is None else as_timeout(timeout)
        pending = {name: name.encode() for name in names}

        def all_set() -> bool | None:
            for name in [n for n, raw in pending.items() if self._contains(raw)]:
                del pending[name]
            return True if not pending else None

        self._poll(all_set, timeout, lambda: list(pending))

    def check(self, keys: list[str]) -> bool:
        return all(self._contains(name.encode()) for name in as_keys(keys))

    def delete_key(self, key: str) -> bool:
        return self._update(as_key(key).encode(), lambda old: (DELETE, old is not None), reads_old=False)

    def num_keys(self) -> int:
        return self._count()

    def append(self, key: str, value: str | bytes) -> None:
        data = as_value(value)
        self._update(as_key(key).encode(), lambda old: ((old or b"") + data, None))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(name) for name in as_keys(keys)]

    def has_extended_api(self) -> bool:
        return True

    def list_keys(self) -> list[str]:
        return [key.decode() for key in self._keys() if not is_hidden(key)]

    def queue_push(self, key: str, value: str | bytes) -> None:
        data = as_value(value)
        item = len(data).to_bytes(_LENGTH, "little") + data
        self._update(_QUEUE + as_key(key).encode(), lambda old: ((old or b"") + item, None))

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        name = as_key(key)
        raw = _QUEUE + name.encode()

        def pop(old: bytes | None) -> tuple[Any, bytes | None]:
            if not old:
                return KEEP, None
            size = int.from_bytes(old[:_LENGTH], "little")
            rest = old[_LENGTH + size:]
            return (rest if rest else DELETE), old[_LENGTH:_LENGTH + size]

        if not block:
            item = self._update(raw, pop)
            if item is None:
                raise QueueEmptyError(f"queue {name!r} is empty")
            return item
        return self._poll(lambda: self._update(raw, pop) if self._contains(raw) else None, self._timeout,
                          lambda: [f"queue {name}"])

    def queue_len(self, key: str) -> int:
        return len(_queue_items(self._load(_QUEUE + as_key(key).encode()) or b""))
