"""What every sweep shares: the job's communicators, the implementations compared, the device's
array module and the timing options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import timing
from .report import Progress, Record

__all__ = ["Sweep", "BASELINE"]

BASELINE = "hpc_c10d"


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

    def measure(self, steps: dict[str, Callable[[], Any]], taking_part: bool = True) -> dict[str, tuple]:
        """Warm up, calibrate, time ``steps`` in interleaved rounds; per implementation
        (iters, (min, median, max) µs over the ranks taking part)."""
        sync = self.sync()
        iters = {}
        for name, step in steps.items():
            timing.batch(step, max(1, self.warmup), sync)
            iters[name] = self.iters or timing.calibrate(self.comm, step, self.batch_s, self.max_iters, sync)
        per_call = timing.interleaved(self.comm, steps, iters, self.rounds, sync)
        return {name: (iters[name], timing.spread(self.comm, per_call[name] * 1e6 if taking_part else None))
                for name in steps}

    def records(self, measured: dict[str, tuple], wrong: dict[str, int], failed: dict[str, str] | None = None,
                **point: Any) -> list[Record]:
        """Records for one point, bandwidths from ``bytes`` and ``bus`` (the bus factor) in ``point``;
        ``failed`` gives the implementations that could not run it, and why."""
        bus = point.pop("bus", None)
        out = []
        for name, (iters, (low, mid, high)) in measured.items():
            algbw = point.get("bytes", 0) / high / 1e3 if bus and high > 0 else None
            out.append(Record(impl=name, ranks=self.size, device=self.device, mode=self.mode, iters=iters,
                              rounds=self.rounds, us_min=low, us_median=mid, us_max=high, algbw_gbs=algbw,
                              busbw_gbs=None if algbw is None else algbw * bus, wrong=wrong.get(name), **point))
        for name, why in (failed or {}).items():
            out.append(Record(impl=name, ranks=self.size, device=self.device, mode=self.mode, note=why, **point))
        return out
