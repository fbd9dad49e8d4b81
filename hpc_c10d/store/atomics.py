"""Atomic 64-bit words in an RMA window: MPI's atomics, or the CPU's where every rank shares memory.

``MPIAtomics`` uses ``Compare_and_swap``/``Fetch_and_op`` (between nodes too); ``SharedAtomics``
the processor's compare-and-swap through ``libatomic`` and ctypes, when every rank maps every
window. The two must never mix on one window, so ``pick`` chooses once, collectively. Why, and
the costs: docs/architecture.md, "Stores" (Word atomics).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["MPIAtomics", "SharedAtomics", "pick"]

_SEQ_CST = 5  # __ATOMIC_SEQ_CST


class MPIAtomics:
    """Word atomics through MPI one-sided calls (inside a ``Lock_all`` epoch)."""

    def __init__(self, MPI: Any, win: Any) -> None:
        self._win, self._NO_OP = win, MPI.NO_OP
        self._desired, self._compare, self._fetched = (memoryview(bytearray(8)).cast("q") for _ in range(3))

    def fetch(self, rank: int, disp: int) -> int:
        """Atomically read the word at ``disp`` of ``rank``'s window."""
        self._win.Fetch_and_op(self._desired, self._fetched, rank, disp, self._NO_OP)
        self._win.Flush(rank)
        return self._fetched[0]

    def swap(self, rank: int, disp: int, expected: int, desired: int) -> int:
        """Compare-and-swap the word at ``disp``; return the word found there."""
        self._compare[0], self._desired[0] = expected, desired
        self._win.Compare_and_swap(self._desired, self._compare, self._fetched, rank, disp)
        self._win.Flush(rank)
        return self._fetched[0]


class SharedAtomics:
    """Word atomics with the CPU's instructions on windows every rank maps as shared memory."""

    def __init__(self, library: ctypes.CDLL, windows: list[memoryview]) -> None:
        self._bases = [ctypes.addressof(ctypes.c_char.from_buffer(window)) for window in windows]
        self._cas = library["__atomic_compare_exchange_8"]  # [] : no name mangling of "__"
        self._cas.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
        self._cas.restype = ctypes.c_bool
        self._load = library["__atomic_load_8"]
        self._load.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._load.restype = ctypes.c_int64
        self._expected = ctypes.c_int64()
        self._expected_at = ctypes.addressof(self._expected)

    def fetch(self, rank: int, disp: int) -> int:
        """Atomically read the word at ``disp`` of ``rank``'s window."""
        return self._load(self._bases[rank] + disp, _SEQ_CST)

    def swap(self, rank: int, disp: int, expected: int, desired: int) -> int:
        """Compare-and-swap the word at ``disp``; return the word found there."""
        self._expected.value = expected  # on failure the CPU leaves the word it found here
        self._cas(self._bases[rank] + disp, self._expected_at, desired, _SEQ_CST, _SEQ_CST)
        return self._expected.value


def _shared_atomics(shared: list[memoryview | None]) -> SharedAtomics | None:
    windows = [window for window in shared if window is not None]
    if len(windows) < len(shared):
        return None
    try:  # PyDLL: the call is far shorter than handing the GIL over and back
        library = ctypes.PyDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
        return SharedAtomics(library, windows)
    except (OSError, AttributeError):  # no libatomic, or one without these functions
        return None


def pick(MPI: Any, comm: Any, win: Any, shared: list[memoryview | None]) -> MPIAtomics | SharedAtomics:
    """The atomics every rank of ``comm`` will use on ``win`` (collective): the CPU's when every
    rank maps every window (``shared``, this rank's view) and has libatomic, else MPI's."""
    fast = _shared_atomics(shared)
    if comm.allreduce(fast is not None, op=MPI.LAND):
        assert fast is not None  # this rank voted too
        return fast
    return MPIAtomics(MPI, win)
