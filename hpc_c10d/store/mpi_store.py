"""MPIStore: the default store, kept in the job's own memory through MPI one-sided communication.

No server and no port: each rank of the communicator owns a shard of a hash table in an
MPI-3 RMA window (``rma_table.py``) and every rank reads and updates any shard
directly. A light progress thread (``hpc_c10d.mpi.progress``) keeps requests moving while the
owner of a shard computes without calling MPI.
"""

from __future__ import annotations

import atexit
import os
import re
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import DistStoreError
from ..mpi import bootstrap, ulfm
from ..mpi.progress import interval_from_env, progress
from ..process_group import ProcessGroup
from .base import DEFAULT_TIMEOUT, as_amount, as_key, as_timeout
from .key_value import KeyValueStore
from .rma_table import ShardedTable

__all__ = ["MPIStore", "CAPACITY_ENV", "MAX_KEYS_ENV", "DEFAULT_CAPACITY", "DEFAULT_MAX_KEYS"]

R = TypeVar("R")

CAPACITY_ENV = "HPC_C10D_STORE_CAPACITY"
MAX_KEYS_ENV = "HPC_C10D_STORE_MAX_KEYS"
#: Bytes of keys and values each rank holds (memory is touched only as it fills).
DEFAULT_CAPACITY = 128 << 20
#: Keys each rank holds.
DEFAULT_MAX_KEYS = 16384

_open_stores: weakref.WeakValueDictionary[int, MPIStore] = weakref.WeakValueDictionary()  # by creation
_created = iter(range(1 << 62))


def _close_open_stores() -> None:
    """Free the windows of stores still open at exit, before MPI is finalized (collective, like
    MPI_Finalize itself); without it the MPI library complains about windows in use."""
    for _, store in sorted(_open_stores.items()):  # the same order on every rank
        store.close()


class _ClosedTable:
    """Stands in for the table of a closed store: its settings stay readable, anything else raises
    (the window is gone; touching its memory would crash the process)."""

    lock_timeout: float  # set_timeout on a closed store still sets it; nothing reads it

    def __init__(self, capacity: int, max_keys: int) -> None:
        self.capacity, self.max_keys = capacity, max_keys

    def __getattr__(self, name: str) -> Any:
        raise DistStoreError("MPIStore: the store was closed")


_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse ``"256M"``, ``"1GiB"``, ``"65536"`` into bytes; ValueError otherwise."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size such as 65536, 64M or 1GiB")
    return int(match.group(1)) << (10 * " kmgt".index(match.group(2).lower() or " "))


def _setting(value: Any, env: str, default: int, parse: Callable[[str], int], name: str) -> int:
    if value is None:
        text = os.environ.get(env, "")
        value = parse(text) if text.strip() else default
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


