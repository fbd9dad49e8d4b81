"""Timed batches of back-to-back calls: a call count agreed by all ranks, then interleaved rounds."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

__all__ = ["DeviceClock", "batch", "calibrate", "interleaved", "spread"]

_perf_counter = time.perf_counter


class DeviceClock:
    """What a GPU batch costs apart from its wall time: the host's time to queue its calls, and the
    GPU's time between CUDA events recorded on the current stream before and after them."""

    def __init__(self, cupy: Any) -> None:
        self._before, self._after = cupy.cuda.Event(), cupy.cuda.Event()
        self._elapsed_ms = cupy.cuda.get_elapsed_time
        self.host_s: list[float] = []  # per call, one entry per batch
        self.gpu_s: list[float] = []

    def begin(self) -> None:
        self._before.record()

    def queued(self, start: float, iters: int) -> None:
        """The calls are queued (the host is free again); ``start`` is when the batch began."""
        self.host_s.append((_perf_counter() - start) / iters)
        self._after.record()

    def finished(self, iters: int) -> None:
        """After the device synchronised: read the events."""
        self.gpu_s.append(self._elapsed_ms(self._before, self._after) / 1e3 / iters)


def batch(step: Callable[[], Any], iters: int, sync: Callable[[], Any] | None = None,
          clock: DeviceClock | None = None) -> float:
    """Seconds per call of ``iters`` calls of ``step`` (``sync`` waits for a device once at the end;
    ``clock`` also notes the host's and the GPU's share)."""
    start = _perf_counter()
    if clock is not None:
        clock.begin()
    for _ in range(iters):
        step()
    if clock is not None:
        clock.queued(start, iters)
    if sync is not None:
        sync()
    seconds = (_perf_counter() - start) / iters
    if clock is not None:
        clock.finished(iters)
    return seconds


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
                sync: Callable[[], Any] | None = None,
                clocks: dict[str, DeviceClock] | None = None) -> dict[str, float]:
    """Per-call seconds on this rank, the median over ``rounds``; the implementations take turns within
    a round, in an order rotated each round, every batch starting at a barrier (``clocks``, on a GPU:
    one per implementation)."""
    names = list(steps)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            comm.Barrier()
            seconds[name].append(batch(steps[name], iters[name], sync, clocks[name] if clocks else None))
    return {name: statistics.median(values) for name, values in seconds.items()}


def spread(comm: Any, value: float | None) -> tuple[float, float, float]:
    """(min, median, max) over the ranks that passed a value (None: this rank took no part)."""
    values = [v for v in comm.allgather(value) if v is not None]
    return min(values), statistics.median(values), max(values)
