"""torch's experimental object API (``torch.distributed._dist2``): groups not globally registered."""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Protocol

from .backend import BackendConfig
from .mpi import bootstrap
from .process_group import ProcessGroup
from .reduce_op import ReduceOp
from .state import _world

__all__ = ["ProcessGroup", "ReduceOp", "ProcessGroupFactory", "register_backend", "new_group",
           "current_process_group", "process_group"]


class ProcessGroupFactory(Protocol):
    """Builds a ProcessGroup over an MPI communicator (instead of torch's store/rank/size)."""

    def __call__(self, comm: Any, timeout: timedelta, device: Any, **kwargs: object) -> ProcessGroup: ...


def _factory_for(name: str) -> ProcessGroupFactory:
    def make(comm: Any, timeout: timedelta, device: Any, **kwargs: object) -> ProcessGroup:
        if kwargs:
            raise TypeError(f"backend {name!r} takes no options, got {sorted(kwargs)}")
        pg = ProcessGroup(comm, range(comm.Get_size()), f"dist2:{name}", BackendConfig(name), name, timeout)
        pg.bound_device_id = device
        return pg

    return make


_BACKENDS: dict[str, ProcessGroupFactory] = {name: _factory_for(name) for name in ("mpi", "gloo")}


def register_backend(name: str, func: ProcessGroupFactory) -> None:
    """Register a factory for ``new_group(name, ...)``; ValueError if the name is taken."""
    if name in _BACKENDS:
        raise ValueError(f"Backend {name} already registered")
    _BACKENDS[name] = func


def new_group(backend: str, timeout: timedelta, device: Any, **kwargs: object) -> ProcessGroup:
    """Create a group over all MPI processes that the module-level API does not know about.

    Collective over ``MPI.COMM_WORLD``; needs no ``init_process_group``.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"Backend {backend} not registered; registered: {', '.join(sorted(_BACKENDS))}")
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    MPI = bootstrap.initialize()
    return _BACKENDS[backend](MPI.COMM_WORLD.Dup(), timeout, device, **kwargs)


_current = threading.local()


def current_process_group() -> ProcessGroup:
    """Return this thread's current group (the default group if none was set)."""
    pg = getattr(_current, "pg", None) or _world.default_pg
    if pg is None:
        raise ValueError("no current process group: use `with process_group(pg):` or init_process_group()")
    return pg


@contextmanager
def process_group(pg: ProcessGroup) -> Generator[None, None, None]:
    """Make ``pg`` this thread's current group inside the ``with`` block."""
    previous = getattr(_current, "pg", None)
    _current.pg = pg
    try:
        yield
    finally:
        _current.pg = previous
