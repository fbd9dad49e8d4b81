"""Adapt user arrays (numpy, torch CPU tensors, DLPack, buffers) to numpy views, and check them.

One adaptation point: every collective sees numpy arrays that share memory with what the user
passed, so results land in place. Nothing here copies unless the caller asks for a contiguous
read-only input.

bfloat16 is ml_dtypes', imported on first use: importing ml_dtypes costs about 0.6 s of CPU (it
registers its ufunc loops one at a time), three times the rest of ``import hpc_c10d``, in every
rank of every job. No array has that dtype before something imports ml_dtypes, so waiting loses
nothing.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

__all__ = ["SUPPORTED_DTYPES", "SUPPORTED", "bfloat16_dtype", "is_bfloat16", "supported", "device_type", "as_array",
           "as_input", "as_output", "raise_unsupported", "plain_input", "plain_output"]

#: dtypes every CPU collective supports, by numpy name.
SUPPORTED_DTYPES = (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
)
#: the same, as numpy dtypes: bfloat16 joins once ``bfloat16_dtype`` has loaded ml_dtypes (so the
#: hot paths' membership test stays one set lookup); ``supported`` asks about any dtype.
SUPPORTED: set[np.dtype] = {np.dtype(name) for name in SUPPORTED_DTYPES if name != "bfloat16"}


@functools.cache
def bfloat16_dtype() -> np.dtype:
    """ml_dtypes' bfloat16 (imported here, on the first call), from now on one of ``SUPPORTED``."""
    from ml_dtypes import bfloat16

    dtype = np.dtype(bfloat16)
    SUPPORTED.add(dtype)
    return dtype


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16, without importing ml_dtypes for any other dtype."""
    return dtype.name == "bfloat16" and dtype == bfloat16_dtype()


def supported(dtype: np.dtype) -> bool:
    """Whether the CPU collectives take ``dtype`` (one of ``SUPPORTED_DTYPES``)."""
    return dtype in SUPPORTED or is_bfloat16(dtype)

# DLPack device codes: kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged.
_DLPACK_DEVICE = {1: "cpu", 2: "cuda", 3: "cpu", 13: "cuda"}


def _torch_tensor_type() -> Any:
    """``torch.Tensor`` if torch is imported, else None (Any: its attributes are torch's)."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def device_type(x: Any, name: str | None = None) -> str:
    """Return ``"cpu"`` or ``"cuda"`` for an array-like, or raise TypeError for non-arrays (naming the
    argument ``name`` where given)."""
    if type(x) is np.ndarray:
        return "cpu"
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(x, tensor):
        return "cuda" if x.is_cuda else "cpu" if x.is_cpu else x.device.type
    if isinstance(x, np.ndarray):
        return "cpu"
    # the type's property first: reading cupy's builds the interface's dict every time
    if hasattr(type(x), "__cuda_array_interface__") or hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None:
        code = int(dlpack_device()[0])
        if code in _DLPACK_DEVICE:
            return _DLPACK_DEVICE[code]
        raise TypeError(f"arrays on DLPack device type {code} are not supported (CPU and CUDA are)")
    if isinstance(x, (list, tuple)) or not _has_buffer(x):
        where = f"`{name}`: " if name else ""
        raise TypeError(
            f"{where}expected an array (numpy, torch tensor, DLPack or buffer object), got {type(x).__name__}"
        )
    return "cpu"


def _has_buffer(x: Any) -> bool:
    try:
        memoryview(x).release()
    except TypeError:
        return False
    return True


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    if not t.is_cpu:
        raise TypeError(f"a tensor on {t.device} reached the CPU backend")
    if t.requires_grad:
        t = t.detach()
    dtype = t.dtype
    if dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16_dtype())
    if dtype in (torch.complex64, torch.complex128) and (t.is_conj() or t.is_neg()):
        raise ValueError("tensors with a lazy conj/neg bit must be resolved first (tensor.resolve_conj())")
    return t.numpy()


def as_array(x: Any, name: str = "tensor") -> np.ndarray:
    """Return a numpy view of a CPU array-like, sharing its memory; TypeError for anything else."""
    if type(x) is np.ndarray:
        arr = x
    else:
        tensor = _torch_tensor_type()
        if tensor is not None and isinstance(x, tensor):
            arr = _torch_to_numpy(x)
        elif isinstance(x, np.ndarray):
            arr = x.view(np.ndarray)
        elif hasattr(x, "__dlpack__"):
            arr = np.from_dlpack(x)
        elif not isinstance(x, (list, tuple)) and _has_buffer(x):
            arr = np.asarray(memoryview(x))
        else:
            raise TypeError(
                f"Invalid function argument: expected `{name}` to be an array "
                f"(numpy array, torch tensor, DLPack or buffer object), got {type(x).__name__}"
            )
    if not supported(arr.dtype):
        raise_unsupported(arr.dtype, f"`{name}`")
    return arr


def raise_unsupported(dtype: np.dtype, what: str) -> None:
    """Raise the TypeError for a dtype outside ``SUPPORTED_DTYPES``."""
    raise TypeError(f"{what} has dtype {dtype}, which is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")


def as_input(x: Any, name: str = "tensor") -> np.ndarray:
    """Adapt an array that is only read; a non-contiguous one is copied into a contiguous one."""
    arr = as_array(x, name)
    if arr.flags.c_contiguous:
        return arr
    return np.ascontiguousarray(arr)


def plain_output(x: Any) -> bool:
    """Whether ``x`` is a C-contiguous, writable ndarray of a supported dtype: usable as it is,
    with no adapting and nothing to check (the hot paths' test; one flags object, no calls)."""
    if type(x) is not np.ndarray:
        return False
    flags = x.flags
    return flags.c_contiguous and flags.writeable and x.dtype in SUPPORTED


def plain_input(x: Any) -> bool:
    """Whether ``x`` is a C-contiguous ndarray of a supported dtype (read only: it need not be writable)."""
    return type(x) is np.ndarray and x.flags.c_contiguous and x.dtype in SUPPORTED


def as_output(x: Any, name: str = "tensor", writable: bool = True) -> np.ndarray:
    """Adapt an array the collective writes into: it must be C-contiguous and writable.

    ``writable=False`` is for an array that is written on other ranks but only read here (a
    broadcast's source): it must still be contiguous, so that every rank accepts or refuses the
    same call and no rank is left waiting.
    """
    if plain_output(x):
        return x
    arr = as_array(x, name)
    flags = arr.flags
    if not flags.c_contiguous:
        raise ValueError(
            f"`{name}` must be C-contiguous because the result is written into it in place; "
            "pass a contiguous array (np.ascontiguousarray / tensor.contiguous()) and copy back"
        )
    if writable and not flags.writeable:
        raise ValueError(f"`{name}` is read-only, but the result is written into it in place")
    return arr
