"""Checkpoint bandwidth: ``hpc_c10d.checkpoint`` with every rank saving and loading its uneven slab,
against one process writing and reading the whole global float64 array with plain h5py, and with
``--compare`` torch's own: ``torch.save``/``torch.load`` of each rank's slab to a file of its own,
and ``torch.distributed.checkpoint`` (DCP) saving and loading the slabs in place.

With ``--device cuda`` the slabs are CUDA arrays (torch tensors where torch is installed, else
cupy). What the times include: docs/architecture.md, "The bench".
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from typing import Any, Callable

import numpy as np

from .optional import unimportable
from .report import Record
from .sweep import Sweep
from .torch_side import as_tensor

__all__ = ["run", "unusable", "TORCH_SAVERS"]

TORCH_SAVERS = ("torch.save", "dcp")  # what --compare may name


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


def _on_device(host: np.ndarray, device: str) -> Any:
    """``host`` where the benchmark keeps its slab: itself on the CPU, a CUDA array on the GPU."""
    if device == "cpu":
        return host
    try:
        import torch
    except ImportError:
        import cupy

        return cupy.asarray(host)
    return torch.from_numpy(host).to(f"cuda:{torch.cuda.current_device()}")


def _torch_actions(mine: Any, directory: str, rank: int, compare: list[str]) -> dict[tuple[str, str], Callable]:
    """torch.save/torch.load of this rank's slab to its own file, and DCP saving and loading it in place."""
    if not compare:
        return {}
    import torch
    import torch.distributed.checkpoint as dcp

    tensor = mine if isinstance(mine, torch.Tensor) else as_tensor(mine)
    state = {f"x{rank}": tensor}  # a key per rank: each writes its own slab, as hpc_c10d's Shard does
    pickled = os.path.join(directory, f"bench-torch-{rank}.pt")
    shards = os.path.join(directory, "bench-dcp")
    actions = {}
    if "torch.save" in compare:
        actions["write", "torch.save"] = lambda: torch.save(tensor, pickled)
        actions["read", "torch.save"] = lambda: tensor.copy_(torch.load(pickled, map_location=tensor.device))
    if "dcp" in compare:
        actions["write", "dcp"] = lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(shards, overwrite=True))
        actions["read", "dcp"] = lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(shards))
    return actions


def run(bench: Sweep, nbytes: int, directory: str, compare: list[str]) -> list[Record]:
    """Write then read ``nbytes`` of float64, ``bench.rounds`` times, every way."""
    import h5py

    from ..checkpoint import Shard, load, save
    from ..checkpoint.host import to_host

    rank, ranks = bench.rank, bench.size
    rows = max(ranks, nbytes // 8 // 1024)
    mine = _on_device(np.random.default_rng(rank).standard_normal((_slabs(rows, ranks)[rank], 1024)), bench.device)
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
               ("read", "hpc_c10d"): lambda: load({"x": Shard(mine)}, ours), ("read", "h5py"): read_plain,
               **_torch_actions(mine, directory, rank, compare)}
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in actions}
    sync = bench.sync()
    bench.progress.total = bench.rounds
    for round_ in range(bench.rounds):
        for (what, impl), action in actions.items():
            bench.comm.Barrier()
            if impl == "h5py" and rank != 0:  # one process alone, as a user of plain h5py would
                continue
            start = time.perf_counter()
            action()
            if sync is not None:
                sync()
            seconds[what, impl].append(time.perf_counter() - start)
        bench.progress.step(f"round {round_ + 1}")
    expected = np.random.default_rng(rank).standard_normal((_slabs(rows, ranks)[rank], 1024))
    wrong = bench.comm.allreduce(int(np.count_nonzero(to_host(mine) != expected)))
    total = rows * 1024 * 8
    records = []
    for (what, impl), values in seconds.items():
        spread = [v for v in bench.comm.allgather(statistics.median(values) * 1e6 if values else None) if v]
        slowest = max(spread)
        records.append(Record(bench="checkpoint", op=what, impl=impl, ranks=ranks, bytes=total, count=rows * 1024,
                              dtype="float64", iters=1, rounds=bench.rounds, us_min=min(spread),
                              us_median=statistics.median(spread), us_max=slowest, algbw_gbs=total / slowest / 1e3,
                              device=bench.device, wrong=wrong if impl == "hpc_c10d" and what == "read" else None))
    bench.comm.Barrier()
    if rank == 0:
        for path in (plain, ours):
            os.remove(path)
        shutil.rmtree(os.path.join(directory, "bench-dcp"), ignore_errors=True)
    if "torch.save" in compare:
        os.remove(os.path.join(directory, f"bench-torch-{rank}.pt"))
    return records
