"""Checkpoint bandwidth: ``hpc_c10d.checkpoint`` with every rank saving and loading its uneven slab,
against one process writing and reading the whole global float64 array with plain h5py.

Rounds interleave the two; times include opening, writing and closing the file (and the rename).
The page cache is not dropped, so both sides see the same cache: point ``--dir`` at the file
system the jobs write to.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from .optional import unimportable
from .report import Record
from .sweep import Sweep

__all__ = ["run", "unusable"]


def _slabs(rows: int, ranks: int) -> list[int]:
    """Row counts per rank, deliberately uneven (as real shards often are)."""
    extents = [len(part) for part in np.array_split(np.arange(rows), ranks)]
    if ranks > 1:
        moved = extents[-1] // 3
        extents[0] += moved
        extents[-1] -= moved
    return extents


def unusable(directory: str) -> str | None:
    """Why this rank cannot run the benchmark with its files in ``directory`` (None: it can)."""
    if not os.path.isdir(directory):
        return f"--dir {directory}: no such directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"--dir {directory}: no permission to write there"
    return unimportable("h5py", "hdf5")


def run(bench: Sweep, nbytes: int, directory: str) -> list[Record]:
    """Write then read ``nbytes`` of float64, ``bench.rounds`` times, both ways."""
    import h5py

    from ..checkpoint import Shard, load, save

    rank, ranks = bench.rank, bench.size
    rows = max(ranks, nbytes // 8 // 1024)
    mine = np.random.default_rng(rank).standard_normal((_slabs(rows, ranks)[rank], 1024))
    whole = np.random.default_rng(9).standard_normal((rows, 1024)) if rank == 0 else None
    plain = os.path.join(directory, f"bench-h5py-{ranks}.h5")
    ours = os.path.join(directory, f"bench-hpc_c10d-{ranks}.h5")

    def write_plain():
        with h5py.File(plain, "w") as f:
            f.create_dataset("x", data=whole)

    def read_plain():
        with h5py.File(plain, "r") as f:
            f["x"].read_direct(whole)

    actions = {("write", "hpc_c10d"): lambda: save({"x": Shard(mine)}, ours), ("write", "h5py"): write_plain,
               ("read", "hpc_c10d"): lambda: load({"x": Shard(mine)}, ours), ("read", "h5py"): read_plain}
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in actions}
    bench.progress.total = bench.rounds
    for round_ in range(bench.rounds):
        for (what, impl), action in actions.items():
            bench.comm.Barrier()
            if impl == "h5py" and rank != 0:  # one process alone, as a user of plain h5py would
                continue
            start = time.perf_counter()
            action()
            seconds[what, impl].append(time.perf_counter() - start)
        bench.progress.step(f"round {round_ + 1}")
    expected = np.random.default_rng(rank).standard_normal(mine.shape)
    wrong = bench.comm.allreduce(int(np.count_nonzero(mine != expected)))
    total = rows * 1024 * 8
    records = []
    for (what, impl), values in seconds.items():
        spread = [v for v in bench.comm.allgather(statistics.median(values) * 1e6 if values else None) if v]
        slowest = max(spread)
        records.append(Record(bench="checkpoint", op=what, impl=impl, ranks=ranks, bytes=total, count=rows * 1024,
                              dtype="float64", iters=1, rounds=bench.rounds, us_min=min(spread),
                              us_median=statistics.median(spread), us_max=slowest, algbw_gbs=total / slowest / 1e3,
                              wrong=wrong if impl == "hpc_c10d" and what == "read" else None))
    bench.comm.Barrier()
    if rank == 0:
        for path in (plain, ours):
            os.remove(path)
    return records
