"""GPU arrays as NCCL sees them: a device pointer, an element count, a dtype and a device.

Accepted: cupy arrays, torch CUDA tensors (bfloat16 included, read straight from the tensor so
cupy need not know the dtype), anything with ``__cuda_array_interface__`` (numba, JAX, ...)
and CUDA DLPack producers. A ``DeviceBuffer`` keeps the user's object alive and remembers whose
stream the caller is on (torch's, cupy's, or the one the array interface names), because the
collective must wait for work already queued there.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from ..arrays import bfloat16_dtype, raise_unsupported, supported

__all__ = ["FLOAT8_NAMES", "float8_dtypes", "device_supported", "DeviceBuffer", "as_device_buffer",
           "contiguous_input"]

#: torch's float8 dtypes, by their name in torch and ml_dtypes: GPU tensors only (MPI has no such types).
FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


@functools.cache
def float8_dtypes() -> dict[str, np.dtype]:
    """ml_dtypes' float8 dtypes by name (ml_dtypes loads here: hpc_c10d/arrays.py says why not before)."""
    import ml_dtypes

    return {name: np.dtype(getattr(ml_dtypes, name)) for name in FLOAT8_NAMES}


def device_supported(dtype: np.dtype) -> bool:
    """Whether NCCL collectives take ``dtype``: the CPU collectives' dtypes and torch's float8 ones."""
    return supported(dtype) or (dtype.name in FLOAT8_NAMES and dtype == float8_dtypes()[dtype.name])


class DeviceBuffer:
    """One GPU array: ``ptr`` to ``size`` elements of ``dtype`` on CUDA device ``device``."""

    __slots__ = ("ptr", "size", "dtype", "shape", "device", "owner", "kind", "stream_hint", "contiguous",
                 "readonly")

    def __init__(self, ptr: int, size: int, dtype: np.dtype, shape: tuple, device: int, owner: Any,
                 kind: str, contiguous: bool, readonly: bool = False, stream_hint: int | None = None) -> None:
        self.ptr = ptr
        self.size = size
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.owner = owner
        self.kind = kind  # "torch", "cupy" or "cai": whose current stream the caller is on
        self.contiguous = contiguous
        self.readonly = readonly
        self.stream_hint = stream_hint  # the stream a __cuda_array_interface__ producer named

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def end(self) -> int:
        """The address one past the last byte."""
        return self.ptr + self.nbytes

    def __repr__(self) -> str:
        return f"<DeviceBuffer {self.dtype}{list(self.shape)} on cuda:{self.device} at {self.ptr:#x}>"


_CUDA_DLPACK_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged
_torch_dtypes: dict[Any, np.dtype] = {}


def _torch_dtype(dtype: Any) -> np.dtype:
    found = _torch_dtypes.get(dtype)
    if found is None:
        import torch

        name = str(dtype).removeprefix("torch.")
        if dtype is torch.bfloat16:
            found = bfloat16_dtype()
        elif name in FLOAT8_NAMES:
            found = float8_dtypes()[name]
        else:
            try:
                found = torch.empty(0, dtype=dtype).numpy().dtype
            except TypeError as exc:
                raise TypeError(f"torch dtype {dtype} is not supported by the NCCL backend") from exc
        _torch_dtypes[dtype] = found
    return found


def _from_torch(t: Any) -> DeviceBuffer:
    dtype = _torch_dtype(t.dtype)
    if t.is_conj() or t.is_neg():
        raise ValueError("tensors with a lazy conj/neg bit must be resolved first (tensor.resolve_conj())")
    return DeviceBuffer(t.data_ptr(), t.numel(), dtype, tuple(t.shape), t.get_device(), t, "torch",
                        t.is_contiguous())


def _from_cupy(a: Any) -> DeviceBuffer:
    return DeviceBuffer(a.data.ptr, a.size, a.dtype, a.shape, a.device.id, a, "cupy", a.flags.c_contiguous)


def _c_contiguous(shape: tuple, strides: tuple | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent > 1 and stride != expected:
            return False
        expected *= extent
    return True


def _from_interface(x: Any) -> DeviceBuffer:
    info = x.__cuda_array_interface__
    ptr, readonly = info["data"]
    shape = tuple(info["shape"])
    dtype = np.dtype(info["typestr"])
    size = int(np.prod(shape, dtype=np.int64))
    from cupy.cuda import runtime

    device = runtime.pointerGetAttributes(ptr).device if ptr else runtime.getDevice()
    return DeviceBuffer(ptr, size, dtype, shape, device, x, "cai",
                        _c_contiguous(shape, info.get("strides"), dtype.itemsize), bool(readonly),
                        info.get("stream"))


def _from_dlpack(x: Any) -> DeviceBuffer:
    torch = sys.modules.get("torch")
    if torch is not None:
        return _from_torch(torch.from_dlpack(x))
    import cupy

    return _from_cupy(cupy.from_dlpack(x))


def as_device_buffer(x: Any, name: str = "tensor") -> DeviceBuffer:
    """Describe a GPU array without copying it; TypeError for anything else or an unsupported dtype."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if not x.is_cuda:
            raise TypeError(f"`{name}` is a tensor on {x.device}, but this operation runs on CUDA devices")
        buf = _from_torch(x)
    elif type(x).__module__.startswith("cupy"):
        buf = _from_cupy(x)
    elif hasattr(x, "__cuda_array_interface__"):
        buf = _from_interface(x)
    elif hasattr(x, "__dlpack__") and int(x.__dlpack_device__()[0]) in _CUDA_DLPACK_DEVICES:
        buf = _from_dlpack(x)
    else:
        raise TypeError(f"Invalid function argument: expected `{name}` to be a CUDA array (cupy, torch CUDA "
                        f"tensor, __cuda_array_interface__ or DLPack), got {type(x).__name__}")
    if not device_supported(buf.dtype):
        raise_unsupported(buf.dtype, f"`{name}`")
    return buf


def contiguous_input(buf: DeviceBuffer) -> DeviceBuffer:
    """``buf``, or a contiguous copy of it made on the caller's stream (torch and cupy arrays)."""
    if buf.contiguous:
        return buf
    if buf.kind == "torch":
        return _from_torch(buf.owner.contiguous())
    if buf.kind == "cupy":
        import cupy

        with cupy.cuda.Device(buf.device):
            return _from_cupy(cupy.ascontiguousarray(buf.owner))
    raise ValueError(f"{buf!r} is not C-contiguous; pass a contiguous array")
