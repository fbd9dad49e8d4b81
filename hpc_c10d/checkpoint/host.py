"""Arrays to and from host memory: device arrays (cupy, torch CUDA) are staged through the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import arrays

__all__ = ["to_host", "cpu_view", "fill"]


def to_host(value: Any) -> np.ndarray:
    """A C-contiguous numpy array with ``value``'s contents (a view when it already is one)."""
    if arrays.device_type(value) == "cuda":
        if hasattr(value, "get"):  # cupy
            return np.ascontiguousarray(value.get())
        value = value.detach().cpu()  # torch
    return np.ascontiguousarray(arrays.as_array(value))


def cpu_view(target: Any) -> np.ndarray | None:
    """A numpy view of a CPU ``target`` (sharing its memory); None for a device array."""
    return None if arrays.device_type(target) == "cuda" else arrays.as_array(target)


def fill(target: Any, host: np.ndarray) -> None:
    """Copy ``host`` into a device ``target`` in place."""
    if hasattr(target, "set"):  # cupy
        target.set(host)
        return
    import torch

    source = torch.from_numpy(host.view(np.int16)).view(torch.bfloat16) if arrays.is_bfloat16(host.dtype) \
        else torch.from_numpy(host)
    target.copy_(source)
