#!/usr/bin/env python3
"""All-reduce latency: hpc_c10d vs raw mpi4py (vs torch.distributed gloo), interleaved.

Run with, e.g.::

    mpiexec -n 2 python benchmarks/allreduce.py
    mpiexec -n 2 python benchmarks/allreduce.py --max-bytes 1MiB --json allreduce.json

Every implementation reduces (SUM, in place) the *same* float32 buffer of the same size:

    raw         comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    dist        dist.all_reduce(x)
    raw async   comm.Iallreduce(MPI.IN_PLACE, x, op=MPI.SUM).Wait()
    dist async  dist.all_reduce(x, async_op=True).wait()
    gloo        torch.distributed.all_reduce(t)                        (t = torch.from_numpy(x))
    gloo async  torch.distributed.all_reduce(t, async_op=True).wait()

``x`` is a numpy array (``--dist-input torch`` hands dist the torch tensor ``t`` instead;
``both`` times both).  Each call is written out literally in its own timing loop, exactly
as a user writes it.  Method: per size, a correctness check of every implementation, one
untimed warm-up batch each, then ``--rounds`` rounds (fewer, but at least 5, for sizes
whose rounds would overrun ``--time-budget``); in each round every implementation
(in an order rotated every round) runs one batch of ``iters`` back-to-back calls, preceded
by an MPI barrier.  A batch's per-call time is its wall time / iters on the slowest rank;
the table shows the median over rounds, in microseconds.  ``iters`` is chosen per size so
that a raw batch takes about ``--batch-ms`` (or fixed with ``--iters``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from _library import load

dist = load()

comm = MPI.COMM_WORLD
perf_counter = time.perf_counter

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 8, 4KiB, 16MiB)")
    return int(float(num) * _UNITS[unit])


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------
# Timing loops: one per implementation, each call written exactly as a user would.
# --------------------------------------------------------------------------
def loop_raw(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    return perf_counter() - t0


def loop_dist(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    return perf_counter() - t0


def loop_raw_async(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        comm.Iallreduce(MPI.IN_PLACE, x, op=MPI.SUM).Wait()
    return perf_counter() - t0


def loop_dist_async(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        dist.all_reduce(x, async_op=True).wait()
    return perf_counter() - t0


def loop_dist_torch(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    return perf_counter() - t0


def loop_dist_torch_async(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, async_op=True).wait()
    return perf_counter() - t0


tdist = None  # torch.distributed, once gloo is initialised


def loop_gloo(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        tdist.all_reduce(t)
    return perf_counter() - t0


def loop_gloo_async(x, t, iters):
    t0 = perf_counter()
    for _ in range(iters):
        tdist.all_reduce(t, async_op=True).wait()
    return perf_counter() - t0


# key -> (column label, timing loop)
IMPLS = {
    "raw": ("raw", loop_raw),
    "dist": ("dist", loop_dist),
    "dist_t": ("dist(torch)", loop_dist_torch),
    "raw_async": ("raw async", loop_raw_async),
    "dist_async": ("dist async", loop_dist_async),
    "dist_t_async": ("dist(torch) async", loop_dist_torch_async),
    "gloo": ("gloo", loop_gloo),
    "gloo_async": ("gloo async", loop_gloo_async),
}


def setup_gloo(rank: int, size: int) -> bool:
    """Initialise torch.distributed (gloo) beside MPI; return False if torch is unusable."""
    global tdist
    ok = True
    try:
        import torch
        import torch.distributed as _tdist

        ok = _tdist.is_available() and _tdist.is_gloo_available()
    except Exception:  # noqa: BLE001
        ok = False
    if not comm.allreduce(ok, op=MPI.LAND):
        return False
    torch.set_num_threads(1)
    hosts = comm.allgather(socket.gethostname())
    single_host = len(set(hosts)) == 1
    port = None
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("" if not single_host else "127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ["MASTER_ADDR"] = "127.0.0.1" if single_host else hosts[0]
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(size)
    if single_host:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from datetime import timedelta

    _tdist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=120))
    tdist = _tdist
    return True


def check(key, loop, x, t, rank, size) -> bool:
    """One call on a buffer filled with rank+1 must give sum(1..size) everywhere."""
    x[:] = rank + 1
    loop(x, t, 1)
    ok = bool(np.all(x == size * (size + 1) / 2))
    x[:] = 0
    return comm.allreduce(ok, op=MPI.LAND)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest message (default 8 B)")
    ap.add_argument("--max-bytes", type=parse_bytes, default=16 * 1024**2, help="largest message (default 16 MiB)")
    ap.add_argument("--factor", type=int, default=4, help="size step factor (default 4; the max size is always included)")
    ap.add_argument("--iters", type=int, default=0, help="calls per timed batch at every size (default: auto, see --batch-ms)")
    ap.add_argument("--batch-ms", type=float, default=10.0, help="auto mode: target duration of a raw batch (default 10 ms)")
    ap.add_argument("--max-iters", type=int, default=2000, help="auto mode: cap on calls per batch (default 2000)")
    ap.add_argument("--rounds", type=int, default=21, help="timed rounds per size and implementation (default 21)")
    ap.add_argument("--time-budget", type=float, default=90.0,
                    help="seconds for the whole sweep; large sizes get fewer rounds (>= 5) to fit (default 90; 0 = off)")
    ap.add_argument("--dist-input", choices=("numpy", "torch", "both"), default="numpy",
                    help="what dist.all_reduce gets: the numpy array, a torch tensor on the same memory, or both")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.distributed gloo (and torch entirely)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON (rank 0)")
    args = ap.parse_args()

    rank, size = comm.Get_rank(), comm.Get_size()
    dist.init_process_group()
    assert dist.get_world_size() == size and dist.get_rank() == rank, "hpc_c10d and MPI disagree on rank/size"

    use_torch = not args.no_torch and setup_gloo(rank, size)
    dist_input = args.dist_input if use_torch else "numpy"
    keys = ["raw"]
    keys += ["dist"] if dist_input in ("numpy", "both") else []
    keys += ["dist_t"] if dist_input in ("torch", "both") else []
    keys += ["raw_async"]
    keys += ["dist_async"] if dist_input in ("numpy", "both") else []
    keys += ["dist_t_async"] if dist_input in ("torch", "both") else []
    keys += ["gloo", "gloo_async"] if use_torch else []

    itemsize = 4
    sizes, nb = [], max(itemsize, args.min_bytes)
    while nb <= args.max_bytes:
        sizes.append(nb)
        nb *= max(2, args.factor)
    if not sizes or sizes[-1] != args.max_bytes and args.max_bytes >= itemsize:
        sizes.append(args.max_bytes)
    sizes = [s - s % itemsize for s in sizes]

    buf = np.zeros(max(sizes) // itemsize, dtype=np.float32)
    tbuf = None
    if use_torch:
        import torch

        tbuf = torch.from_numpy(buf)  # shares memory with buf

    if rank == 0:
        import mpi4py

        lib = MPI.Get_library_version().strip().splitlines()[0]
        print(f"# all_reduce (SUM, in place, float32): hpc_c10d {getattr(dist, '__version__', '?')} vs mpi4py {mpi4py.__version__}"
              + (f" vs torch {sys.modules['torch'].__version__} gloo" if use_torch else ""))
        print(f"# {size} ranks, {lib}, Python {platform.python_version()}, numpy {np.__version__}, host {platform.node()}")
        print(f"# median per-call time in us over (up to) {args.rounds} interleaved rounds (slowest rank per batch); "
              f"dist input: {dist_input}", flush=True)

    # Global warm-up at the smallest size: first-call costs (connection setup in gloo,
    # lazy initialisation anywhere) stay out of every measurement and estimate.
    for key in keys:
        comm.Barrier()
        IMPLS[key][1](buf[: sizes[0] // itemsize], tbuf[: sizes[0] // itemsize] if tbuf is not None else None, 20)

    t_all = perf_counter()
    results = []
    failures = []
    for nbytes in sizes:
        n = nbytes // itemsize
        x = buf[:n]
        t = tbuf[:n] if tbuf is not None else None

        for key in keys:
            if not check(key, IMPLS[key][1], x, t, rank, size):
                failures.append((nbytes, key))
                if rank == 0:
                    print(f"# WRONG RESULT: {IMPLS[key][0]} at {fmt_bytes(nbytes)}", flush=True)

        # Calibrate: calls per batch so that a raw batch takes ~batch_ms (agreed by all ranks).
        if args.iters > 0:
            iters = args.iters
        else:
            k, dt = 1, 0.0
            while True:
                comm.Barrier()
                dt = comm.allreduce(loop_raw(x, t, k), op=MPI.MAX)
                if dt >= 2e-3 or k >= args.max_iters:
                    break
                k *= 4
            for _ in range(2):  # best of three, against a noisy first measurement
                comm.Barrier()
                dt = min(dt, comm.allreduce(loop_raw(x, t, k), op=MPI.MAX))
            per_call = dt / k
            iters = int(min(args.max_iters, max(1, round(args.batch_ms * 1e-3 / per_call))))

        # Warm-up: one untimed batch of each implementation (also estimates a round's cost).
        warm = np.zeros(len(keys))
        for i, key in enumerate(keys):
            comm.Barrier()
            calls = max(1, iters // 2 if not key.startswith("gloo") else min(iters // 2, 20))
            warm[i] = IMPLS[key][1](x, t, calls) / calls
        comm.Allreduce(MPI.IN_PLACE, warm, op=MPI.MAX)
        # raw and dist run the same number of calls per batch; gloo, only a reference and often
        # far slower, gets its own count so that its batches also take about --batch-ms.
        its = {key: iters for key in keys}
        if args.iters <= 0:
            for i, key in enumerate(keys):
                if key.startswith("gloo"):
                    its[key] = int(max(1, min(iters, round(args.batch_ms * 1e-3 / warm[i]))))
        rounds = args.rounds
        if args.time_budget > 0:
            share = (args.time_budget - (perf_counter() - t_all)) / (len(sizes) - sizes.index(nbytes))
            est_round = sum(float(warm[i]) * its[k] for i, k in enumerate(keys)) + len(keys) * 50e-6
            rounds = max(min(args.rounds, 5), min(args.rounds, int(share / est_round)))
        rounds = comm.bcast(rounds, root=0)

        times = {key: [] for key in keys}
        for r in range(rounds):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            for key in order:
                loop, n_calls = IMPLS[key][1], its[key]
                comm.Barrier()
                times[key].append(loop(x, t, n_calls) / n_calls)

        # Slowest rank per batch, then median over rounds.
        local = np.array([times[k] for k in keys])
        worst = np.empty_like(local)
        comm.Allreduce(local, worst, op=MPI.MAX)
        row = {"bytes": nbytes, "elements": n, "iters": iters, "iters_by_impl": its, "rounds": rounds, "us": {}}
        for i, key in enumerate(keys):
            us = worst[i] * 1e6
            row["us"][key] = {
                "median": float(statistics.median(us)), "min": float(us.min()), "max": float(us.max()),
                "q1": float(np.percentile(us, 25)), "q3": float(np.percentile(us, 75)),
            }
        results.append(row)
        if rank == 0:
            med = {k: v["median"] for k, v in row["us"].items()}
            print(f"#   {fmt_bytes(nbytes):>8}: " + ", ".join(f"{IMPLS[k][0]} {med[k]:.1f}" for k in keys), flush=True)
    elapsed = perf_counter() - t_all

    if rank == 0:
        print_table(results, keys)
        print(f"\n({elapsed:.0f} s; dist/raw > 1 means hpc_c10d is slower than raw mpi4py)")
        if failures:
            print("WRONG RESULTS: " + ", ".join(f"{IMPLS[k][0]}@{fmt_bytes(b)}" for b, k in failures))
        if args.json:
            meta = {
                "world_size": size, "mpi_library": MPI.Get_library_version().strip(),
                "hpc_c10d": getattr(dist, "__version__", None), "python": platform.python_version(),
                "numpy": np.__version__, "torch": sys.modules["torch"].__version__ if use_torch else None,
                "dtype": "float32", "op": "SUM", "in_place": True, "dist_input": dist_input,
                "rounds": args.rounds, "statistic": "median over rounds of per-call time (slowest rank per batch)",
                "elapsed_s": elapsed, "failures": [[b, k] for b, k in failures],
            }
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "results": results}, fh, indent=1)
            print(f"wrote {args.json}")

    if use_torch:
        tdist.destroy_process_group()
    dist.destroy_process_group()
    return 1 if failures else 0


def print_table(results, keys) -> None:
    cols = ["size", "iters x rounds"] + [IMPLS[k][0] + " us" for k in keys]
    ratio_pairs = []
    for d, r in (("dist", "raw"), ("dist_t", "raw"), ("dist_async", "raw_async"), ("dist_t_async", "raw_async")):
        if d in keys and r in keys:
            ratio_pairs.append((d, r))
            cols.append(f"{IMPLS[d][0]} / {IMPLS[r][0]}")
    print()
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join(["---:"] * len(cols)) + "|")
    for row in results:
        med = {k: row["us"][k]["median"] for k in keys}
        cells = [fmt_bytes(row["bytes"]), f"{row['iters']} x {row['rounds']}"]
        cells += [f"{med[k]:.1f}" if med[k] < 1000 else f"{med[k]:.0f}" for k in keys]
        cells += [f"{med[d] / med[r]:.2f}" for d, r in ratio_pairs]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
