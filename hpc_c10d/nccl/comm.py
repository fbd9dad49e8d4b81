"""NCCL communicators bootstrapped over MPI: no TCP store, no MASTER_ADDR.

The group's rank 0 gets a unique ID, MPI broadcasts it and every member joins
(``ncclCommInitRank``); a subgroup whose parent has a communicator is split from it. Before any
rank enters NCCL the members check over MPI that each can join, so all raise the same error
instead of some hanging; that check follows the broadcast, so it also proves every member holds
the ID before any blocks in NCCL. Design: docs/architecture.md, "NCCL transport".
"""

from __future__ import annotations

import ctypes
import socket
import threading
import time
from typing import Any, Callable

from ..errors import DistBackendError
from . import cuda
from .library import SPLIT_NOCOLOR, UNIQUE_ID_BYTES, Nccl, UniqueId

__all__ = ["Communicator", "exchange_unique_id", "check_members", "settle"]


def exchange_unique_id(mpi_comm: Any, nccl: Nccl) -> bytes:
    """Rank 0's fresh NCCL unique ID, on every rank of ``mpi_comm`` (one MPI broadcast)."""
    buf = bytearray(nccl.unique_id() if mpi_comm.Get_rank() == 0 else UNIQUE_ID_BYTES)
    mpi_comm.Bcast(buf, root=0)
    return bytes(buf)


def _describe_device(device: int) -> tuple[str, str | None, str | None]:
    """(host, PCI bus id or None, why this rank cannot join or None)."""
    host = socket.gethostname()
    try:
        count, why_none = cuda.visible_devices()
    except DistBackendError as exc:  # told to every rank below, so none waits in ncclCommInitRank
        return host, None, str(exc)
    if count == 0:
        return host, None, f"no CUDA device is visible ({why_none})"
    if not 0 <= device < count:
        return host, None, f"device {device} does not exist ({count} visible)"
    return host, cuda.pci_bus_id(device), None


def check_members(mpi_comm: Any, device: int, what: str, version: tuple[int, int, int]) -> None:
    """Collective: raise the same error on every rank unless each member has its own GPU and every
    member loaded the same NCCL release (NCCL's wire protocol is not promised across releases)."""
    notes = mpi_comm.allgather((*_describe_device(device), version))
    problems = [f"rank {r} on {host}: {why}" for r, (host, _, why, _) in enumerate(notes) if why]
    if problems:
        raise DistBackendError(f"cannot create the NCCL communicator for {what}: " + "; ".join(problems))
    releases: dict[tuple[int, int, int], list[int]] = {}
    for r, (*_, release) in enumerate(notes):
        releases.setdefault(release, []).append(r)
    if len(releases) > 1:
        found = "; ".join(f"NCCL {'.'.join(map(str, v))} on ranks {ranks}" for v, ranks in sorted(releases.items()))
        raise DistBackendError(f"cannot create the NCCL communicator for {what}: the ranks loaded different NCCL "
                               f"releases ({found}); install one nvidia-nccl release everywhere, or point "
                               "HPC_C10D_NCCL_LIBRARY at the same libnccl.so.2 on every node")
    owners: dict[tuple[str, str | None], list[int]] = {}
    for r, (host, bus, _, _) in enumerate(notes):
        owners.setdefault((host, bus), []).append(r)
    shared = [f"ranks {ranks} share GPU {bus} on {host}" for (host, bus), ranks in owners.items() if len(ranks) > 1]
    if shared:  # NCCL's "Duplicate GPU detected", which torch raises as DistBackendError, said before NCCL starts
        raise DistBackendError(f"{what}: two ranks of one NCCL communicator must not use the same GPU "
                               f"({'; '.join(shared)}); bind one GPU per rank (hpc_c10d.nccl.bind_local_device(), "
                               "or srun --gpus-per-task=1)")


IN_PROGRESS = 7  # ncclInProgress: a nonblocking communicator is still working on the call
_POLL_S = 1e-4
_ABORT_LOCK_S = 2.0  # how long an abort from another thread waits for the communicator's lock


def settle(nccl: Nccl, handle: int, result: int, what: str, timeout_s: float | None) -> None:
    """Raise for a failed NCCL call; wait out ``ncclInProgress`` first.

    NCCL_COMM_BLOCKING=0 in the environment makes every communicator nonblocking whatever the
    caller asked for: init, split, collectives and ncclGroupEnd then return ncclInProgress, and
    the communicator's state must be polled until the call has finished (or failed).
    """
    state = ctypes.c_int(result)
    if state.value == IN_PROGRESS:

        def finished() -> bool:
            nccl.check(nccl.ncclCommGetAsyncError(handle, ctypes.byref(state)), "ncclCommGetAsyncError")
            return state.value != IN_PROGRESS

        _poll(finished, timeout_s, f"NCCL call {what} was still in progress after")
    nccl.check(state.value, what)


