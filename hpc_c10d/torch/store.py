"""``TorchMPIStore``: torch's ``Store`` interface over hpc_c10d's ``MPIStore`` (no server, no port);
``DeferredStore``: the store of an ``env://`` rendezvous that backend "hpc" may still claim."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch.distributed as dist

from ..store import MPIStore

__all__ = ["TorchMPIStore", "DeferredStore"]

# Store methods that torch's C++ side (PrefixStore, gloo's rendezvous, ...) may call; each is
# forwarded unchanged to the MPIStore, which implements torch's contract for all of them.
_FORWARDED = ("set", "get", "add", "compare_set", "delete_key", "num_keys", "check", "wait", "append",
              "multi_get", "multi_set", "has_extended_api", "queue_push", "queue_pop", "queue_len",
              "list_keys")


def _forward(name: str, to: Callable[[Any], Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any) -> Any:
        return getattr(to(self), name)(*args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``{name}`` of the store underneath."
    return method


class TorchMPIStore(dist.Store):
    """A store torch can use (directly or through ``PrefixStore``), kept in MPI memory.

    torch's C++ side reaches these methods only while this Python object lives (a pybind
    trampoline): whoever creates one must keep a reference for as long as torch may use it.
    """

    def __init__(self, store: MPIStore) -> None:
        super().__init__()
        self.mpi_store = store

    def clone(self) -> "TorchMPIStore":
        """Return this store: MPIStore calls are safe from any thread, and a new Python object
        would be collected while C++ still used it (gloo clones the store for its own thread)."""
        return self


class DeferredStore(dist.Store):
    """The store of an ``env://`` rendezvous under an MPI launcher with ``MASTER_ADDR`` and
    ``MASTER_PORT`` set (as Lightning and other frameworks set them), which decides at first use.

    torch runs the rendezvous before any backend exists, and its handlers are not told the
    backend's name. So the store waits: backend "hpc" claims it for MPI when torch creates the
    default group (``claim_for_mpi``: an MPIStore, no server, no port); if anything else uses it
    first (gloo, NCCL), torch's own ``env://`` handler makes its TCPStore then, as it would have
    at the rendezvous. Kept alive by whoever made it, as ``TorchMPIStore``.
    """

    def __init__(self, make_tcp_store: Callable[[], Any], make_mpi_store: Callable[[], Any]) -> None:
        super().__init__()
        self._make = {"TCPStore": make_tcp_store, "MPIStore": make_mpi_store}
        self._lock = threading.Lock()
        self._inner: Any = None
        self.kind = ""  # "MPIStore" or "TCPStore" once decided

    def claim_for_mpi(self) -> None:
        """Make this an MPIStore unless something already made it a TCPStore (collective over
        MPI's world the first time: every rank creates the default group)."""
        self._become("MPIStore")

    def _become(self, kind: str) -> Any:
        with self._lock:
            if self._inner is None:
                from ..diagnostics.logs import configure, logger

                self._inner, self.kind = self._make[kind](), kind
                configure()  # at HPC_C10D_DEBUG=DETAIL the line below comes out
                logger.debug("torch's default store: %s (MASTER_ADDR/MASTER_PORT are set; %s)", kind,
                             "backend 'hpc' claimed it: no server, no port" if kind == "MPIStore"
                             else "another backend used it first")
            return self._inner

    def decided(self) -> Any:
        """The store underneath, made now (a TCPStore) if nobody claimed it yet."""
        return self._inner if self._inner is not None else self._become("TCPStore")

    def clone(self) -> "DeferredStore":
        """Return this store (see ``TorchMPIStore.clone``)."""
        return self


for _name in _FORWARDED:
    setattr(TorchMPIStore, _name, _forward(_name, lambda store: store.mpi_store))
    setattr(DeferredStore, _name, _forward(_name, DeferredStore.decided))
del _name
