"""Timed batches of back-to-back calls: a call count agreed by all ranks, then interleaved rounds."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

__all__ = ["batch", "calibrate", "interleaved", "spread"]

_perf_counter = time.perf_counter


def batch(step: Callable[[], Any], iters: int, sync: Callable[[], Any] | None = None) -> float:
    """Seconds per call of ``iters`` calls of ``step`` (``sync`` waits for a device once at the end)."""
    start = _perf_counter()
    for _ in range(iters):
        step()
    if sync is not None:
        sync()
    return (_perf_counter() - start) / iters


def calibrate(comm: Any, step: Callable[[], Any], target_s: float, max_iters: int,
              sync: Callable[[], Any] | None = None) -> int:
    """Calls per batch so that a batch of ``step`` takes about ``target_s`` on the slowest rank."""
    from mpi4py import MPI

    iters = 1
    while True:
        comm.Barrier()
        per_call = comm.allreduce(batch(step, iters, sync), op=MPI.MAX)
        if per_call * iters >= target_s / 8 or iters >= max_iters:
            break
        iters *= 4
    return int(min(max_iters, max(1, round(target_s / per_call))))


def interleaved(comm: Any, steps: dict[str, Callable[[], Any]], iters: dict[str, int], rounds: int,
                sync: Callable[[], Any] | None = None) -> dict[str, float]:
    """Per-call seconds on this rank, the median over ``rounds``; the implementations take turns within
    a round, in an order rotated each round, every batch starting at a barrier."""
    names = list(steps)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            comm.Barrier()
            seconds[name].append(batch(steps[name], iters[name], sync))
    return {name: statistics.median(values) for name, values in seconds.items()}


def spread(comm: Any, value: float | None) -> tuple[float, float, float]:
    """(min, median, max) over the ranks that passed a value (None: this rank took no part)."""
    values = [v for v in comm.allgather(value) if v is not None]
    return min(values), statistics.median(values), max(values)
