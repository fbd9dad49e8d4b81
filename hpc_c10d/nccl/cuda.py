"""CUDA streams and events for the NCCL backend, through CuPy (imported on first GPU use).

Torch tensors need no CuPy objects of their own: their stream is read from torch as a raw
handle and wrapped, so one code path serves cupy arrays, torch tensors and other producers.
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import DistBackendError
from ..extras import gpu_install_hint
from .buffers import DeviceBuffer

__all__ = ["cupy", "caller_stream", "new_stream", "new_event", "event_passed", "device_guard",
           "runtime_error", "cuda_error", "device_count", "visible_devices", "pci_bus_id"]

_LEGACY_DEFAULT, _PER_THREAD_DEFAULT = 1, 2  # __cuda_array_interface__ stream codes
_CUDA_STREAM_PER_THREAD = 2  # cudaStreamPerThread
_NOT_READY = 600  # cudaErrorNotReady: what cudaEventQuery says of an event the GPU has not passed yet
_NO_GPU_HERE = (35, 100)  # cudaErrorInsufficientDriver (no driver), cudaErrorNoDevice


@functools.cache  # on every GPU call's path: an import statement costs more than the cache
def cupy() -> Any:
    """The cupy module; RuntimeError naming the extra to install when it is missing."""
    try:
        import cupy as module
    except ImportError as exc:
        raise RuntimeError(f"the NCCL backend uses CuPy for streams and events: {gpu_install_hint()}") from exc
    return module


class _RawStream:
    """A raw ``cudaStream_t`` speaking the CUDA stream protocol (for ``Stream.from_external``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.ptr


_external: dict[tuple[int, int], Any] = {}


def _wrap(ptr: int, device: int) -> Any:
    """A cupy Stream object for someone else's stream handle (cached: it is made once per stream)."""
    stream = _external.get((ptr, device))
    if stream is None:
        streams = cupy().cuda
        if hasattr(streams.Stream, "from_external"):  # CuPy 14 deprecates ExternalStream
            stream = streams.Stream.from_external(_RawStream(ptr))
        else:
            stream = streams.ExternalStream(ptr, device)
        _external[(ptr, device)] = stream
    return stream


@functools.cache
def _torch_raw_stream() -> Any:
    """device -> torch's current ``cudaStream_t`` there, as an int: the call torch.compile's code
    makes (``torch.cuda.current_stream()`` builds a Stream object on every call)."""
    import torch

    return getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda device: torch.cuda.current_stream(device).cuda_stream)


def caller_stream(buf: DeviceBuffer) -> Any:
    """The stream the caller queues work on for ``buf``: torch's or cupy's current stream, or the
    one an array interface names (its legacy default stream when it names none)."""
    if buf.kind == "torch":
        return _wrap(_torch_raw_stream()(buf.device), buf.device)
    if buf.kind == "cupy":
        return cupy().cuda.get_current_stream(buf.device)
    hint = buf.stream_hint
    ptr = 0 if hint in (None, _LEGACY_DEFAULT) else _CUDA_STREAM_PER_THREAD if hint == _PER_THREAD_DEFAULT else hint
    return _wrap(ptr, buf.device)


def runtime_error() -> type[Exception]:
    """CuPy's CUDARuntimeError: what a failing event, stream or device call raises."""
    return cupy().cuda.runtime.CUDARuntimeError


def cuda_error(error: Any) -> DistBackendError:
    """DistBackendError for a CUDA status code or a CuPy CUDARuntimeError."""
    runtime = cupy().cuda.runtime
    text = str(error if isinstance(error, Exception) else runtime.CUDARuntimeError(error))
    return DistBackendError(f"CUDA error: {text} (CUDA errors are sticky: this process's GPU context can no "
                            "longer be used)")


def event_passed(event: Any) -> bool:
    """True once the GPU has passed ``event``, False while it has not; DistBackendError when the
    GPU failed before it (CuPy's ``Event.done`` reads such a failure as "not yet", forever)."""
    runtime = cupy().cuda.runtime
    try:
        status = runtime.eventQuery(event.ptr)
    except runtime.CUDARuntimeError as exc:
        raise cuda_error(exc) from exc
    if status == 0:
        return True
    if status == _NOT_READY:
        return False
    raise cuda_error(status)


def device_guard(device: int) -> Any:
    """A context manager that makes ``device`` current."""
    return cupy().cuda.Device(device)


def new_stream(device: int) -> Any:
    """A non-blocking stream on ``device`` for one communicator's operations."""
    with device_guard(device):
        return cupy().cuda.Stream(non_blocking=True)


def new_event() -> Any:
    """An event without timing (cheapest to record and query), on the current device."""
    return cupy().cuda.Event(disable_timing=True)


def visible_devices() -> tuple[int, str]:
    """(visible CUDA devices, why there are none: '' when there are some).

    No CuPy, no driver and no device each mean 0 devices, with the reason; any other CUDA
    failure (a broken install, a GPU in a bad state) is raised as DistBackendError, so a GPU
    machine never passes for a CPU one."""
    try:
        module = cupy()
    except RuntimeError as exc:
        return 0, str(exc)
    runtime = module.cuda.runtime
    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        if exc.status in _NO_GPU_HERE:
            return 0, str(exc)
        raise cuda_error(exc) from exc
    return count, "" if count else "the CUDA driver sees no device"


def device_count() -> int:
    """Visible CUDA devices (0 when there is no CuPy, no driver or no GPU)."""
    return visible_devices()[0]


def pci_bus_id(device: int) -> str:
    """The PCI bus id of ``device``: the same physical GPU gives the same id in every process."""
    return cupy().cuda.runtime.deviceGetPCIBusId(device)
