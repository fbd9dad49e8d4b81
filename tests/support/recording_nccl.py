"""A recording stand-in, not NCCL: it checks our multi-rank agreement and layout logic; it never moves
data and is never reported as a GPU test.

``RecordingNccl`` stands in for the ctypes binding ``hpc_c10d.nccl.library.Nccl``: every ``nccl*`` entry
point appends a ``Call`` (its name and meaningful arguments, pointers as ints) to ``calls`` and returns
ncclSuccess unless a test asked for a failure (``fail``). ``install`` puts it in place of the library and
replaces the few CUDA calls of ``hpc_c10d.nccl.cuda`` with recording objects (``RecordingCuda``): streams
and events are numbers, device memory is never touched, device-to-device copies are recorded in the same
``calls`` list as ``Call("copy", ...)``. Each MPI rank has its own stand-in; tests gather what the ranks
recorded with MPI and compare.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

import hpc_c10d.nccl as nccl_package
from hpc_c10d.diagnostics.watchdog import Watchdog
from hpc_c10d.errors import DistBackendError
from hpc_c10d.nccl import cuda, library
from hpc_c10d.nccl.buffers import DeviceBuffer
from hpc_c10d.nccl.library import _OPTIONAL, _PROTOTYPES, SPLIT_NOCOLOR, UNIQUE_ID_BYTES, DataType, Nccl

__all__ = ["Call", "RecordingNccl", "RecordingCuda", "FakeStream", "FakeEvent", "FakeCudaError", "install",
           "fake_buffer", "uid_digest", "ENQUEUED", "QUERIES"]

# entry point -> names of its arguments, in order; "out" is a pointer NCCL writes through (not recorded)
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "ncclGetVersion": ("out",),
    "ncclGetUniqueId": ("out",),
    "ncclCommInitRank": ("out", "size", "uid", "rank"),
    "ncclCommDestroy": ("comm",),
    "ncclCommAbort": ("comm",),
    "ncclCommGetAsyncError": ("comm", "out"),
    "ncclCommCuDevice": ("comm", "out"),
    "ncclAllReduce": ("send", "recv", "count", "datatype", "op", "comm", "stream"),
    "ncclBroadcast": ("send", "recv", "count", "datatype", "root", "comm", "stream"),
    "ncclReduce": ("send", "recv", "count", "datatype", "op", "root", "comm", "stream"),
    "ncclAllGather": ("send", "recv", "count", "datatype", "comm", "stream"),
    "ncclReduceScatter": ("send", "recv", "count", "datatype", "op", "comm", "stream"),
    "ncclSend": ("buf", "count", "datatype", "peer", "comm", "stream"),
    "ncclRecv": ("buf", "count", "datatype", "peer", "comm", "stream"),
    "ncclGroupStart": (),
    "ncclGroupEnd": (),
    "ncclRedOpCreatePreMulSum": ("out", "scalar", "datatype", "residence", "comm"),
    "ncclRedOpDestroy": ("op", "comm"),
    "ncclCommSplit": ("comm", "color", "key", "out", "config"),
    "ncclGetLastError": ("comm",),
}
#: calls queued on a stream (and device copies): what ``RecordingNccl.groups`` cuts into launched units.
ENQUEUED = frozenset({"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
                      "ncclSend", "ncclRecv", "copy"})
#: calls that only ask NCCL something (a watchdog polls them): never part of a unit.
QUERIES = frozenset({"ncclGetVersion", "ncclCommGetAsyncError", "ncclCommCuDevice", "ncclGetLastError"})
_ITEMSIZE = {DataType.INT8: 1, DataType.UINT8: 1, DataType.INT32: 4, DataType.UINT32: 4, DataType.INT64: 8,
             DataType.UINT64: 8, DataType.FLOAT16: 2, DataType.FLOAT32: 4, DataType.FLOAT64: 8,
             DataType.BFLOAT16: 2, DataType.FLOAT8E4M3: 1, DataType.FLOAT8E5M2: 1}
_ERRORS = {1: "unhandled cuda error", 2: "unhandled system error", 3: "internal error", 4: "invalid argument",
           5: "invalid usage", 6: "remote process exited or there was a network error", 7: "NCCL operation in progress"}
_FIRST_USER_OP = 5  # ncclNumOps: the first PREMUL_SUM op NCCL hands out
_IN_PROGRESS = 7  # ncclInProgress


@dataclass
class Call:
    """One recorded call: its name, its meaningful arguments (pointers as ints) and what it returned."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    result: int = 0

    def __getitem__(self, key: str) -> Any:
        return self.args[key]


