"""hpc_c10d as a torch.distributed backend: ``init_process_group(backend="hpc")`` on MPI.

Installed with hpc_c10d, the backend registers itself when torch is imported (a
``torch.backends`` entry point), so unmodified torch programs (DDP, FSDP, DTensor, DCP) run
under ``mpiexec``/``srun`` with ``backend="hpc"`` and no MASTER_ADDR, port or RANK variables.
Without the entry point (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), call ``hpc_c10d.torch.register()``.

The names below load on first use, and the first one checks that the installed torch is in
``SUPPORTED_TORCH`` (ImportError saying what to install otherwise).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKEND_NAME", "SUPPORTED_TORCH", "ProcessGroupHPC", "TorchMPIStore", "hpc_backend", "register"]

_HOMES = {
    "BACKEND_NAME": "registration", "register": "registration", "ProcessGroupHPC": "process_group",
    "hpc_backend": "process_group",
    "TorchMPIStore": "store", "SUPPORTED_TORCH": "version",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'hpc_c10d.torch' has no attribute {name!r}")
    import importlib

    from .version import require_supported_torch

    require_supported_torch()
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
