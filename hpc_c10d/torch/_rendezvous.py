"""Rendezvous without environment variables: ranks from MPI, the store in MPI memory.

``init_method="mpi://"`` always does this. ``env://`` (torch's default) does it too when
``MASTER_ADDR`` and ``MASTER_PORT`` are both unset and an MPI launcher (mpiexec, srun) started
the process, where torch's own handler could only fail; otherwise torch's handler runs unchanged.
The store is an ``MPIStore`` (no server, no open port): backend ``"hpc"`` does not need it, and
other backends that do (gloo connecting its pairs) find every key they set.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlparse

__all__ = ["mpi_rendezvous", "env_or_mpi_rendezvous", "close_stores", "SCHEME"]

SCHEME = "mpi"
_MPI_LAUNCHERS = frozenset({"srun", "mpich-hydra", "openmpi", "pmix"})
_DEFAULT_TIMEOUT = timedelta(minutes=30)
# Stores made here. Kept alive for torch's C++ side (see TorchMPIStore), and closed when the
# default group is destroyed (or at exit by MPIStore's own hook): torch drops its reference
# without closing, and a window left to the garbage collector stays allocated until MPI_Finalize.
_stores: list[Any] = []


def _requested(url: str, name: str) -> int:
    """``rank``/``world_size`` that torch put in the URL from init_process_group's arguments (-1: none)."""
    values = parse_qs(urlparse(url).query).get(name)
    return int(values[0]) if values else -1


def mpi_rendezvous(url: str, timeout: timedelta = _DEFAULT_TIMEOUT, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """Yield ``(store, rank, world_size)`` from MPI (torch's rendezvous handler protocol)."""
    from .. import lifecycle
    from ..mpi import bootstrap
    from ..store import MPIStore
    from ._store import TorchMPIStore

    comm = bootstrap.initialize().COMM_WORLD
    lifecycle._check_launcher(comm.Get_size())
    lifecycle._check_against_mpi(_requested(url, "rank"), _requested(url, "world_size"), comm)
    store = TorchMPIStore(MPIStore(comm, timeout=timeout))
    _stores.append(store)
    yield store, comm.Get_rank(), comm.Get_size()
    raise RuntimeError("mpi:// cannot rendezvous again: MPI's world is fixed for the job's lifetime")


def close_stores() -> None:
    """Free the stores this module made (collective over the world, like their creation)."""
    while _stores:
        _stores.pop().mpi_store.close()


def _mpi_launched() -> bool:
    from .. import jobenv

    return jobenv.detect().launcher in _MPI_LAUNCHERS


def env_or_mpi_rendezvous(env_handler: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Wrap torch's ``env://`` handler so that a job started by an MPI launcher with no
    ``MASTER_ADDR``/``MASTER_PORT`` rendezvouses through MPI instead of failing."""

    def handler(url: str, **kwargs: Any) -> Iterator[Any]:
        if "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ and _mpi_launched():
            return mpi_rendezvous(url, **kwargs)
        return env_handler(url, **kwargs)

    handler.wraps_env_handler = env_handler  # type: ignore[attr-defined]
    return handler