def uid_digest(uid: bytes) -> str:
    """A short digest of a unique ID: equal on every rank that joined the same communicator."""
    return hashlib.sha256(uid).hexdigest()[:12]


def _target(ref: Any) -> Any:
    """The ctypes object behind ``ctypes.byref(x)`` (``._obj``) or ``ctypes.pointer(x)``."""
    return ref._obj if hasattr(ref, "_obj") else ref.contents


def _plain(value: Any) -> Any:
    """An argument as recorded: pointers as ints (NULL as 0), a unique ID as its digest, bytes as bytes."""
    if isinstance(value, library.UniqueId):
        return uid_digest(ctypes.string_at(ctypes.addressof(value), UNIQUE_ID_BYTES))
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    if isinstance(value, ctypes.Array):
        return bytes(value.raw)
    return value


class RecordingNccl(Nccl):
    """Stands in for ``Nccl``: records every entry point in ``calls`` and writes fresh handles.

    ``version``, ``unique_id`` and ``premul_sum`` are the real ``Nccl``'s code, running on the recorded
    entry points; ``check`` raises ``DistBackendError`` as the real one does."""

    def __init__(self, *, version: tuple[int, int, int] = (2, 27, 3), has_split: bool = True) -> None:
        self.path = "recording stand-in of libnccl.so.2"
        self.calls: list[Call] = []
        self.cuda: RecordingCuda | None = None  # set by install
        self._version = version
        self._failures: dict[str, list[int]] = {}
        self._async_errors: dict[int, int] = {}
        self._devices: dict[int, int] = {}  # communicator handle -> its device
        self._numbers = itertools.count(0xC0000, 0x10)  # communicator handles
        self._ops = itertools.count(_FIRST_USER_OP)
        for name in [*_PROTOTYPES, *_OPTIONAL]:
            if name != "ncclCommSplit" or has_split:
                setattr(self, name, self._entry_point(name))
        version_code = ctypes.c_int()
        self.check(self.ncclGetVersion(ctypes.byref(version_code)), "ncclGetVersion")
        self.version_code = version_code.value
        self.has_split = has_split

    def _entry_point(self, name: str) -> Callable[..., Any]:
        names = ARGUMENTS[name]  # KeyError: the binding has an entry point the stand-in does not know

        def call(*args: Any) -> Any:
            if len(args) != len(names):
                raise TypeError(f"{name} takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")
            given = dict(zip(names, args))
            recorded = {key: _plain(value) for key, value in given.items() if key != "out"}
            queued = self._failures.get(name)
            result = queued.pop(0) if queued else 0
            if result in (0, _IN_PROGRESS) and "out" in given:  # a nonblocking call writes its handle at once
                recorded.update(getattr(self, f"_write_{name}")(_target(given["out"]), recorded))
            self.calls.append(Call(name, recorded, result))
            return None if name == "ncclGetLastError" else result  # that one returns a message (NULL: none)

        call.__name__ = name
        return call

    # ---- what the entry points write through their "out" pointer (and record about it) --------------
    def _write_ncclGetVersion(self, out: ctypes.c_int, args: dict) -> dict:
        major, minor, patch = self._version
        out.value = major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else \
            major * 1000 + minor * 100 + patch
        return {}

    def _write_ncclGetUniqueId(self, out: library.UniqueId, args: dict) -> dict:
        uid = os.urandom(UNIQUE_ID_BYTES)
        ctypes.memmove(ctypes.addressof(out), uid, UNIQUE_ID_BYTES)
        return {"uid": uid_digest(uid)}

    def _new_communicator(self, out: ctypes.c_void_p) -> dict:
        handle = next(self._numbers)
        out.value = handle
        self._devices[handle] = self.cuda.current if self.cuda is not None else 0
        return {"handle": handle, "device": self._devices[handle]}

    def _write_ncclCommInitRank(self, out: ctypes.c_void_p, args: dict) -> dict:
        return self._new_communicator(out)

    def _write_ncclCommSplit(self, out: ctypes.c_void_p, args: dict) -> dict:
        return {"handle": None} if args["color"] == SPLIT_NOCOLOR else self._new_communicator(out)

    def _write_ncclCommGetAsyncError(self, out: ctypes.c_int, args: dict) -> dict:
        out.value = self._async_errors.get(args["comm"], 0)
        return {"error": out.value}

    def _write_ncclCommCuDevice(self, out: ctypes.c_int, args: dict) -> dict:
        out.value = self._devices.get(args["comm"], 0)
        return {}

    def _write_ncclRedOpCreatePreMulSum(self, out: ctypes.c_int, args: dict) -> dict:
        out.value = next(self._ops)
        return {"op": out.value}

    # ---- what a test asks of it -------------------------------------------------------------------
    def check(self, result: int, what: str) -> None:
        """Raise ``DistBackendError`` for a non-zero result, worded as the real binding words it."""
        if result != 0:
            raise DistBackendError(f"NCCL error in {what}: {_ERRORS.get(result, f'error {result}')} "
                                   f"[NCCL {'.'.join(map(str, self.version))}, {self.path}]")

    def fail(self, name: str, result: int = 3, times: int = 1) -> None:
        """Make the next ``times`` calls of entry point ``name`` return ``result`` (default ncclInternalError)."""
        self._failures.setdefault(name, []).extend([result] * times)

    def set_async_error(self, handle: int, code: int) -> None:
        """What ``ncclCommGetAsyncError`` reports for communicator ``handle`` from now on."""
        self._async_errors[handle] = code

    def record(self, name: str, **args: Any) -> None:
        """Append a call that is not NCCL's (the fake CUDA layer's copies) to ``calls``."""
        self.calls.append(Call(name, args))

    def named(self, *names: str) -> list[Call]:
        """The recorded calls of these names, in call order."""
        return [call for call in self.calls if call.name in names]

    def groups(self) -> list[list[Call]]:
        """``calls`` cut into launched units: a ``ncclGroupStart``..``ncclGroupEnd`` block (markers included,
        nesting as NCCL nests) is one unit; an enqueued call (``ENQUEUED``) outside a group is one on its own.
        Queries (``QUERIES``) are left out; other calls outside a group (init, destroy) belong to no unit."""
        units: list[list[Call]] = []
        depth = 0
        for call in self.calls:
            if call.name in QUERIES or (not depth and call.name not in ENQUEUED and call.name != "ncclGroupStart"):
                continue
            if not depth:
                units.append([])
            units[-1].append(call)
            depth += {"ncclGroupStart": 1, "ncclGroupEnd": -1}.get(call.name, 0)
        return units

    def p2p_layout(self) -> list[tuple[str, int, int, int, int]]:
        """(call, pointer, bytes, peer, communicator handle) of every ``ncclSend`` and ``ncclRecv``."""
        return [(c.name, c["buf"], c["count"] * _ITEMSIZE[c["datatype"]], c["peer"], c["comm"])
                for c in self.named("ncclSend", "ncclRecv")]


