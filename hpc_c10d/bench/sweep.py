"""What every sweep shares: the job's communicators, the implementations compared, the device's
array module and the timing options."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from . import timing
from .report import Progress, Record

__all__ = ["Sweep", "Timed", "BASELINE", "TENSORS"]

BASELINE = "hpc_c10d"
TENSORS = "hpc_c10d-tensors"  # hpc_c10d's own API called with torch tensors


class Timed(NamedTuple):
    """One implementation's timing of one point: calls per batch, (min, median, max) µs per call over
    the ranks, and on a GPU the slowest rank's host and GPU µs per call (``timing.DeviceClock``)."""

    iters: int
    spread: tuple[float, float, float]
    host_us: float | None = None
    gpu_us: float | None = None


@dataclass
class Sweep:
    """The bench's run-wide state: ``comm`` is mpi4py's world; ``impls`` lists the implementations,
    baseline first; ``apis`` gives, for each one but raw ``mpi4py``, the torch.distributed-style
    module to call and whether it takes torch tensors (hpc_c10d takes the numpy arrays themselves)."""

    apis: dict[str, tuple[Any, bool]]
    comm: Any
    impls: list[str]
    device: str
    async_op: bool
    iters: int  # 0: calibrate to batch_s
    batch_s: float
    max_iters: int
    warmup: int
    rounds: int
    progress: Progress
    notes: dict[str, str] = field(default_factory=dict)  # implementation -> why the whole run left it out

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def mode(self) -> str:
        return "async" if self.async_op else "blocking"

    @property
    def xp(self) -> Any:
        """numpy on CPU, cupy on CUDA."""
        if self.device == "cuda":
            import cupy

            return cupy
        return np

    def sync(self) -> Callable[[], Any] | None:
        """Waits for the device at the end of a timed batch (nothing to wait for on CPU)."""
        return self.xp.cuda.Device().synchronize if self.device == "cuda" else None

    def to_device(self, array: np.ndarray) -> Any:
        return array if self.device == "cpu" else self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        return array if self.device == "cpu" else self.xp.asnumpy(array)

    def measure(self, steps: dict[str, Callable[[], Any]], taking_part: bool = True) -> dict[str, Timed]:
        """Warm up, calibrate, time ``steps`` in interleaved rounds; per implementation its Timed
        (over the ranks taking part)."""
        sync = self.sync()
        iters = {}
        for name, step in steps.items():
            timing.batch(step, max(1, self.warmup), sync)
            iters[name] = self.iters or timing.calibrate(self.comm, step, self.batch_s, self.max_iters, sync)
        clocks = {name: timing.DeviceClock(self.xp) for name in steps} if self.device == "cuda" else {}
        per_call = timing.interleaved(self.comm, steps, iters, self.rounds, sync, clocks)
        return {name: Timed(iters[name], timing.spread(self.comm, per_call[name] * 1e6 if taking_part else None),
                            *(self._slowest(getattr(clocks[name], f"{part}_s"), taking_part) if clocks else None
                              for part in ("host", "gpu")))
                for name in steps}

    def _slowest(self, seconds: list[float], taking_part: bool) -> float:
        """The slowest rank's median of ``seconds``, in µs; collective."""
        return timing.spread(self.comm, statistics.median(seconds) * 1e6 if taking_part else None)[2]

    def records(self, measured: dict[str, Timed], wrong: dict[str, int], failed: dict[str, str] | None = None,
                **point: Any) -> list[Record]:
        """Records for one point, bandwidths from ``bytes`` and ``bus`` (the bus factor) in ``point``;
        ``failed`` gives the implementations that could not run it, and why."""
        bus = point.pop("bus", None)
        out = []
        for name, timed in measured.items():
            low, mid, high = timed.spread
            algbw = point.get("bytes", 0) / high / 1e3 if bus and high > 0 else None
            out.append(Record(impl=name, ranks=self.size, device=self.device, mode=self.mode, iters=timed.iters,
                              rounds=self.rounds, us_min=low, us_median=mid, us_max=high, algbw_gbs=algbw,
                              busbw_gbs=None if algbw is None else algbw * bus, wrong=wrong.get(name),
                              host_us=timed.host_us, gpu_us=timed.gpu_us, **point))
        for name, why in (failed or {}).items():
            out.append(Record(impl=name, ranks=self.size, device=self.device, mode=self.mode, note=why, **point))
        return out
