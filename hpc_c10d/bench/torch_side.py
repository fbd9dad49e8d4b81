"""torch.distributed beside MPI, for comparison: one host or many, TCPStore, tensor views."""

from __future__ import annotations

import importlib
import os
import socket
from datetime import timedelta
from typing import Any

import numpy as np

from .optional import unimportable

__all__ = ["torch_missing", "single_host", "rendezvous", "tcp_store", "as_tensor"]


def torch_missing() -> str | None:
    """Why torch.distributed cannot run in this process (None: it can)."""
    problem = unimportable("torch.distributed", "torch")
    if problem is None and not importlib.import_module("torch.distributed").is_available():
        return "torch.distributed is not available in this torch build"
    return problem


def single_host(comm: Any) -> str | None:
    """This job's one host name, or None when its ranks span hosts. On one host, gloo is pointed at
    the loopback interface (``GLOO_SOCKET_IFNAME=lo``, unless set): the host name may not resolve."""
    hosts = comm.allgather(socket.gethostname())
    if len(set(hosts)) > 1:
        return None
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return hosts[0]


def rendezvous(comm: Any) -> tuple[str, int]:
    """A host and free port on rank 0, chosen there and broadcast over MPI (what torch's env:// needs)."""
    host = "127.0.0.1" if single_host(comm) else socket.gethostname()
    host = comm.bcast(host, root=0)
    port = None
    if comm.Get_rank() == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host if host == "127.0.0.1" else "", 0))
            port = probe.getsockname()[1]
    return host, comm.bcast(port, root=0)


def tcp_store(comm: Any, use_libuv: bool | None) -> Any:
    """A TCPStore with its server on rank 0, every rank a client."""
    import torch.distributed as tdist

    host, port = rendezvous(comm)
    options = {} if use_libuv is None else {"use_libuv": use_libuv}
    return tdist.TCPStore(host, port, comm.Get_size(), is_master=comm.Get_rank() == 0,
                          timeout=timedelta(seconds=300), wait_for_workers=True, **options)


def as_tensor(array: Any) -> Any:
    """A torch tensor sharing ``array``'s memory (numpy, bfloat16 included, or a CUDA array via DLPack)."""
    import torch

    if not isinstance(array, np.ndarray):
        return torch.from_dlpack(array)
    if array.dtype.kind == "V":  # ml_dtypes bfloat16: same bits, reinterpreted
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