class FakeCudaError(Exception):
    """What the fake CUDA layer raises where CuPy would raise ``CUDARuntimeError``."""

    def __init__(self, status: int = 1) -> None:
        super().__init__(f"cudaError {status} (recording stand-in)")
        self.status = status


class FakeStream:
    """A stream: a number, and the events it was told to wait for."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        self.waited: list[int] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event.ptr)


class FakeEvent:
    """An event: a number; ``passed`` says whether the (absent) GPU has passed it (default True)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        self.passed = True
        self.recorded_on: int | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        self.recorded_on = 0 if stream is None else stream.ptr


class _Device:
    """``cupy.cuda.Device(n)``: makes ``n`` current while entered (and for good with ``use``)."""

    def __init__(self, fake: RecordingCuda, device: int) -> None:
        self.id = device
        self._fake = fake
        self._previous: list[int] = []

    def __enter__(self) -> _Device:
        self._previous.append(self._fake.current)
        self._fake.current = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        self._fake.current = self._previous.pop()

    def use(self) -> None:
        self._fake.current = self.id


class RecordingCuda:
    """The few CUDA calls of ``hpc_c10d.nccl.cuda``, as recording objects (no GPU, no CuPy)."""

    _ALLOCATION_START = 0x7F00_0000_0000
    _ALIGN = 512

    def __init__(self, recorder: RecordingNccl, devices: int, bus_id: Callable[[int], str]) -> None:
        self.recorder = recorder
        self.devices = devices
        self.bus_id = bus_id
        self.current = 0
        self.streams: list[FakeStream] = []
        self.events: list[FakeEvent] = []
        self.allocations: list[tuple[int, int]] = []  # (pointer, bytes) of each staging buffer
        self._callers: dict[int, FakeStream] = {}
        self._numbers = itertools.count(0x5000, 0x10)
        self._next_address = self._ALLOCATION_START

    # ---- objects -----------------------------------------------------------------------------------
    def stream(self) -> FakeStream:
        self.streams.append(FakeStream(next(self._numbers)))
        return self.streams[-1]

    def event(self) -> FakeEvent:
        self.events.append(FakeEvent(next(self._numbers)))
        return self.events[-1]

    def empty(self, nbytes: int, dtype: Any = np.uint8) -> SimpleNamespace:
        """``cupy.empty``: an array-like whose ``.data.ptr`` is a fresh fake address."""
        size = int(nbytes) * np.dtype(dtype).itemsize
        ptr = self._next_address
        self._next_address += max(self._ALIGN, -(-size // self._ALIGN) * self._ALIGN)
        self.allocations.append((ptr, size))
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), nbytes=size, size=int(nbytes), dtype=np.dtype(dtype))

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        """``cupy.cuda.runtime.memcpyAsync``: recorded as ``Call("copy", ...)``."""
        self.recorder.record("copy", dst=dst, src=src, nbytes=nbytes, kind=kind, stream=stream)

    def module(self) -> SimpleNamespace:
        """What ``cuda.cupy()`` returns: the parts of CuPy the transport calls."""
        runtime = SimpleNamespace(memcpyAsync=self.memcpy_async, CUDARuntimeError=FakeCudaError,
                                  getDevice=lambda: self.current, getDeviceCount=lambda: self.devices,
                                  deviceGetPCIBusId=self.bus_id)
        namespace = SimpleNamespace(runtime=runtime, Device=self.device, Stream=lambda **_: self.stream(),
                                    Event=lambda **_: self.event(), get_current_stream=self.caller_stream)
        return SimpleNamespace(cuda=namespace, empty=self.empty, uint8=np.uint8)

    def device(self, device: int | None = None) -> _Device:
        """``cupy.cuda.Device(n)``: a context manager making ``n`` current (the current one without ``n``)."""
        return _Device(self, self.current if device is None else device)

    def caller_stream(self, buf: DeviceBuffer | int) -> FakeStream:
        """The caller's current stream on the buffer's device (one per device)."""
        device = buf if isinstance(buf, int) else buf.device
        if device not in self._callers:
            self._callers[device] = self.stream()
        return self._callers[device]

    def patches(self) -> dict[str, Callable[..., Any]]:
        """``hpc_c10d.nccl.cuda`` function name -> its stand-in."""
        module = self.module()
        return {
            "cupy": lambda: module,
            "caller_stream": self.caller_stream,
            "device_guard": self.device,
            "new_stream": lambda device: self.stream(),
            "new_event": self.event,
            "event_passed": lambda event: event.passed,
            "runtime_error": lambda: FakeCudaError,
            "cuda_error": lambda error: DistBackendError(f"CUDA error: {error} (recording stand-in)"),
            "visible_devices": lambda: (self.devices, "" if self.devices else "no device (recording stand-in)"),
            "device_count": lambda: self.devices,
            "pci_bus_id": self.bus_id,
        }


