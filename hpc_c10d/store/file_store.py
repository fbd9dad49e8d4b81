"""FileStore: processes that share a file system share a store through one file.

The file is an append-only log of (op, key, value) records. Every update appends under an
exclusive ``flock``; readers replay the records they have not seen under a shared lock, so a
process never sees half a record. With ``world_size`` > 0 the last of that many users to
close the store deletes the file, as torch's FileStore does.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import DistStoreError
from .base import DEFAULT_TIMEOUT
from .key_value import DELETE, HIDDEN, KEEP, KeyValueStore

__all__ = ["FileStore"]

R = TypeVar("R")

_RECORD = struct.Struct("<BQQ")  # op, key length, value length
_SET, _DELETE = 1, 2
_USERS = HIDDEN + b"filestore/users"
_CLOSED = HIDDEN + b"filestore/closed"


def _one_more(old: bytes | None) -> tuple[bytes, int]:
    count = int(old or b"0") + 1
    return str(count).encode(), count


class FileStore(KeyValueStore):
    """A store kept in the file ``file_name``, shared by every process that opens it."""

    def __init__(self, file_name: str, world_size: int = -1, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        if not isinstance(file_name, (str, os.PathLike)):
            raise TypeError(f"file_name must be a path, got {type(file_name).__name__}")
        if not isinstance(world_size, int) or isinstance(world_size, bool):
            raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
        self._path = os.fspath(file_name)
        self._world_size = world_size
        self._guard = threading.Lock()  # threads of this process share one file offset
        self._data: dict[bytes, bytes] = {}
        self._seen = 0
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as err:
            raise DistStoreError(f"FileStore cannot open {self._path!r}: {err.strerror}") from None
        self._open = True
        self._update(_USERS, _one_more)

    @property
    def path(self) -> str:
        """The file holding the store."""
        return self._path

    def _describe(self) -> str:
        return f"FileStore({self._path!r})"

    def _catch_up(self) -> None:
        """Apply the records appended since we last read (the caller holds a file lock)."""
        size = os.fstat(self._fd).st_size
        if size == self._seen:
            return
        log = os.pread(self._fd, size - self._seen, self._seen)
        at = 0
        while at < len(log):
            op, key_size, value_size = _RECORD.unpack_from(log, at)
            at += _RECORD.size
            key = log[at:at + key_size]
            at += key_size
            if op == _SET:
                self._data[key] = log[at:at + value_size]
                at += value_size
            else:
                self._data.pop(key, None)
        self._seen = size

    def _locked(self, mode: int) -> Any:
        if not self._open:
            raise DistStoreError(f"{self._describe()} is closed")
        return _FileLock(self._fd, mode, self._guard)

    def _load(self, key: bytes) -> bytes | None:
        with self._locked(fcntl.LOCK_SH):
            self._catch_up()
            return self._data.get(key)

    def _update(self, key: bytes, change: Callable[[bytes | None], tuple[Any, R]], reads_old: bool = True) -> R:
        with self._locked(fcntl.LOCK_EX):
            self._catch_up()
            new, result = change(self._data.get(key))
            if new is KEEP:
                return result
            if new is DELETE:
                record = _RECORD.pack(_DELETE, len(key), 0) + key
            else:
                record = _RECORD.pack(_SET, len(key), len(new)) + key + new
            os.write(self._fd, record)
            self._catch_up()
            return result

    def _keys(self) -> list[bytes]:
        with self._locked(fcntl.LOCK_SH):
            self._catch_up()
            return list(self._data)

    def close(self) -> None:
        """Leave the store; with ``world_size`` > 0 the last user to leave deletes the file."""
        if not self._open:
            return
        closed = self._update(_CLOSED, _one_more)
        self._open = False
        os.close(self._fd)
        if 0 < self._world_size <= closed:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass

    def __del__(self) -> None:
        if getattr(self, "_open", False):
            try:
                self.close()
            except Exception:  # interpreter shutdown: best effort only
                pass


class _FileLock:
    """``flock`` on the store's file plus a thread lock, as a context manager."""

    __slots__ = ("_fd", "_mode", "_guard")

    def __init__(self, fd: int, mode: int, guard: threading.Lock) -> None:
        self._fd, self._mode, self._guard = fd, mode, guard

    def __enter__(self) -> None:
        self._guard.acquire()
        fcntl.flock(self._fd, self._mode)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._guard.release()
