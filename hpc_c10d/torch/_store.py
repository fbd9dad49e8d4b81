"""``TorchMPIStore``: torch's ``Store`` interface over hpc_c10d's ``MPIStore`` (no server, no port)."""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

from ..store import MPIStore

__all__ = ["TorchMPIStore"]

# Store methods that torch's C++ side (PrefixStore, gloo's rendezvous, ...) may call; each is
# forwarded unchanged to the MPIStore, which implements torch's contract for all of them.
_FORWARDED = ("set", "get", "add", "compare_set", "delete_key", "num_keys", "check", "wait", "append",
              "multi_get", "multi_set", "has_extended_api", "queue_push", "queue_pop", "queue_len",
              "list_keys")


def _forward(name: str) -> Callable[..., Any]:
    def method(self: "TorchMPIStore", *args: Any) -> Any:
        return getattr(self.mpi_store, name)(*args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``MPIStore.{name}``."
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


for _name in _FORWARDED:
    setattr(TorchMPIStore, _name, _forward(_name))
del _name
