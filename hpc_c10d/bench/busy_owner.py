"""Store latency while the owner computes: rank 0 runs a pure-Python loop (no MPI calls) and the
other ranks time single operations on keys rank 0 holds (``bench stores --busy-owner SECONDS``).

Between nodes MPIStore's operations need rank 0's MPI library to run (its progress thread); a
TCPStore's server is a C++ thread in rank 0's process, which needs no GIL."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .report import Record
from .sweep import Sweep

__all__ = ["run", "BUSY_OPS"]

BUSY_OPS = ("set", "get", "add", "compare_set")
_VALUE = b"0123456789abcdef"
_WORKING_SHARE = 0.8  # of the owner's busy time, the others' operations stop by then
_SPIN = 2000  # arithmetic steps between clock reads: well over the GIL's switch interval in bytecodes


def _keys_on_rank0(store: Any, prefix: str, count: int) -> list[str]:
    """``count`` keys that rank 0 holds (any keys when the store has no owner() (TCPStore: rank 0's server))."""
    owner = getattr(store, "owner", None)
    keys: list[str] = []
    n = 0
    while len(keys) < count:
        key = f"{prefix}{n}"
        n += 1
        if owner is None or owner(key) == 0:
            keys.append(key)
    return keys


_Call = tuple[str, Callable[..., Any], Callable[[Any], bool]]


def _calls(store: Any, ops: list[str], rank: int) -> list[_Call]:
    """One (op, call, check) per op on keys of this rank's own, all held by rank 0."""
    calls: list[_Call] = []
    for op in ops:
        key = _keys_on_rank0(store, f"busy/{op}/{rank}/", 1)[0]
        if op == "set":
            calls.append((op, lambda key=key: store.set(key, _VALUE), lambda _: True))
        elif op == "get":
            store.set(key, _VALUE)
            calls.append((op, lambda key=key: store.get(key), lambda got: got == _VALUE))
        elif op == "add":
            calls.append((op, lambda key=key: store.add(key, 1), lambda got: got > 0))
        else:
            store.set(key, _VALUE)
            calls.append((op, lambda key=key: store.compare_set(key, _VALUE, _VALUE), lambda got: got == _VALUE))
    return calls


def _compute(seconds: float) -> int:
    """Pure-Python arithmetic for ``seconds``; returns the steps done."""
    deadline, x, steps = time.perf_counter() + seconds, 1, 0
    while time.perf_counter() < deadline:
        for _ in range(_SPIN):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        steps += _SPIN
    return steps


def _time_calls(calls: list[_Call], seconds: float) -> tuple[dict[str, list[float]], int]:
    """Round-robin over ``calls`` for ``seconds``; per op the latencies (s), and wrong results."""
    took: dict[str, list[float]] = {op: [] for op, _, _ in calls}
    wrong, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for op, call, check in calls:
            start = time.perf_counter()
            result = call()
            took[op].append(time.perf_counter() - start)
            wrong += not check(result)
    return took, wrong


def _one_store(bench: Sweep, name: str, store: Any, ops: list[str], seconds: float) -> list[Record]:
    from mpi4py import MPI

    calls = _calls(store, ops, bench.rank) if bench.rank else []
    bench.comm.Barrier()
    took: dict[str, list[float]] = {}
    wrong = 0
    if bench.rank == 0:
        _compute(seconds)
    else:
        time.sleep(0.05 * seconds)  # let rank 0 settle into its loop
        took, wrong = _time_calls(calls, _WORKING_SHARE * seconds)
    everyone = bench.comm.gather(took, root=0)
    wrong = bench.comm.allreduce(wrong, op=MPI.SUM)
    if bench.rank != 0:
        return []
    records = []
    for op in ops:
        samples = np.array([t for part in everyone[1:] for t in part[op]]) * 1e6
        if not samples.size:
            continue
        records.append(Record(bench="stores", op=f"{op}, owner busy", impl=name, ranks=bench.size, bytes=len(_VALUE),
                              iters=samples.size, rounds=1, us_min=float(samples.min()),
                              us_median=float(np.median(samples)), us_max=float(samples.max()), wrong=wrong,
                              note=f"p99 {np.percentile(samples, 99) / 1e3:.2f} ms over {samples.size} calls"))
    return records


def run(bench: Sweep, stores: dict[str, Any], ops: list[str], seconds: float) -> list[Record]:
    """Time ``ops`` (of ``BUSY_OPS``) from ranks 1.. while rank 0 computes ``seconds``, per store."""
    ops = [op for op in ops if op in BUSY_OPS] or list(BUSY_OPS)
    records = []
    for name, store in stores.items():
        records += _one_store(bench, name, store, ops, seconds)
        bench.progress.step(f"{name}, owner busy")
    return records
