"""Start-up at scale: one launch per world size and implementation, each rank timing
``init_process_group`` plus a first all_reduce, then one store ``set``, a ``get`` of its neighbour's
key (which waits for it) and an ``add`` to one shared counter.

The sweep runs outside MPI and starts every job itself (``mpiexec``, or ``srun`` inside an
allocation). What each side's time includes: docs/architecture.md, "The bench".
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from .report import Progress, Record

__all__ = ["sweep", "child", "PHASES", "launcher_command"]

#: what a child measures, in this order
PHASES = ("init + first all_reduce", "store set", "store get (neighbour)", "store add (shared)")
_LAUNCH = "launch to exit"


def _timed_phases(init: Callable[[], tuple[int, int]], all_reduce: Callable[[], object],
                  store_of: Callable[[], Any]) -> tuple[int, list[float]]:
    """(rank, seconds for each of PHASES on this rank); ``init`` starts the group, returns (rank, size)."""
    clock = time.perf_counter
    start = clock()
    rank, size = init()
    all_reduce()
    marks = [clock()]
    store = store_of()
    store.set(f"startup/{rank}", "x" * 16)
    marks.append(clock())
    store.get(f"startup/{(rank + 1) % size}")
    marks.append(clock())
    store.add("startup/count", 1)
    marks.append(clock())
    return rank, [b - a for a, b in zip([start] + marks, marks)]


def _hpc_c10d() -> tuple[Any, Callable[[], tuple[int, int]], Callable[[], object]]:
    """hpc_c10d as the module to finish with, how it starts (rank, size) and a first all_reduce."""
    import numpy as np

    import hpc_c10d

    def init() -> tuple[int, int]:
        hpc_c10d.init_process_group()
        return hpc_c10d.get_rank(), hpc_c10d.get_world_size()

    return hpc_c10d, init, partial(hpc_c10d.all_reduce, np.ones(1, np.float32))


def _torch() -> tuple[Any, Callable[[], tuple[int, int]], Callable[[], object]]:
    """torch.distributed the same way: gloo through the default env:// rendezvous."""
    from datetime import timedelta

    import torch
    import torch.distributed as tdist

    from ..job.jobenv import detect

    job = detect()
    torch.set_num_threads(1)

    def init() -> tuple[int, int]:
        tdist.init_process_group("gloo", rank=job.env_rank, world_size=job.env_size, timeout=timedelta(seconds=600))
        return tdist.get_rank(), tdist.get_world_size()

    return tdist, init, partial(tdist.all_reduce, torch.ones(1))


def child(impl: str, out_dir: str) -> int:
    """One rank of a start-up job: measure, write ``<out_dir>/<impl>-<rank>.json``, finish cleanly."""
    api, init, all_reduce = _torch() if impl == "torch" else _hpc_c10d()
    rank, phases = _timed_phases(init, all_reduce, api.distributed_c10d._get_default_store)
    api.barrier()
    Path(out_dir, f"{impl}-{rank}.json").write_text(json.dumps(phases))
    api.destroy_process_group()
    return 0


def launcher_command(launcher: str, ranks: int) -> list[str]:
    """The command that starts ``ranks`` processes here (``srun`` may put more than one on a CPU)."""
    if launcher == "srun":
        return ["srun", "-n", str(ranks), "--overcommit", f"--mpi={_srun_plugin()}", "--kill-on-bad-exit=1"]
    beside = Path(sys.executable).parent / "mpiexec"
    return [str(beside) if beside.exists() else shutil.which("mpiexec") or "mpiexec", "-n", str(ranks)]


def _srun_plugin() -> str:
    """srun's --mpi for the MPI mpi4py runs on: $SLURM_MPI_TYPE if set, else pmix for Open MPI and
    pmi2 for MPICH and the MPIs built on it."""
    chosen = os.environ.get("SLURM_MPI_TYPE")
    if chosen:
        return chosen
    import mpi4py

    mpi4py.rc.initialize = False  # this process only launches jobs: it never starts MPI itself
    from mpi4py import MPI

    return "pmix" if MPI.Get_library_version().startswith("Open MPI") else "pmi2"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _LaunchFailed(Exception):
    """A start-up job that did not finish, or not with every rank's times; the message says how."""


def _launch(impl: str, ranks: int, launcher: str, timeout_s: float) -> tuple[list[list[float]], float]:
    """Run one job; (per-rank phase seconds, wall seconds)."""
    with tempfile.TemporaryDirectory(prefix="hpc_c10d-startup-") as out_dir:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        command = ["timeout", "-k", "10", str(int(timeout_s)), *launcher_command(launcher, ranks), sys.executable,
                   "-m", "hpc_c10d", "bench", "startup", "--child", impl, "--out-dir", out_dir]
        begin = time.perf_counter()
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        wall = time.perf_counter() - begin
        files = sorted(Path(out_dir).glob(f"{impl}-*.json"))
        if done.returncode or len(files) != ranks:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            why = "timed out" if done.returncode in (124, 137) else f"exit status {done.returncode}"
            raise _LaunchFailed(f"{ranks} ranks: {why}, {len(files)}/{ranks} ranks reported; " + " | ".join(tail))
        return [json.loads(f.read_text()) for f in files], wall


def _phase_records(impl: str, ranks: int, runs: list[list[list[float]]], walls: list[float]) -> list[Record]:
    """Each phase's min/median/max over ranks (median over the runs), then the launch's wall time."""
    records = []
    for index, phase in enumerate(PHASES):
        spreads = [[min(v), statistics.median(v), max(v)] for v in ([r[index] for r in run] for run in runs)]
        low, mid, high = (statistics.median(column) * 1e6 for column in zip(*spreads))
        records.append(Record(bench="startup", op=phase, impl=impl, ranks=ranks, iters=1, rounds=len(runs),
                              us_min=low, us_median=mid, us_max=high))
    wall = statistics.median(walls) * 1e6
    records.append(Record(bench="startup", op=_LAUNCH, impl=impl, ranks=ranks, iters=1, rounds=len(runs),
                          us_min=wall, us_median=wall, us_max=wall))
    return records


def sweep(rank_counts: list[int], impls: list[str], launcher: str, repeats: int, timeout_s: float,
          progress: Progress) -> list[Record]:
    """Launch every (ranks, implementation) ``repeats`` times, alternating implementations; records
    give each phase's min/median/max over ranks (median over repeats) and the launch's wall time."""
    progress.total = len(rank_counts) * len(impls) * repeats
    records = []
    for ranks in rank_counts:
        for impl in impls:
            runs, walls = [], []
            try:
                for _ in range(repeats):
                    per_rank, wall = _launch(impl, ranks, launcher, timeout_s)
                    progress.step(f"{impl} at {ranks} ranks")
                    runs.append(per_rank)
                    walls.append(wall)
            except _LaunchFailed as failure:
                progress.step(f"{impl} at {ranks} ranks FAILED")
                records.append(Record(bench="startup", op=PHASES[0], impl=impl, ranks=ranks, note=str(failure)))
                continue
            records += _phase_records(impl, ranks, runs, walls)
    return records
