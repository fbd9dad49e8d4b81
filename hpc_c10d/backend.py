"""Backend names (torch's string enum), ``BackendConfig`` and the transport registry.

``"gloo"`` is an alias of the MPI CPU transport, so tutorial code that asks for gloo runs on
MPI unchanged. ``"nccl"`` names the GPU transport, which is created lazily on a group's first
GPU operation. Nothing else in the package branches on backend names.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable

from .extras import gpu_install_hint
__all__ = ["Backend", "BackendConfig", "transport_factory", "is_backend_available"]

_FORMAT_HINT = "expected '<device>:<backend>[,<device>:<backend>...]', e.g. 'cpu:mpi,cuda:nccl'"

# name -> "module:attribute" of a factory ``(comm, timeout) -> Transport``; imported on first use.
_BUILTIN: dict[str, str] = {
    "mpi": "hpc_c10d.mpi.backend:MPIBackend",
    "gloo": "hpc_c10d.mpi.backend:MPIBackend",
    "nccl": "hpc_c10d.nccl.backend:NCCLBackend",
}
_plugins: dict[str, Callable[..., Any]] = {}


class Backend(str):
    """Backend names; ``Backend("GLOO") == "gloo"``, unknown names come back lower-cased."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    UCC = "ucc"
    XCCL = "xccl"

    backend_list = [UNDEFINED, GLOO, NCCL, MPI]
    default_device_backend_map: dict[str, str] = {"cpu": MPI, "cuda": NCCL}
    backend_capability: dict[str, list[str]] = {GLOO: ["cpu"], MPI: ["cpu"], NCCL: ["cuda"]}

    def __new__(cls, name: str) -> str:  # type: ignore[misc]  # returns a plain str, as torch
        if not isinstance(name, str):
            raise ValueError("Backend constructor parameter must be string-ish")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        return name.lower() if value == Backend.UNDEFINED else value

    @classmethod
    def register_backend(
        cls,
        name: str,
        func: Callable[..., Any],
        extended_api: bool = False,
        devices: str | list[str] | None = None,
    ) -> None:
        """Register ``func(comm, timeout) -> Transport`` under ``name`` for ``devices``.

        Unlike torch, the factory receives the group's MPI communicator instead of a store,
        rank and world size: MPI already knows those.
        """
        if not isinstance(name, str) or not name or ":" in name or "," in name:
            raise ValueError(f"backend name must be a non-empty string without ':' or ',', got {name!r}")
        if not callable(func):
            raise TypeError(f"backend factory for {name!r} must be callable, got {type(func).__name__}")
        key = name.lower()
        if key in _BUILTIN or key in _plugins:
            raise ValueError(f"backend {key!r} is already registered")
        devices = ["cpu"] if devices is None else [devices] if isinstance(devices, str) else list(devices)
        setattr(Backend, name.upper(), key)
        cls.backend_list.append(key)
        cls.backend_capability[key] = devices
        for device in devices:
            cls.default_device_backend_map.setdefault(device, key)
        _plugins[key] = func


class BackendConfig:
    """Which backend serves which device type, parsed from a backend string.

    ``None``/``"undefined"`` gives ``cpu:mpi,cuda:nccl``; a single name maps every device it
    supports (``"gloo"`` -> ``cpu:gloo``); ``"cpu:mpi,cuda:nccl"`` is taken as written.
    """

    def __init__(self, backend: str | None = None) -> None:
        self.device_backend_map: dict[str, str] = {}
        text = Backend.UNDEFINED if backend is None else str(backend)
        if not isinstance(backend, (str, type(None))):
            raise TypeError(f"backend must be a string or None, got {type(backend).__name__}")
        lowered = text.lower()
        if lowered == Backend.UNDEFINED:
            self.device_backend_map = dict(Backend.default_device_backend_map)
        elif lowered in Backend.backend_capability:
            self.device_backend_map = dict.fromkeys(Backend.backend_capability[lowered], Backend(lowered))
        elif ":" in lowered:
            for pair in lowered.split(","):
                parts = [p.strip() for p in pair.split(":")]
                if len(parts) != 2 or not all(parts):
                    raise ValueError(f"invalid device:backend pair {pair!r} in {text!r}; {_FORMAT_HINT}")
                device, name = parts
                if device in self.device_backend_map:
                    raise ValueError(f"device {device!r} appears twice in {text!r}; {_FORMAT_HINT}")
                _require_known(name)
                self.device_backend_map[device] = Backend(name)
        else:
            _require_known(lowered)

    def __repr__(self) -> str:
        return ",".join(f"{device}:{name}" for device, name in self.device_backend_map.items())

    def get_device_backend_map(self) -> dict[str, str]:
        """Return the ``{device type: backend name}`` map."""
        return self.device_backend_map


def _unknown(name: str) -> ValueError:
    known = ", ".join(sorted({*_BUILTIN, *_plugins}))
    return ValueError(f"unknown backend {name!r}; available: {known}, or a device map ({_FORMAT_HINT})")


def _require_known(name: str) -> None:
    if name not in _BUILTIN and name not in _plugins:
        raise _unknown(name)


def transport_factory(name: str) -> Callable[..., Any]:
    """Return the factory for backend ``name``; RuntimeError naming the missing package if any."""
    if name in _plugins:
        return _plugins[name]
    target = _BUILTIN.get(name)
    if target is None:
        raise _unknown(name)
    module_name, attribute = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RuntimeError(
            f"backend {name!r} is not available in this installation ({exc}); "
            f"for GPUs, on a machine with NVIDIA GPUs: {gpu_install_hint()}"
        ) from exc
    return getattr(module, attribute)


def is_backend_available(name: str) -> bool:
    """Return True if backend ``name`` can be created here (never raises)."""
    key = str(name).lower()
    if key in _plugins:
        return True
    target = _BUILTIN.get(key)
    if target is None:
        return False
    try:
        return importlib.util.find_spec(target.split(":")[0]) is not None
    except (ImportError, ValueError):
        return False
