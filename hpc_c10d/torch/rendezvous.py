"""Rendezvous without environment variables: ranks from MPI, the store in MPI memory.

``mpi://`` always does this; ``env://`` does too when an MPI launcher started the process and
``MASTER_ADDR``/``MASTER_PORT`` are unset, and hands out a ``DeferredStore`` when they are set and
torch's rank and world size are the launcher's. Everywhere else torch's handler runs unchanged.
Design: docs/architecture.md, "torch.distributed backend plugin"; use: docs/torch_backend.md.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlparse

__all__ = ["mpi_rendezvous", "env_or_mpi_rendezvous", "claim_for_mpi", "close_stores", "env_store", "SCHEME",
           "STORE_ENV", "world_store", "take_stores"]

SCHEME = "mpi"
STORE_ENV = "HPC_C10D_TORCH_STORE"  # "tcp": torch's TCPStore wherever MASTER_ADDR/MASTER_PORT are set
_MPI_LAUNCHERS = frozenset({"srun", "mpich-hydra", "intel-hydra", "openmpi", "pmix"})
_DEFAULT_TIMEOUT = timedelta(minutes=30)
# Stores made here. Kept alive for torch's C++ side (see TorchMPIStore), and closed when the
# default group is destroyed (or at exit by MPIStore's own hook): torch drops its reference
# without closing, and a window left to the garbage collector stays allocated until MPI_Finalize.
_stores: list[Any] = []
_deferred: list[Any] = []  # DeferredStores made here, kept alive for torch's C++ side


def _requested(url: str, name: str) -> int:
    """``rank``/``world_size`` that torch put in the URL from init_process_group's arguments (-1: none)."""
    values = parse_qs(urlparse(url).query).get(name)
    return int(values[0]) if values else -1


def _mpi_store(url: str, timeout: timedelta) -> Any:
    """A TorchMPIStore over MPI's world (collective), once torch's rank and size in ``url`` are MPI's."""
    from .. import lifecycle
    from ..mpi import bootstrap

    comm = bootstrap.initialize().COMM_WORLD
    lifecycle._check_launcher(comm.Get_size())
    lifecycle._check_against_mpi(_requested(url, "rank"), _requested(url, "world_size"), comm)
    return world_store(comm, timeout)


def mpi_rendezvous(url: str, timeout: timedelta = _DEFAULT_TIMEOUT, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """Yield ``(store, rank, world_size)`` from MPI (torch's rendezvous handler protocol)."""
    store = _mpi_store(url, timeout)
    comm = store.mpi_store.comm
    yield store, comm.Get_rank(), comm.Get_size()
    raise RuntimeError("mpi:// cannot rendezvous again: MPI's world is fixed for the job's lifetime")


def _deferred_rendezvous(url: str, env_handler: Callable[..., Iterator[Any]], rank: int, size: int,
                         timeout: timedelta = _DEFAULT_TIMEOUT, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """Yield ``(DeferredStore, rank, world_size)``: the store is made when it is first needed."""
    from .store import DeferredStore

    def tcp_store() -> Any:
        return next(env_handler(url, timeout=timeout, **kwargs))[0]

    store = DeferredStore(tcp_store, lambda: _mpi_store(url, timeout))
    _deferred.append(store)  # torch's C++ side calls it only while this Python object lives
    yield store, rank, size
    raise RuntimeError("env:// cannot rendezvous again here")


def claim_for_mpi(store: Any) -> None:
    """Backend "hpc" is being made on ``store`` (torch's PrefixStores around the rendezvous's): an
    undecided DeferredStore underneath becomes an MPIStore."""
    from .store import DeferredStore

    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if isinstance(store, DeferredStore):
        store.claim_for_mpi()


def world_store(comm: Any, timeout: timedelta) -> Any:
    """A TorchMPIStore over ``comm`` (collective), closed with the others: a shrunk world's store."""
    from ..store import MPIStore
    from .store import TorchMPIStore

    store = TorchMPIStore(MPIStore(comm, timeout=timeout))
    _stores.append(store)
    return store


def take_stores() -> list[Any]:
    """The stores made here, no longer closed by ``close_stores`` (their world was shrunk)."""
    taken = list(_stores)
    _stores.clear()
    return taken


def close_stores() -> None:
    """Free the stores this module made (collective over the world, like their creation)."""
    while _stores:
        _stores.pop().mpi_store.close()


def _mpi_launched() -> bool:
    from ..job import jobenv

    return jobenv.detect().launcher in _MPI_LAUNCHERS


def _launchers_rank_and_size(url: str) -> tuple[int, int] | None:
    """torch's rank and world size as its ``env://`` handler reads them (the URL, else RANK and
    WORLD_SIZE) where they are the launcher's, an MPI launcher's or torchrun's (there backend "hpc"
    refuses the store with a clear error, naming mpiexec and srun, instead of a hang); None
    elsewhere, or under HPC_C10D_TORCH_STORE=tcp."""
    from ..job import jobenv

    if os.environ.get(STORE_ENV, "").strip().lower() == "tcp":
        return None
    job = jobenv.detect()
    if job.launcher not in _MPI_LAUNCHERS | {"torchrun"}:
        return None
    try:
        rank = _requested(url, "rank") if _requested(url, "rank") >= 0 else int(os.environ["RANK"])
        size = _requested(url, "world_size") if _requested(url, "world_size") >= 0 else int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None  # torch's handler says what is missing
    return (rank, size) if (rank, size) == (job.env_rank, job.env_size) else None


def env_store() -> str:
    """Which store torch's default ``env://`` gives backend "hpc" here, in words (for ``info``)."""
    master = "MASTER_ADDR" in os.environ or "MASTER_PORT" in os.environ
    if not _mpi_launched():
        return "torch's env:// handler (no MPI launcher started this process)"
    if not master:
        return "MPIStore: env:// rendezvouses through MPI (no server, no port)"
    if os.environ.get(STORE_ENV, "").strip().lower() == "tcp":
        return f"torch's TCPStore ({STORE_ENV}=tcp)"
    return ("MPIStore for backend 'hpc' where torch's rank and world size are MPI's (MASTER_ADDR/MASTER_PORT "
            f"unused; other backends get torch's TCPStore; {STORE_ENV}=tcp keeps it for 'hpc')")


def env_or_mpi_rendezvous(env_handler: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Wrap torch's ``env://`` handler: a job started by an MPI launcher rendezvouses through MPI
    when ``MASTER_ADDR``/``MASTER_PORT`` are unset (instead of failing), and gets a store that
    backend "hpc" can claim when they are set (instead of a TCPStore)."""

    def handler(url: str, **kwargs: Any) -> Iterator[Any]:
        if "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ and _mpi_launched():
            return mpi_rendezvous(url, **kwargs)
        launchers = _launchers_rank_and_size(url)
        if launchers is not None:
            return _deferred_rendezvous(url, env_handler, *launchers, **kwargs)
        return env_handler(url, **kwargs)

    handler.wraps_env_handler = env_handler  # type: ignore[attr-defined]
    return handler
