"""The NCCL transport: GPU collectives on communicators bootstrapped over MPI.

``library`` binds libnccl with ctypes, ``comm`` creates communicators from an MPI-broadcast
unique ID (or splits them), ``buffers`` reads cupy arrays, torch CUDA tensors and other CUDA
arrays, ``cuda`` holds the stream and event calls, ``backend`` runs the operations with
ProcessGroupNCCL's stream semantics and ``work`` tracks them. Nothing here imports CuPy or
torch until a GPU array arrives.
"""

from .device import bind_local_device, local_device
from .library import available

__all__ = ["available", "bind_local_device", "local_device"]
