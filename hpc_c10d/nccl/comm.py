"""NCCL communicators bootstrapped over MPI: no TCP store, no MASTER_ADDR.

The group's rank 0 asks NCCL for a unique ID, MPI broadcasts its 128 bytes over the group's
communicator and every member joins with ``ncclCommInitRank``. A subgroup created while its
parent's communicator exists is split from it (``ncclCommSplit``, NCCL >= 2.18), which reuses
the parent's topology work; otherwise it gets a fresh ID of its own.

Before any rank enters NCCL, the members compare notes over MPI (does each have a GPU, which
physical GPU is it): if one cannot join, every rank raises the same error instead of the
others hanging in ``ncclCommInitRank``.
"""

from __future__ import annotations

import ctypes
import socket
from typing import Any

from ..errors import DistBackendError
from . import cuda
from .library import SPLIT_NOCOLOR, UNIQUE_ID_BYTES, Nccl, UniqueId

__all__ = ["Communicator", "exchange_unique_id", "check_members"]


def exchange_unique_id(mpi_comm: Any, nccl: Nccl) -> bytes:
    """Rank 0's fresh NCCL unique ID, on every rank of ``mpi_comm`` (one MPI broadcast)."""
    buf = bytearray(nccl.unique_id() if mpi_comm.Get_rank() == 0 else UNIQUE_ID_BYTES)
    mpi_comm.Bcast(buf, root=0)
    return bytes(buf)


def _describe_device(device: int) -> tuple[str, str | None, str | None]:
    """(host, PCI bus id or None, why this rank cannot join or None)."""
    host = socket.gethostname()
    count = cuda.device_count()
    if count == 0:
        return host, None, "no CUDA device is visible"
    if not 0 <= device < count:
        return host, None, f"device {device} does not exist ({count} visible)"
    return host, cuda.pci_bus_id(device), None


def check_members(mpi_comm: Any, device: int, what: str) -> None:
    """Collective: raise the same error on every rank unless each member has its own GPU."""
    notes = mpi_comm.allgather(_describe_device(device))
    problems = [f"rank {r} on {host}: {why}" for r, (host, _, why) in enumerate(notes) if why]
    if problems:
        raise DistBackendError(f"cannot create the NCCL communicator for {what}: " + "; ".join(problems))
    owners: dict[tuple[str, str | None], list[int]] = {}
    for r, (host, bus, _) in enumerate(notes):
        owners.setdefault((host, bus), []).append(r)
    shared = [f"ranks {ranks} share GPU {bus} on {host}" for (host, bus), ranks in owners.items() if len(ranks) > 1]
    if shared:
        raise ValueError(f"{what}: two ranks of one NCCL communicator must not use the same GPU ({'; '.join(shared)})"
                         "; bind one GPU per rank (hpc_c10d.nccl.bind_local_device(), or srun --gpus-per-task=1)")


class Communicator:
    """One NCCL communicator on one device, with the stream its operations run on."""

    def __init__(self, nccl: Nccl, handle: ctypes.c_void_p, device: int, rank: int, size: int) -> None:
        self.nccl = nccl
        self.handle: int = handle.value or 0  # ncclComm_t; 0 for NULL
        self.device = device
        self.rank = rank
        self.size = size
        self.stream = cuda.new_stream(device)
        self.aborted = False

    @classmethod
    def from_mpi(cls, nccl: Nccl, mpi_comm: Any, device: int, what: str) -> "Communicator":
        """Collective over ``mpi_comm``: every member joins one new communicator."""
        check_members(mpi_comm, device, what)
        uid = UniqueId.from_buffer_copy(exchange_unique_id(mpi_comm, nccl))
        handle = ctypes.c_void_p()
        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        with cuda.device_guard(device):
            nccl.check(nccl.ncclCommInitRank(ctypes.byref(handle), size, uid, rank), f"ncclCommInitRank ({what})")
        return cls(nccl, handle, device, rank, size)

    def split(self, color: int | None, key: int, size: int) -> "Communicator | None":
        """Collective over this communicator: members with ``color`` form a new one (None: not a member)."""
        handle = ctypes.c_void_p()
        with cuda.device_guard(self.device):
            self.nccl.check(self.nccl.ncclCommSplit(self.handle, SPLIT_NOCOLOR if color is None else color, key,
                                                    ctypes.byref(handle), None), "ncclCommSplit")
        return None if color is None else Communicator(self.nccl, handle, self.device, key, size)

    def async_error(self) -> str | None:
        """NCCL's asynchronous error for this communicator, as text, or None."""
        if self.aborted:
            return "the communicator was aborted"
        result = ctypes.c_int()
        self.nccl.check(self.nccl.ncclCommGetAsyncError(self.handle, ctypes.byref(result)), "ncclCommGetAsyncError")
        if result.value == 0:
            return None
        try:
            self.nccl.check(result.value, "an operation in flight")
        except DistBackendError as exc:
            return str(exc)
        return None

    def abort(self) -> None:
        """Stop every operation in flight and free the communicator (it cannot be used again)."""
        if self.handle and not self.aborted:
            self.aborted = True
            self.nccl.check(self.nccl.ncclCommAbort(self.handle), "ncclCommAbort")

    def destroy(self) -> None:
        """Free the communicator after its operations finish."""
        if self.handle and not self.aborted:
            self.aborted = True
            self.nccl.check(self.nccl.ncclCommDestroy(self.handle), "ncclCommDestroy")
