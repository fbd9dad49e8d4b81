"""PrefixStore: a view of another store whose keys all start with ``prefix/``."""

from __future__ import annotations

from datetime import timedelta

from .base import Store, as_amount, as_key, as_keys

__all__ = ["PrefixStore"]


class PrefixStore(Store):
    """Prepend ``prefix + "/"`` to every key and forward to ``store`` (any Store, Python subclasses too)."""

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be str, got {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self._prefix = prefix + "/"
        self._store = store

    def _key(self, key: str) -> str:
        return self._prefix + as_key(key)

    def _keys(self, keys: list[str]) -> list[str]:
        return [self._prefix + key for key in as_keys(keys)]

    @property
    def underlying_store(self) -> Store:
        """The store this one forwards to."""
        return self._store

    @property
    def _underlying_non_prefix_store(self) -> Store:
        store = self._store
        while isinstance(store, PrefixStore):
            store = store.underlying_store
        return store

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def set(self, key: str, value: str | bytes) -> None:
        self._store.set(self._key(key), value)

    def get(self, key: str) -> bytes:
        return self._store.get(self._key(key))

    def add(self, key: str, amount: int) -> int:
        return self._store.add(self._key(key), as_amount(amount))  # checked as torch's C++ store does

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return self._store.compare_set(self._key(key), expected_value, desired_value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._store.wait(self._keys(keys))
        else:
            self._store.wait(self._keys(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        return self._store.check(self._keys(keys))

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(self._key(key))

    def num_keys(self) -> int:
        return self._store.num_keys()

    def append(self, key: str, value: str | bytes) -> None:
        self._store.append(self._key(key), value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._store.multi_get(self._keys(keys))

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self._store.multi_set(self._keys(keys), values)

    def has_extended_api(self) -> bool:
        return self._store.has_extended_api()

    def queue_push(self, key: str, value: str | bytes) -> None:
        self._store.queue_push(self._key(key), value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._store.queue_pop(self._key(key), block)

    def queue_len(self, key: str) -> int:
        return self._store.queue_len(self._key(key))

    def list_keys(self) -> list[str]:
        cut = len(self._prefix)
        return [key[cut:] for key in self._store.list_keys() if key.startswith(self._prefix)]
