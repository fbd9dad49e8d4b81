"""The c10d Store contract: the public methods every store has, and argument checking.

A Python subclass overrides the core methods (``set``, ``get``, ``add``, ``compare_set``,
``wait``, ``check``, ``delete_key``, ``num_keys``) and inherits working ``append``,
``multi_get``, ``multi_set`` built on them, as with torch's ``Store``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..diagnostics import flight_recorder

__all__ = ["Store", "DEFAULT_TIMEOUT", "as_key", "as_keys", "as_value", "as_amount", "as_timeout"]

#: torch's default store timeout.
DEFAULT_TIMEOUT = timedelta(seconds=300)


def as_key(key: object) -> str:
    """Return ``key``; TypeError unless it is a str (torch's only key type)."""
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, got {type(key).__name__}")
    return key


def as_keys(keys: object) -> list[str]:
    """Return ``keys`` as a list of str; TypeError for a bare string or non-str items."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    return [as_key(key) for key in keys]


def as_value(value: object) -> bytes:
    """Return ``value`` as bytes: str is UTF-8 encoded, bytes-like is copied; TypeError otherwise."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store values must be str or bytes, got {type(value).__name__}")


def as_timeout(timeout: object) -> timedelta:
    """Return ``timeout``; TypeError unless it is a ``datetime.timedelta``."""
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    return timeout


class Store:
    """Base class of every key-value store; subclass it to plug in your own."""

    _timeout: timedelta = DEFAULT_TIMEOUT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        flight_recorder.track_store(cls)  # a rank blocked in its wait/get shows in hang reports

    def __init__(self, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        self._timeout = as_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        """How long ``get``/``wait`` block before raising DistStoreError."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Change the default timeout of ``get`` and ``wait``."""
        self._timeout = as_timeout(timeout)

    def _missing(self, method: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} does not implement Store.{method}()")

    # The core methods a subclass provides.
    def set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""
        raise self._missing("set")

    def get(self, key: str) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` for it to be set."""
        raise self._missing("get")

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key`` (created at 0) and return the result."""
        raise self._missing("add")

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value``; return the value now held."""
        raise self._missing("compare_set")

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Block until every key in ``keys`` is set; DistStoreError after ``timeout``."""
        raise self._missing("wait")

    def check(self, keys: list[str]) -> bool:
        """Return True if every key in ``keys`` is set, without waiting."""
        raise self._missing("check")

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; return True if it existed."""
        raise self._missing("delete_key")

    def num_keys(self) -> int:
        """Return the number of keys in the store."""
        raise self._missing("num_keys")

    # Methods with a default built on the core ones (not atomic; our stores override them).
    def append(self, key: str, value: str | bytes) -> None:
        """Append ``value`` to the value of ``key`` (created empty if missing)."""
        value = as_value(value)
        old = self.get(key) if self.check([key]) else b""
        self.set(key, old + value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Return the values of ``keys``, waiting for each as ``get`` does."""
        return [self.get(key) for key in as_keys(keys)]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        """Set each key of ``keys`` to the value at the same position of ``values``."""
        keys = as_keys(keys)
        if isinstance(values, (str, bytes)) or len(values) != len(keys):
            raise ValueError(f"multi_set needs as many values as keys ({len(keys)})")
        for key, value in zip(keys, [as_value(v) for v in values]):
            self.set(key, value)

    def has_extended_api(self) -> bool:
        """Return True if the store implements append, multi_get, multi_set and queues natively."""
        return False

    def queue_push(self, key: str, value: str | bytes) -> None:
        """Push ``value`` onto the queue ``key``."""
        raise NotImplementedError(f"{type(self).__name__}: queue support is not implemented")

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """Pop the oldest value of the queue ``key``."""
        raise NotImplementedError(f"{type(self).__name__}: queue support is not implemented")

    def queue_len(self, key: str) -> int:
        """Return the number of values in the queue ``key``."""
        raise NotImplementedError(f"{type(self).__name__}: queue support is not implemented")

    def list_keys(self) -> list[str]:
        """Return every key in the store."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its keys")


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def as_amount(amount: Any) -> int:
    """Return ``amount`` as an int; TypeError for floats, other non-integers and integers outside
    int64 (torch's store takes an int64 and refuses the rest with TypeError)."""
    try:
        value = operator.index(amount)
    except TypeError:
        raise TypeError(f"add() amount must be an int, got {type(amount).__name__}") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TypeError(f"add() amount must be an int within int64 ({_INT64_MIN}..{_INT64_MAX}), got {value}")
    return value