def _poll(done: Callable[[], bool], timeout_s: float | None, late: str) -> None:
    """Call ``done`` every ``_POLL_S`` until it says True; DistBackendError ``late`` past
    ``timeout_s`` (None: no limit)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not done():
        if deadline is not None and time.monotonic() > deadline:
            raise DistBackendError(f"{late} {timeout_s:g} s")
        time.sleep(_POLL_S)


class Communicator:
    """One NCCL communicator on one device, with the stream its operations run on.

    ``lock`` is held around every use of the handle: the watchdog thread may abort the
    communicator while the main thread enqueues, and NCCL frees the handle in
    ``ncclCommAbort``. ``state`` is ``"live"``, then ``"aborted"`` or ``"destroyed"``.
    """

    def __init__(self, nccl: Nccl, handle: ctypes.c_void_p, device: int, rank: int, size: int,
                 timeout_s: float | None = None) -> None:
        self.nccl = nccl
        self.handle: int = handle.value or 0  # ncclComm_t; 0 for NULL
        self.device = device
        self.rank = rank
        self.size = size
        self.timeout_s = timeout_s
        self.stream = cuda.new_stream(device)
        with cuda.device_guard(device):  # recorded on the caller's stream before each operation: a
            self.ready = cuda.new_event()  # wait takes the event as last recorded, so one serves all (as in torch)
        self.lock = threading.RLock()  # re-entered by a split made under the group's agreement
        self.state = "live"

    @classmethod
    def from_mpi(cls, nccl: Nccl, mpi_comm: Any, device: int, what: str,
                 timeout_s: float | None = None) -> "Communicator":
        """Collective over ``mpi_comm``: every member joins one new communicator."""
        uid = UniqueId.from_buffer_copy(exchange_unique_id(mpi_comm, nccl))
        check_members(mpi_comm, device, what, nccl.version)  # after the ID: every member has received it
        handle = ctypes.c_void_p()
        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        with cuda.device_guard(device):
            result = nccl.ncclCommInitRank(ctypes.byref(handle), size, uid, rank)
            settle(nccl, handle.value or 0, result, f"ncclCommInitRank ({what})", timeout_s)
        return cls(nccl, handle, device, rank, size, timeout_s)

    def refuse_unless_live(self, what: str) -> None:
        """DistBackendError unless the communicator can still be used (call with ``lock`` held)."""
        if self.state != "live":
            raise DistBackendError(f"{what}: the NCCL communicator on cuda:{self.device} was {self.state}; "
                                   "create a new group to go on")

    def run(self, result: int, what: str) -> None:
        """Check the result of a call just made on this communicator (``lock`` held)."""
        settle(self.nccl, self.handle, result, what, self.timeout_s)

    def split(self, color: int | None, key: int, size: int) -> "Communicator | None":
        """Collective over this communicator: members with ``color`` form a new one (None: not a member)."""
        handle = ctypes.c_void_p()
        with self.lock, cuda.device_guard(self.device):
            self.refuse_unless_live("ncclCommSplit")
            result = self.nccl.ncclCommSplit(self.handle, SPLIT_NOCOLOR if color is None else color, key,
                                             ctypes.byref(handle), None)
            settle(self.nccl, self.handle, result, "ncclCommSplit", self.timeout_s)  # nonblocking: the parent reports
            if color is not None:
                settle(self.nccl, self._split_handle(handle), IN_PROGRESS, "ncclCommSplit (new communicator)",
                       self.timeout_s)
        return None if color is None else Communicator(self.nccl, handle, self.device, key, size, self.timeout_s)

    def _split_handle(self, handle: ctypes.c_void_p) -> int:
        """The new communicator of a split, once NCCL has written it: a nonblocking split (and
        NCCL 2.28's) stores the handle from its background job, after the call has returned."""
        _poll(lambda: bool(handle.value), self.timeout_s, "ncclCommSplit gave no new communicator within")
        return handle.value or 0

    def async_error(self, wait: bool = True) -> str | None:
        """NCCL's asynchronous error for this communicator, as text, or None; with ``wait=False``
        also None while another thread is inside a call on it (the watchdog asks again later)."""
        if not self.lock.acquire(blocking=wait):
            return None
        try:
            if self.state == "aborted":
                return "the communicator was aborted"
            if self.state == "destroyed":  # destroy() finished every operation first
                return None
            result = ctypes.c_int()
            self.nccl.check(self.nccl.ncclCommGetAsyncError(self.handle, ctypes.byref(result)),
                            "ncclCommGetAsyncError")
        finally:
            self.lock.release()
        if result.value in (0, IN_PROGRESS):
            return None
        try:
            self.nccl.check(result.value, "an operation in flight")
        except DistBackendError as exc:
            return str(exc)
        return None

    def abort(self) -> None:
        """Stop every operation in flight and free the communicator (it cannot be used again).

        Safe from another thread: it waits (briefly) for a call the owner is making to return,
        and raises DistBackendError if that call does not return.
        """
        if not self.lock.acquire(timeout=_ABORT_LOCK_S):
            raise DistBackendError(f"cannot abort the NCCL communicator on cuda:{self.device}: a call on it has "
                                   f"not returned for {_ABORT_LOCK_S:g} s")
        try:
            if self.handle and self.state == "live":
                self.state = "aborted"
                self.nccl.check(self.nccl.ncclCommAbort(self.handle), "ncclCommAbort")
        finally:
            self.lock.release()

    def destroy(self) -> None:
        """Free the communicator once its operations have finished (the caller waits for them; an
        intra-node collective in NCCL). A communicator with an error pending is aborted instead,
        and the error raised: NCCL can hang destroying one (2.28)."""
        with self.lock:
            if self.handle and self.state == "live":
                pending = ctypes.c_int()
                result = self.nccl.ncclCommGetAsyncError(self.handle, ctypes.byref(pending))
                if result == 0 and pending.value not in (0, IN_PROGRESS):
                    self.state = "aborted"
                    self.nccl.ncclCommAbort(self.handle)
                    self.nccl.check(pending.value, "an operation in flight (found by ncclCommDestroy)")
                result = result or self.nccl.ncclCommDestroy(self.handle)
                self.state = "destroyed" if result == 0 else "aborted"
                if result != 0:
                    self.nccl.ncclCommAbort(self.handle)
                self.nccl.check(result, "ncclCommDestroy")
