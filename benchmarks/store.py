#!/usr/bin/env python3
"""Store latency: hpc_c10d.MPIStore vs torch.distributed.TCPStore, per operation.

Run with, e.g.::

    mpiexec -n 2 python benchmarks/store.py
    mpiexec -n 4 python benchmarks/store.py --iters 3000 --json store.json
    MPIR_CVAR_NOLOCAL=1 mpiexec -n 2 python benchmarks/store.py      # MPICH: network path

Both stores are created over all the ranks mpiexec starts. ``MPIStore()`` is created
collectively over ``COMM_WORLD`` (keys are spread over the ranks by hash). ``TCPStore`` has its
server on rank 0 (``127.0.0.1`` and a free port chosen by rank 0 and broadcast over MPI).
Every rank works on its own keys, all ranks at once (uncontended latency):

    set          store.set(f"s{rank}", <16-byte str>)
    get          store.get(f"g{rank}")          a 16-byte text value set beforehand
    get counter  store.get(f"n{rank}")          a counter created with add() beforehand
    add          store.add(f"a{rank}", 1)
    compare_set  store.compare_set(f"c{rank}", cur, nxt)   alternating between two 16-byte
                 values, so that it always succeeds

Each call is timed on its own with ``time.perf_counter``. Per op and store: ``--warmup``
untimed calls, then ``--iters`` timed calls in ``--rounds`` chunks, the two stores alternating
chunk by chunk, each chunk preceded by an MPI barrier. Reported: the median and the 90th
percentile of all ranks' samples, and the worst rank's median. Then a contended test: every
rank adds 1 to ONE shared key ``--contended-iters`` times; throughput = total adds / slowest
rank's elapsed time, and the final counter must equal ranks x iterations (exit status 1 if not,
or if any call returned a wrong value).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from datetime import timedelta

import numpy as np

from _library import load

hpc_c10d = load()

from mpi4py import MPI

comm = MPI.COMM_WORLD
perf_counter = time.perf_counter

VALUE = "0123456789abcdef"            # 16 bytes; not a decimal integer, so not a counter
CAS_VALUES = ("A" * 16, "B" * 16)     # compare_set alternates between these
COUNTER_START = 12345                 # value of the "get counter" key
OPS = ("set", "get", "get counter", "add", "compare_set")
STORES = ("MPIStore", "TCPStore")
# Settings that change the data path or progress; printed when set.
ENV_VARS = ("MPIR_CVAR_NOLOCAL", "MPIR_CVAR_CH4_NETMOD", "UCX_TLS", "FI_PROVIDER", "HPC_C10D_STORE_PROGRESS_INTERVAL",
            "MPIR_CVAR_ASYNC_PROGRESS", "MPICH_ASYNC_PROGRESS")


def key_of(op: str, rank: int) -> str:
    return {"set": "s", "get": "g", "get counter": "n", "add": "a", "compare_set": "c"}[op] + str(rank)


# --------------------------------------------------------------------------
# One timing loop per op; each call written as a user writes it. A loop records
# per-call times into ``out`` and returns the number of wrong results (checked
# outside the timed region).
# --------------------------------------------------------------------------
def loop_set(store, rank, n, out):
    key, value, fn = key_of("set", rank), VALUE, store.set
    for i in range(n):
        t0 = perf_counter()
        fn(key, value)
        out[i] = perf_counter() - t0
    return 0 if store.get(key) == VALUE.encode() else 1


def _loop_get(store, key, expected, n, out):
    fn, bad = store.get, 0
    for i in range(n):
        t0 = perf_counter()
        v = fn(key)
        out[i] = perf_counter() - t0
        bad += v != expected
    return bad


def loop_get(store, rank, n, out):
    return _loop_get(store, key_of("get", rank), VALUE.encode(), n, out)


def loop_get_counter(store, rank, n, out):
    return _loop_get(store, key_of("get counter", rank), str(COUNTER_START).encode(), n, out)


def loop_add(store, rank, n, out):
    key, fn = key_of("add", rank), store.add
    expected, bad = store.add(key, 0), 0
    for i in range(n):
        t0 = perf_counter()
        v = fn(key, 1)
        out[i] = perf_counter() - t0
        expected += 1
        bad += v != expected
    return bad


def loop_compare_set(store, rank, n, out):
    key, fn = key_of("compare_set", rank), store.compare_set
    a, b = CAS_VALUES
    cur, nxt = (a, b) if store.get(key) == a.encode() else (b, a)
    bad = 0
    for i in range(n):
        t0 = perf_counter()
        v = fn(key, cur, nxt)
        out[i] = perf_counter() - t0
        bad += v != nxt.encode()
        cur, nxt = nxt, cur
    return bad


LOOPS = {"set": loop_set, "get": loop_get, "get counter": loop_get_counter, "add": loop_add,
         "compare_set": loop_compare_set}


def prepare(store, rank):
    """Create every key the loops read before they are timed."""
    store.set(key_of("set", rank), VALUE)
    store.set(key_of("get", rank), VALUE)
    store.add(key_of("get counter", rank), COUNTER_START)
    store.add(key_of("add", rank), 0)
    store.set(key_of("compare_set", rank), CAS_VALUES[0])


def contended(store, key, iters):
    """Every rank adds 1 to ``key`` ``iters`` times; return (slowest elapsed s, final value, bad)."""
    fn, bad, last = store.add, 0, 0
    comm.Barrier()
    t0 = perf_counter()
    for _ in range(iters):
        v = fn(key, 1)
        bad += v <= last  # the counter only grows: each result exceeds the previous one
        last = v
    elapsed = perf_counter() - t0
    slowest = comm.allreduce(elapsed, op=MPI.MAX)
    comm.Barrier()
    final = int(store.get(key))
    return slowest, final, bad


# --------------------------------------------------------------------------
def make_tcpstore(rank: int, size: int, use_libuv: bool | None):
    """Return a TCPStore (server on rank 0) or None if torch is unusable on some rank."""
    try:
        import torch.distributed as tdist

        ok = bool(tdist.is_available())
    except Exception:  # noqa: BLE001
        ok = False
    if not comm.allreduce(ok, op=MPI.LAND):
        return None, "torch.distributed not importable on every rank"
    hosts = comm.allgather(socket.gethostname())
    host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    port = None
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host if host == "127.0.0.1" else "", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    kw = {} if use_libuv is None else {"use_libuv": use_libuv}
    store = tdist.TCPStore(host, port, size, is_master=(rank == 0), timeout=timedelta(seconds=60),
                           wait_for_workers=True, **kw)
    return store, f"{host}:{port}"


def stats(samples_by_rank: list[np.ndarray]) -> dict:
    us = np.concatenate(samples_by_rank) * 1e6
    per_rank = [float(np.median(s) * 1e6) for s in samples_by_rank]
    return {
        "median": float(np.median(us)), "p90": float(np.percentile(us, 90)),
        "p99": float(np.percentile(us, 99)), "min": float(us.min()), "mean": float(us.mean()),
        "worst_rank_median": max(per_rank), "per_rank_median": per_rank, "samples": int(us.size),
    }


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=3000, help="timed calls per op, store and rank (default 3000)")
    ap.add_argument("--warmup", type=int, default=200, help="untimed calls per op and store first (default 200)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="chunks the timed calls are split into, alternating between the stores (default 3)")
    ap.add_argument("--contended-iters", type=int, default=2000,
                    help="adds per rank to the one shared key (default 2000)")
    ap.add_argument("--tcp-libuv", choices=("default", "on", "off"), default="default",
                    help="TCPStore server backend: torch's default (libuv), or force use_libuv on/off")
    ap.add_argument("--no-torch", action="store_true", help="skip TCPStore (and torch entirely)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON (rank 0)")
    args = ap.parse_args()
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0 or args.contended_iters < 1:
        ap.error("--iters, --rounds and --contended-iters must be >= 1, --warmup >= 0")
    rounds = min(args.rounds, args.iters)

    rank, size = comm.Get_rank(), comm.Get_size()
    t_start = perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None

    stores = {"MPIStore": hpc_c10d.MPIStore()}
    tcp_note = "--no-torch given"
    if not args.no_torch:
        libuv = {"default": None, "on": True, "off": False}[args.tcp_libuv]
        tcp, tcp_note = make_tcpstore(rank, size, libuv)
        if tcp is not None:
            stores["TCPStore"] = tcp
    names = [s for s in STORES if s in stores]

    mpistore = stores["MPIStore"]
    local = {op: comm.allgather(mpistore.owner(key_of(op, rank)) == rank) for op in OPS}
    local["contended add"] = [mpistore.owner("contended") == r for r in range(size)]

    for name in names:
        prepare(stores[name], rank)
    comm.Barrier()

    # Uncontended latency: per op, warm-up, then rounds alternating between the stores.
    chunks = [args.iters // rounds + (i < args.iters % rounds) for i in range(rounds)]
    results, failures = {}, []
    for op in OPS:
        loop = LOOPS[op]
        samples = {name: np.empty(args.iters) for name in names}
        bad = {name: 0 for name in names}
        if args.warmup:
            scratch = np.empty(args.warmup)
            for name in names:
                comm.Barrier()
                bad[name] += loop(stores[name], rank, args.warmup, scratch)
        at = 0
        for r, n in enumerate(chunks):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                comm.Barrier()
                bad[name] += loop(stores[name], rank, n, samples[name][at:at + n])
            at += n
        results[op] = {}
        for name in names:
            every = comm.gather(samples[name], root=0)
            wrong = comm.allreduce(bad[name], op=MPI.SUM)
            if wrong:
                failures.append(f"{name} {op}: {wrong} wrong results")
            if rank == 0:
                results[op][name] = stats(every)
                results[op][name]["wrong_results"] = wrong

    # Contended adds on one shared key (a small untimed warm-up on another key first).
    throughput = {}
    for name in names:
        store = stores[name]
        for _ in range(min(50, args.contended_iters)):
            store.add("contended-warmup", 1)
        slowest, final, bad = contended(store, "contended", args.contended_iters)
        bad = comm.allreduce(bad, op=MPI.SUM)
        expected = size * args.contended_iters
        if final != expected:
            failures.append(f"{name} contended add: final counter {final}, expected {expected}")
        if bad:
            failures.append(f"{name} contended add: {bad} results not larger than the previous one")
        throughput[name] = {"adds_per_s": expected / slowest, "elapsed_s": slowest, "final": final,
                            "expected": expected, "non_monotonic_results": bad}
    elapsed = perf_counter() - t_start
    load = {"start": load_start, "end": os.getloadavg() if load_start is not None else None}

    if rank == 0:
        try:
            report(args, size, names, results, throughput, local, tcp_note, stores, failures, elapsed, load)
        except Exception:  # noqa: BLE001 - keep going: the other ranks wait in the teardown below
            import traceback

            traceback.print_exc()
            failures.append("report failed")

    # Teardown: MPIStore collectively; TCPStore clients before the server.
    comm.Barrier()
    mpistore.close()
    if "TCPStore" in stores:
        tcp = stores.pop("TCPStore")
        if rank != 0:
            del tcp
        comm.Barrier()
        if rank == 0:
            del tcp
    failed = comm.allreduce(bool(failures), op=MPI.LOR)
    return 1 if failed else 0


def environment(size: int, names, stores, tcp_note: str) -> dict:
    import mpi4py

    env = {
        "ranks": size, "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi4py": mpi4py.__version__, "thread_level": ("single", "funneled", "serialized", "multiple")[MPI.Query_thread()],
        "hpc_c10d": getattr(hpc_c10d, "__version__", None), "python": platform.python_version(),
        "numpy": np.__version__, "cpus": os.cpu_count(), "host": platform.node(),
        "torch": getattr(sys.modules.get("torch"), "__version__", None),
        "tcpstore": None,
    }
    for var in ENV_VARS:
        if var in os.environ:
            env[var] = os.environ[var]
    if "TCPStore" in names:
        env["tcpstore"] = {"address": tcp_note, "libuv": bool(getattr(stores["TCPStore"], "libuvBackend", None))}
    else:
        env["tcpstore_skipped"] = tcp_note
    return env


def report(args, size, names, results, throughput, local, tcp_note, stores, failures, elapsed, load) -> None:
    env = environment(size, names, stores, tcp_note)
    env["loadavg"] = load
    print(f"# store latency: hpc_c10d {env['hpc_c10d']} MPIStore"
          + (f" vs torch {env['torch']} TCPStore (server on rank 0, {'libuv' if env['tcpstore']['libuv'] else 'classic'} backend)"
             if "TCPStore" in names else f" only (TCPStore skipped: {tcp_note})"))
    print(f"# {size} ranks on {env['cpus']} CPUs, {env['mpi_library']}, thread level {env['thread_level']}, "
          f"mpi4py {env['mpi4py']}, Python {env['python']}, host {env['host']}")
    extra = [f"{k}={env[k]}" for k in ENV_VARS if k in env]
    print("# environment: " + (", ".join(extra) if extra else "MPIR_CVAR_NOLOCAL not set"))
    if size > (env["cpus"] or size):
        print(f"# WARNING: {size} ranks on {env['cpus']} CPUs: oversubscribed, latencies include scheduling")
    if load["start"] is not None:
        print("# load average (1, 5, 15 min) at start {}, at end {} (other work on the machine shows here)".format(
            *(", ".join(f"{x:.2f}" for x in load[k]) for k in ("start", "end"))))
    print(f"# per-call latency in us, {args.iters} timed calls per rank per op ({args.rounds} rounds, "
          f"stores alternating) after {args.warmup} warm-up calls; all ranks at once, each on its own key")
    print("# MPIStore key owners are chosen by hash; own key local on: "
          + ", ".join(f"{op} {sum(local[op])}/{size}" for op in OPS))

    cols = ["op"]
    for name in names:
        cols += [f"{name} median us", f"{name} p90 us", f"{name} worst-rank median us"]
    if len(names) == 2:
        cols.append("ratio MPIStore / TCPStore (median)")
    print()
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "|".join(["---:"] * (len(cols) - 1)) + "|")
    for op in OPS:
        row = results[op]
        cells = [op]
        for name in names:
            cells += [fmt(row[name]["median"]), fmt(row[name]["p90"]), fmt(row[name]["worst_rank_median"])]
        if len(names) == 2:
            cells.append(f"{row['MPIStore']['median'] / row['TCPStore']['median']:.2f}")
        print("| " + " | ".join(cells) + " |")

    print()
    cols = ["contended add (one key)"] + [f"{name} adds/s" for name in names]
    if len(names) == 2:
        cols.append("ratio MPIStore / TCPStore (throughput)")
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "|".join(["---:"] * (len(cols) - 1)) + "|")
    cells = [f"{size} ranks x {args.contended_iters}"] + [f"{throughput[n]['adds_per_s']:.0f}" for n in names]
    if len(names) == 2:
        cells.append(f"{throughput['MPIStore']['adds_per_s'] / throughput['TCPStore']['adds_per_s']:.2f}")
    print("| " + " | ".join(cells) + " |")
    owner = [r for r in range(size) if local["contended add"][r]]
    print(f"(shared key owned by MPIStore rank {owner[0] if owner else '?'}; final counters: "
          + ", ".join(f"{n} {throughput[n]['final']}/{throughput[n]['expected']}" for n in names) + ")")

    print("\nMPIStore per-rank medians, us (* = the rank's own key is in its own window):")
    print("| op | " + " | ".join(f"rank {r}" for r in range(size)) + " |")
    print("|---|" + "|".join(["---:"] * size) + "|")
    for op in OPS:
        med = results[op]["MPIStore"]["per_rank_median"]
        print(f"| {op} | " + " | ".join(f"{fmt(m)}{'*' if local[op][r] else ''}" for r, m in enumerate(med)) + " |")

    if len(names) == 2:
        print("\ntarget (informational): MPIStore median <= 0.5 x TCPStore for get and add")
        for op in ("get", "get counter", "add"):
            ratio = results[op]["MPIStore"]["median"] / results[op]["TCPStore"]["median"]
            print(f"  {op:<12} ratio {ratio:.2f}  {'met' if ratio <= 0.5 else 'NOT met'}")
    print(f"\n({elapsed:.0f} s)")
    for f in failures:
        print(f"ERROR: {f}")
    sys.stdout.flush()

    if args.json:
        doc = {"meta": {**env, "iters": args.iters, "warmup": args.warmup, "rounds": args.rounds,
                        "contended_iters": args.contended_iters, "elapsed_s": elapsed,
                        "value_bytes": len(VALUE), "statistic": "per-call perf_counter times, all ranks pooled"},
               "local_keys": local, "latency_us": results, "contended_add": throughput, "failures": failures}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