class MPIStore(KeyValueStore):
    """A Store spread over the ranks of ``comm`` (an mpi4py communicator or a ProcessGroup; default
    the world). Creating and closing it are collective.

    ``capacity`` (bytes) and ``max_keys`` are per rank and must agree on every rank; they default
    to ``HPC_C10D_STORE_CAPACITY`` (e.g. ``512M``) and ``HPC_C10D_STORE_MAX_KEYS``, else 128 MiB
    and 16384. Blocks come in size classes up to 25% larger than their entry, so one value may
    use at most about 0.8 x capacity. Running out raises DistStoreError and changes nothing.
    """

    def __init__(self, comm: Any = None, *, timeout: timedelta = DEFAULT_TIMEOUT, capacity: int | None = None,
                 max_keys: int | None = None) -> None:
        MPI = bootstrap.initialize()
        base = MPI.COMM_WORLD if comm is None else comm.comm if isinstance(comm, ProcessGroup) else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py intracommunicator, got {comm!r}")
        try:  # every rank checks its own arguments, then all agree before anything is created
            super().__init__(timeout)
            settings: Any = (_setting(capacity, CAPACITY_ENV, DEFAULT_CAPACITY, parse_size, "capacity"),
                             _setting(max_keys, MAX_KEYS_ENV, DEFAULT_MAX_KEYS, int, "max_keys"),
                             interval_from_env())
        except (TypeError, ValueError) as err:
            settings = err
        every = base.allgather(settings)
        problems = [(rank, s) for rank, s in enumerate(every) if isinstance(s, Exception)]
        if problems:
            rank, problem = problems[0]
            raise type(problem)(f"MPIStore on rank {rank}: {problem}")
        if len(set(every)) > 1:
            raise ValueError("MPIStore: (capacity, max_keys, progress interval) differ between ranks: "
                             f"{sorted(set(every))}")
        capacity, max_keys, interval = settings

        self._comm, self._ranks = base.Dup(), base.Get_size()
        self._table: ShardedTable | _ClosedTable = ShardedTable(MPI, self._comm, capacity, max_keys)
        self._table.lock_timeout = self._timeout.total_seconds()
        # A progress thread only where some rank's shard is not shared memory for every rank.
        progress.join(MPI, self._comm, interval, self._comm.allreduce(self._table.over_network, op=MPI.LOR))
        self._open = True
        if not _open_stores:  # registered after MPI started, so it runs before MPI is finalized
            atexit.unregister(_close_open_stores)
            atexit.register(_close_open_stores)
        _open_stores[next(_created)] = self

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = as_timeout(timeout)
        self._table.lock_timeout = timeout.total_seconds()

    @property
    def capacity(self) -> int:
        """Bytes of keys and values each rank can hold."""
        return self._table.capacity

    @property
    def max_keys(self) -> int:
        """Keys each rank can hold."""
        return self._table.max_keys

    @property
    def comm(self) -> Any:
        """The store's own communicator (a duplicate of the one given)."""
        return self._comm

    def owner(self, key: str) -> int:
        """Return the rank (of the store's communicator) whose memory holds ``key``."""
        return self._table.owner(key.encode())

    def _describe(self) -> str:
        return f"MPIStore(ranks={self._ranks})"

    def __repr__(self) -> str:
        return f"<MPIStore ranks={self._ranks} capacity={self.capacity} max_keys={self.max_keys}>"

    def add(self, key: str, amount: int) -> int:
        raw, amount = as_key(key).encode(), as_amount(amount)
        total = self._table.add(raw, amount)  # one compare-and-swap on a counter this rank has seen
        if total is None and self._table.load(raw) is not None:
            # Someone else's counter (or one whose slot moved): reading it caches its slot, so this
            # rank adds without the owner's lock, which a crowd of first-time adders would queue on.
            total = self._table.add(raw, amount)
        return super().add(key, amount) if total is None else total

    def get(self, key: str) -> bytes:
        value = self._table.load(as_key(key).encode())  # present already: no polling machinery
        return super().get(key) if value is None else value

    def _load(self, key: bytes) -> bytes | None:
        return self._table.load(key)

    def _contains(self, key: bytes) -> bool:
        return self._table.contains(key)

    def _update(self, key: bytes, change: Callable[[bytes | None], tuple[Any, R]], reads_old: bool = True) -> R:
        return self._table.update(key, change, reads_old)

    def _keys(self) -> list[bytes]:
        return self._table.keys()

    def _count(self) -> int:
        return self._table.count()

    def close(self) -> None:
        """Free the windows; collective over the store's communicator. Safe to call twice."""
        if not self._open:
            return
        table = self._table
        self.abandon()
        MPI = bootstrap.initialize()
        try:
            table.free()
        except MPI.Exception as exc:  # a rank died (ULFM): the windows stay allocated until MPI ends
            if not ulfm.is_process_failure(MPI, exc.Get_error_class()):
                raise
        self._comm.Free()

    def abandon(self) -> None:
        """Close without freeing (a rank of the communicator died, so nothing collective can run):
        every later operation raises DistStoreError; the windows stay allocated until MPI ends."""
        if self._open:
            self._open = False
            progress.leave()
            self._table = _ClosedTable(self._table.capacity, self._table.max_keys)
