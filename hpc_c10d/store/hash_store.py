"""HashStore: a thread-safe store inside one process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from .base import DEFAULT_TIMEOUT
from .key_value import DELETE, KEEP, KeyValueStore

__all__ = ["HashStore"]

R = TypeVar("R")


class HashStore(KeyValueStore):
    """A dict behind a lock: share it between threads of one process (not across processes)."""

    def __init__(self, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        self._data: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def _load(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def _update(self, key: bytes, change: Callable[[bytes | None], tuple[Any, R]], reads_old: bool = True) -> R:
        with self._lock:
            new, result = change(self._data.get(key))
            if new is DELETE:
                self._data.pop(key, None)
            elif new is not KEEP:
                self._data[key] = new
            return result

    def _keys(self) -> list[bytes]:
        with self._lock:
            return list(self._data)
