"""Which GPU a rank uses: the node-local rank modulo the GPUs this process can see.

MPI's shared-memory split gives the node-local rank, so no launcher variable is needed. When
SLURM narrows ``CUDA_VISIBLE_DEVICES`` to one GPU per task (``--gpus-per-task=1``), every
rank sees a single device 0 and the formula still picks it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import cuda

__all__ = ["local_device", "bind_local_device", "device_index"]


def local_device(node_local_rank: int, visible: int) -> int:
    """The device for ``node_local_rank`` among ``visible`` GPUs; RuntimeError if there are none."""
    if visible < 1:
        raise RuntimeError("no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES and the "
                           "job's GPU request, e.g. srun --gpus-per-task=1)")
    return node_local_rank % visible


def _no_default_group() -> int | None:
    return None


#: This rank's node-local rank in the default group, or None while there is none. The package
#: installs it (``lifecycle``), as it hands each group its transports: nothing in ``nccl/`` reads
#: the package's state.
node_local_rank: Callable[[], int | None] = _no_default_group


def bind_local_device() -> int:
    """Make this rank's GPU current (in CuPy, and in torch if it is imported) and return its index.

    Call after ``init_process_group()``; pass the result as ``device_id`` to bind NCCL eagerly.
    """
    local_rank = node_local_rank()
    if local_rank is None:
        raise ValueError("bind_local_device() needs the default process group: call init_process_group() first")
    device = local_device(local_rank, cuda.device_count())
    cuda.cupy().cuda.Device(device).use()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.set_device(device)
    return device


def device_index(device_id: Any) -> int:
    """A CUDA device index from an int, ``"cuda:N"``, a torch.device or a cupy Device."""
    if isinstance(device_id, bool):
        raise TypeError(f"device_id must be a CUDA device, got {device_id!r}")
    if isinstance(device_id, int):
        index = device_id
    elif isinstance(device_id, str) or getattr(device_id, "type", None) is not None:
        text = str(device_id)
        kind, _, number = text.partition(":")
        if kind != "cuda":
            raise ValueError(f"device_id must be a CUDA device, got {text!r}")
        index = int(number) if number else cuda.cupy().cuda.runtime.getDevice()
    elif isinstance(getattr(device_id, "id", None), int):  # cupy.cuda.Device
        index = device_id.id
    else:
        raise TypeError(f"device_id must be an int, 'cuda:N', a torch.device or a cupy Device, got {device_id!r}")
    if index < 0:
        raise ValueError(f"device_id must be a non-negative CUDA device index, got {index}")
    return index
