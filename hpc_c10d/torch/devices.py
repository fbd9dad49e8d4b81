"""The backend's name and the device types it serves (cheap: imports neither torch's nor our transports)."""

from __future__ import annotations

import importlib.util

__all__ = ["BACKEND_NAME", "devices"]

BACKEND_NAME = "hpc"


def devices() -> list[str]:
    """The device types backend ``"hpc"`` serves: CPU, and CUDA where the GPU extras (CuPy, with
    NCCL beside it) are installed. Checked without loading either: this runs at ``import torch``."""
    return ["cpu", "cuda"] if importlib.util.find_spec("cupy") is not None else ["cpu"]