def install(monkeypatch: Any, *, devices: int = 1, bus_id: Callable[[int], str] | None = None,
            version: tuple[int, int, int] = (2, 27, 3), has_split: bool = True) -> RecordingNccl:
    """Put a ``RecordingNccl`` in place of the NCCL library and recording objects in place of
    ``hpc_c10d.nccl.cuda``'s calls, for one test (``monkeypatch`` undoes it).

    ``devices``: how many GPUs this rank sees; ``bus_id(device)``: its PCI bus id (by default one per
    MPI rank and device, so ranks on one host hold distinct GPUs)."""
    from mpi4py import MPI

    world_rank = MPI.COMM_WORLD.Get_rank()
    recorder = RecordingNccl(version=version, has_split=has_split)
    recorder.cuda = RecordingCuda(recorder, devices, bus_id or (lambda device: f"0000:{world_rank:02x}:{device:02x}.0"))
    monkeypatch.setattr(library, "load", lambda: recorder)
    monkeypatch.setattr(library, "available", lambda: True)
    monkeypatch.setattr(nccl_package, "available", lambda: True)
    for name, stand_in in recorder.cuda.patches().items():
        monkeypatch.setattr(cuda, name, stand_in)  # raises if hpc_c10d.nccl.cuda no longer has ``name``
    # The watchdog thread polls every group's NCCL transport and applies the timeout policy (abort)
    # to an error it reads: an error a test sets on a group's stand-in communicator ended the job,
    # silently under pytest's capture, whenever a tick fell inside the test (loaded CI runs).
    monkeypatch.setattr(Watchdog, "_check_gpu_work", lambda self: None)
    return recorder


def fake_buffer(ptr: int, count: int, dtype: Any = np.float32, device: int = 0) -> DeviceBuffer:
    """A contiguous one-dimensional cupy-kind ``DeviceBuffer`` at fake address ``ptr`` (never dereferenced)."""
    return DeviceBuffer(ptr, int(count), np.dtype(dtype), (int(count),), device, None, "cupy", True)

