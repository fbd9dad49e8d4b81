"""A thin ctypes layer over the NCCL shared library (``libnccl.so.2``).

ctypes rather than ``cupy.cuda.nccl``, which lacks calls and types this transport needs. The
library is the first found of ``HPC_C10D_NCCL_LIBRARY``, the ``nvidia-nccl-cu13``/``-cu12``
wheel and the loader's path, and it loads without a GPU. Why and how: docs/architecture.md,
"NCCL transport"; docs/gpus.md, "Which NCCL library".
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from typing import TYPE_CHECKING, Any, Callable

from ..errors import DistBackendError
from ..extras import gpu_install_hint

__all__ = ["LIBRARY_ENV", "UNIQUE_ID_BYTES", "SPLIT_NOCOLOR", "DataType", "RedOp", "Nccl", "load", "available"]

LIBRARY_ENV = "HPC_C10D_NCCL_LIBRARY"
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
SPLIT_NOCOLOR = -1  # NCCL_SPLIT_NOCOLOR
_SCALAR_HOST_IMMEDIATE = 1  # ncclScalarHostImmediate


class DataType:
    """``ncclDataType_t`` values."""

    INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
    FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = 6, 7, 8, 9
    FLOAT8E4M3, FLOAT8E5M2 = 10, 11  # NCCL >= 2.24


class RedOp:
    """``ncclRedOp_t`` values of the built-in reductions."""

    SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4


class UniqueId(ctypes.Structure):
    """``ncclUniqueId``: 128 opaque bytes, passed by value."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


_p = ctypes.c_void_p
_size = ctypes.c_size_t
_int = ctypes.c_int
# name -> argument types; every function returns ncclResult_t (int).
_PROTOTYPES: dict[str, list[Any]] = {
    "ncclGetVersion": [ctypes.POINTER(_int)],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(_p), _int, UniqueId, _int],
    "ncclCommDestroy": [_p],
    "ncclCommAbort": [_p],
    "ncclCommGetAsyncError": [_p, ctypes.POINTER(_int)],
    "ncclCommCuDevice": [_p, ctypes.POINTER(_int)],
    "ncclAllReduce": [_p, _p, _size, _int, _int, _p, _p],
    "ncclBroadcast": [_p, _p, _size, _int, _int, _p, _p],
    "ncclReduce": [_p, _p, _size, _int, _int, _int, _p, _p],
    "ncclAllGather": [_p, _p, _size, _int, _p, _p],
    "ncclReduceScatter": [_p, _p, _size, _int, _int, _p, _p],
    "ncclSend": [_p, _size, _int, _int, _p, _p],
    "ncclRecv": [_p, _size, _int, _int, _p, _p],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclRedOpCreatePreMulSum": [ctypes.POINTER(_int), _p, _int, _int, _p],
    "ncclRedOpDestroy": [_int, _p],
}
# Present only in newer releases; looked up softly.
_OPTIONAL: dict[str, list[Any]] = {
    "ncclCommSplit": [_p, _int, _int, ctypes.POINTER(_p), _p],  # NCCL >= 2.18
    "ncclGetLastError": [_p],
}


class Nccl:
    """The loaded library: typed entry points and the error check every call goes through."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        for name, argtypes in _PROTOTYPES.items():
            self._bind(name, argtypes)
        for name, argtypes in _OPTIONAL.items():
            if hasattr(self._lib, name):
                self._bind(name, argtypes)
        self._lib.ncclGetErrorString.restype = ctypes.c_char_p
        self._lib.ncclGetErrorString.argtypes = [_int]
        if hasattr(self, "ncclGetLastError"):
            self._lib.ncclGetLastError.restype = ctypes.c_char_p
        version = _int()
        self.check(self.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
        self.version_code = version.value
        self.has_split = hasattr(self, "ncclCommSplit")

    if TYPE_CHECKING:  # the nccl* entry points are set by _bind, from the tables above
        def __getattr__(self, name: str) -> Callable[..., int]: ...

    def _bind(self, name: str, argtypes: list[Any]) -> None:
        function = getattr(self._lib, name)
        function.argtypes = argtypes
        function.restype = _int
        setattr(self, name, function)

    @property
    def version(self) -> tuple[int, int, int]:
        """``(major, minor, patch)``, decoded as ``NCCL_VERSION`` encodes it."""
        code = self.version_code
        if code >= 10000:
            return code // 10000, code % 10000 // 100, code % 100
        return code // 1000, code % 1000 // 100, code % 100

    def check(self, result: int, what: str) -> None:
        """Raise ``DistBackendError`` for a failed NCCL call, with NCCL's own explanation."""
        if result == 0:
            return
        text = self._lib.ncclGetErrorString(result).decode(errors="replace")
        detail = ""
        if hasattr(self, "ncclGetLastError"):
            last = self._lib.ncclGetLastError(None)
            if last:
                detail = f" ({last.decode(errors='replace')})"
        raise DistBackendError(f"NCCL error in {what}: {text}{detail} [NCCL {'.'.join(map(str, self.version))}, "
                               f"{self.path}]")

    def unique_id(self) -> bytes:
        """A fresh unique ID (needs no GPU)."""
        uid = UniqueId()
        self.check(self.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)

    def premul_sum(self, factor_bytes: bytes, datatype: int, comm: int) -> int:
        """Create the reduction ``sum(factor * x)`` for one call (destroy it after enqueueing)."""
        op = _int()
        scalar = ctypes.create_string_buffer(factor_bytes, len(factor_bytes))
        self.check(self.ncclRedOpCreatePreMulSum(ctypes.byref(op), scalar, datatype, _SCALAR_HOST_IMMEDIATE, comm),
                   "ncclRedOpCreatePreMulSum")
        return op.value


def _candidates() -> list[str]:
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return [explicit]
    found = []
    for package in ("nvidia.nccl",):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.join(folder, "lib", "libnccl.so.2")
            if os.path.exists(path):
                found.append(path)
    return [*found, "libnccl.so.2"]


_loaded: Nccl | None = None
_failure: str | None = None
_lock = threading.Lock()


def load() -> Nccl:
    """The NCCL library, loaded once; RuntimeError saying where we looked if there is none."""
    global _loaded, _failure
    with _lock:
        if _loaded is None and _failure is None:
            errors = []
            for path in _candidates():
                try:
                    _loaded = Nccl(path)
                    break
                except (OSError, AttributeError) as exc:
                    errors.append(f"{path}: {exc}")
            else:
                _failure = "; ".join(errors)
    if _loaded is None:
        raise RuntimeError(f"the NCCL library could not be loaded ({_failure}); {gpu_install_hint()}, "
                           f"or point {LIBRARY_ENV} at a libnccl.so.2")
    return _loaded


def available() -> bool:
    """True if ``load()`` succeeds (never raises)."""
    try:
        load()
    except RuntimeError:
        return False
    return True
