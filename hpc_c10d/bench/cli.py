"""``python -m hpc_c10d bench SUB-BENCHMARK [options]``: parse, run on every rank, report on rank 0."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
from typing import Any

import numpy as np

from .collective_ops import COLLECTIVES, REDUCTIONS
from .p2p import P2P_OPS
from .report import Progress, Record, table, write_csv, write_json, wrong_total
from .stores import STORE_OPS
from .sweep import BASELINE, Sweep
from .units import parse_bytes, parse_range

__all__ = ["main", "parser"]

_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
_COMPARABLE = ("mpi4py", "torch")
_GPU_ONLY = ("nccl",)  # the direct NCCL call, beside hpc_c10d's all_reduce on --device cuda


def _choices(allowed: tuple[str, ...], everything: str = "all"):
    """A comma-separated list drawn from ``allowed`` (``all``: every one)."""

    def parse(text: str) -> list[str]:
        items = list(allowed) if text == everything else [t.strip() for t in text.split(",") if t.strip()]
        unknown = [t for t in items if t not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or 'empty list'}; choose from "
                                             f"{', '.join(allowed)} or {everything}")
        return items

    return parse


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _growth(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text}: the size step factor must be at least 2")
    return value


def _rank_counts(text: str) -> list[int]:
    """``2:64`` → 2, 4, ..., 64 (doubling); ``2,3,5`` → those."""
    try:
        counts = [int(p) for p in text.replace(":", ",").split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or (":" in text and (len(counts) != 2 or counts[0] > counts[1])):
        raise argparse.ArgumentTypeError(f"bad rank counts {text!r}: use e.g. 2:64 or 2,3,4")
    if ":" in text:
        low, high = counts
        counts = [low << k for k in range((high // low).bit_length()) if low << k < high] + [high]
    return counts


def _output_options(sub: argparse.ArgumentParser) -> None:
    out = sub.add_argument_group("output (rank 0)")
    out.add_argument("--format", choices=("table", "json", "csv"), default="table", help="what goes to stdout")
    out.add_argument("--json", metavar="PATH", help="also write JSON here")
    out.add_argument("--csv", metavar="PATH", help="also write CSV here")
    out.add_argument("--plot", metavar="PNG", help="also draw a plot (needs matplotlib)")
    out.add_argument("--plot-metric", choices=("auto", "busbw", "time"), default="auto")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def _compare_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--compare", nargs="?", const=list(_COMPARABLE), default=[],
                     type=_choices(_COMPARABLE + _GPU_ONLY), metavar="IMPLS",
                     help="also run raw mpi4py and torch.distributed (default both; torch only where installed); "
                          "with --device cuda, 'nccl' adds the direct ncclAllReduce call")


def _timing_options(sub: argparse.ArgumentParser, rounds: int) -> None:
    timing = sub.add_argument_group("timing")
    timing.add_argument("-n", "--iters", type=_non_negative, default=0,
                        help="calls per timed batch (default 0: calibrated)")
    timing.add_argument("--batch-ms", type=float, default=10.0, help="calibrated batches last about this long")
    timing.add_argument("--max-iters", type=_positive, default=2000, help="cap on calibrated calls per batch")
    timing.add_argument("-w", "--warmup", type=_non_negative, default=5,
                        help="untimed calls first, per size (default 5)")
    timing.add_argument("-r", "--rounds", type=_positive, default=rounds, help=f"timed batches (default {rounds})")


def _sized_options(sub: argparse.ArgumentParser, ops: tuple[str, ...], default_ops: str, sizes: str = "8:4M",
                   factor: int = 4) -> None:
    sub.add_argument("--ops", type=_choices(ops), default=default_ops, help=f"{', '.join(ops)} or all")
    sub.add_argument("-b", "--sizes", type=parse_range, default=sizes, metavar="MIN:MAX",
                     help=f"bytes, e.g. 8:256M (default {sizes})")
    sub.add_argument("-f", "--factor", type=_growth, default=factor, help=f"size step factor (default {factor})")
    sub.add_argument("-d", "--dtype", choices=_DTYPES, default="float32")
    sub.add_argument("--device", choices=("cpu", "cuda"), default="cpu")


def _reduction_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("-o", "--redop", choices=tuple(REDUCTIONS), default="sum")
    sub.add_argument("-a", "--async", dest="async_op", action="store_true", help="async_op=True and wait()")


def parser() -> argparse.ArgumentParser:
    """The bench's argument parser (its sub-commands are the sub-benchmarks)."""
    top = argparse.ArgumentParser(prog="python -m hpc_c10d bench", description=__doc__.split("\n")[0])
    subs = top.add_subparsers(dest="bench", required=True)

    coll = subs.add_parser("collectives", help="collectives over a size sweep (nccl-tests columns)")
    _sized_options(coll, tuple(COLLECTIVES), "all_reduce")
    _reduction_options(coll)
    _timing_options(coll, 11)
    _output_options(coll)
    _compare_option(coll)

    plug = subs.add_parser("torch", help="torch.distributed on backend 'hpc' (the plugin) vs gloo vs raw "
                                         "mpi4py, and a DDP step")
    _sized_options(plug, tuple(COLLECTIVES), "all_reduce", sizes="8:1M", factor=128)
    _reduction_options(plug)
    plug.add_argument("--ddp-batch", type=_non_negative, default=32, help="rows per rank in the DDP step (0: no DDP)")
    _timing_options(plug, 11)
    _output_options(plug)

    p2p = subs.add_parser("p2p", help="send/recv latency and bandwidth between rank pairs (OSU style)")
    _sized_options(p2p, P2P_OPS, "all")
    _timing_options(p2p, 11)
    _output_options(p2p)
    _compare_option(p2p)

    stores = subs.add_parser("stores", help="MPIStore operations (vs TCPStore with --compare)")
    stores.add_argument("--ops", type=_choices(STORE_OPS), default="all", help=f"{', '.join(STORE_OPS)} or all")
    stores.add_argument("--tcp-libuv", choices=("default", "on", "off"), default="default")
    _timing_options(stores, 5)
    _output_options(stores)
    _compare_option(stores)

    start = subs.add_parser("startup", help="init + first collective + store ops, swept over world sizes "
                                            "(run as ONE process: it launches the jobs)")
    start.add_argument("--ranks", type=_rank_counts, default="2:16", help="e.g. 2:64 (doubling) or 2,3,4")
    start.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto",
                       help="auto: srun inside a SLURM allocation, else mpiexec")
    start.add_argument("--repeats", type=_positive, default=3)
    start.add_argument("--timeout", type=_seconds, default=600.0, help="seconds per launch before it is killed")
    start.add_argument("--child", choices=("hpc_c10d", "torch"), help=argparse.SUPPRESS)
    start.add_argument("--out-dir", help=argparse.SUPPRESS)
    _output_options(start)
    _compare_option(start)

    ckpt = subs.add_parser("checkpoint", help="HDF5 checkpoint save/load bandwidth vs one process with h5py")
    ckpt.add_argument("--size", type=parse_bytes, default="256M", help="global array bytes (default 256M)")
    ckpt.add_argument("--dir", default=".", help="where the files go")
    ckpt.add_argument("-r", "--rounds", type=_positive, default=5)
    _output_options(ckpt)
    ckpt.set_defaults(compare=[])  # one implementation; h5py is measured inside the sub-benchmark
    return top


def _meta(args: argparse.Namespace, ranks: int, notes: dict[str, str]) -> dict[str, Any]:
    from .. import __version__

    meta = {"command": " ".join(["python -m hpc_c10d bench", *args.argv]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "ranks": ranks,
            "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "hpc_c10d": __version__, "notes": notes,
            "torch": getattr(sys.modules.get("torch"), "__version__", None)}
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        meta["mpi_library"] = MPI.Get_library_version().strip().splitlines()[0]
    return meta


def _emit(args: argparse.Namespace, records: list[Record], meta: dict[str, Any]) -> None:
    if args.format == "table":
        print(f"# {meta['command']}\n# {meta['ranks']} ranks on {meta['host']} ({meta['cpus']} CPUs), "
              f"{meta.get('mpi_library', 'no MPI in this process')}, hpc_c10d {meta['hpc_c10d']}, "
              f"torch {meta['torch'] or 'not loaded'}")
        for impl, why in meta["notes"].items():
            print(f"# {impl} left out: {why}")
        print(table(records))
        wrong = wrong_total(records)
        print(f"# {wrong} wrong results" + (" — the network or a library is BROKEN" if wrong else ""))
    elif args.format == "json":
        write_json("-", meta, records)
    else:
        write_csv("-", records)
    if args.json:
        write_json(args.json, meta, records)
    if args.csv:
        write_csv(args.csv, records)
    if args.plot:
        from .plot import plot

        plot(records, args.plot, args.plot_metric)
    sys.stdout.flush()


def _compared(args: argparse.Namespace) -> list[str]:
    return [BASELINE, *args.compare]


def _dtype(name: str) -> np.dtype:
    from ..arrays import bfloat16

    return bfloat16 if name == "bfloat16" else np.dtype(name)


def _start_torch_sub_benchmark(args: argparse.Namespace) -> tuple[Any, dict, list[str], dict, Any]:
    """bench torch: torch's default group on the plugin, gloo beside it, raw mpi4py on the world."""
    from mpi4py import MPI

    from .torch_plugin import GLOO, PLUGIN, OnGroup, start

    tdist, gloo = start()
    apis = {PLUGIN: (tdist, True), GLOO: (OnGroup(tdist, gloo), True)}
    return MPI.COMM_WORLD, apis, [PLUGIN, "mpi4py", GLOO], {}, (tdist, gloo)


def _start_hpc_c10d(args: argparse.Namespace) -> tuple[Any, dict, list[str], dict, Any]:
    """Every other sub-benchmark: hpc_c10d's world, and torch.distributed beside it when compared."""
    import hpc_c10d as dist

    dist.init_process_group()
    from mpi4py import MPI

    comm, impls, notes = MPI.COMM_WORLD, _compared(args), {}
    apis: dict[str, tuple[Any, bool]] = {BASELINE: (dist, False)}
    if args.bench == "stores" and "mpi4py" in impls:
        impls.remove("mpi4py")
        notes["mpi4py"] = "a store has no raw-MPI counterpart"
    if getattr(args, "device", "cpu") == "cuda" and "mpi4py" in impls:  # a host MPI would read device memory
        impls.remove("mpi4py")
        notes["mpi4py"] = "raw mpi4py on GPU arrays needs a CUDA-aware MPI; compare with --compare nccl"
    tdist = None
    if "torch" in impls:
        from .torch_side import init_torch, unavailable

        why = unavailable(comm)
        if why:
            impls.remove("torch")
            notes["torch"] = why
        elif args.bench != "stores":
            tdist = init_torch(comm, getattr(args, "device", "cpu"))
            apis["torch"] = (tdist, True)
    return comm, apis, impls, notes, (tdist, None)


def _run_in_job(args: argparse.Namespace) -> int:
    """Every rank: start the libraries, run the sub-benchmark, report on rank 0, shut down."""
    starter = _start_torch_sub_benchmark if args.bench == "torch" else _start_hpc_c10d
    comm, apis, impls, notes, (tdist, gloo) = starter(args)
    bench = Sweep(apis=apis, comm=comm, impls=impls, device=getattr(args, "device", "cpu"),
                  async_op=getattr(args, "async_op", False), iters=getattr(args, "iters", 1),
                  batch_s=getattr(args, "batch_ms", 10.0) / 1e3, max_iters=getattr(args, "max_iters", 1),
                  warmup=getattr(args, "warmup", 0), rounds=args.rounds,
                  progress=Progress(0, comm.Get_rank() == 0 and not args.quiet), notes=notes)
    if args.bench in ("collectives", "torch"):
        from .collectives import run

        records = run(bench, args.ops, args.sizes, args.factor, _dtype(args.dtype), args.redop, args.bench)
        if args.bench == "torch" and args.ddp_batch:
            from .torch_plugin import run_ddp

            records += run_ddp(bench, gloo, args.ddp_batch)
    elif args.bench == "p2p":
        from .p2p import run

        records = run(bench, args.ops, args.sizes, args.factor, _dtype(args.dtype))
    elif args.bench == "stores":
        from .stores import run

        records = run(bench, args.ops, {"default": None, "on": True, "off": False}[args.tcp_libuv])
    else:
        from .checkpoint import run

        records = run(bench, args.size, args.dir)
    if comm.Get_rank() == 0:
        _emit(args, records, _meta(args, comm.Get_size(), bench.notes))
    if tdist is not None:
        tdist.destroy_process_group()
    if BASELINE in apis:
        apis[BASELINE][0].destroy_process_group()
    return 1 if wrong_total(records) else 0


def _run_startup(args: argparse.Namespace) -> int:
    from ..jobenv import detect
    from .startup import child, sweep

    if args.child:
        return child(args.child, args.out_dir)
    job = detect()
    if (job.env_size or 1) > 1:
        raise SystemExit("bench startup: run it as one process (not under mpiexec/srun); it launches the jobs")
    launcher = args.launcher
    if launcher == "auto":
        launcher = "srun" if job.in_slurm_job else "mpiexec"
    impls = [i for i in _compared(args) if i != "mpi4py"]
    records = sweep(args.ranks, impls, launcher, args.repeats, args.timeout, Progress(0, not args.quiet))
    _emit(args, records, _meta(args, max(args.ranks), {}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one sub-benchmark; exit status 1 when the checking pass found wrong results."""
    argv = sys.argv[2:] if argv is None else argv
    args = parser().parse_args(argv)
    args.argv = argv
    if args.bench == "startup":
        return _run_startup(args)
    if getattr(args, "device", "cpu") == "cuda" and importlib.util.find_spec("cupy") is None:
        raise SystemExit("--device cuda needs cupy (pip install 'hpc-c10d[cuda12]' or '[cuda13]')")
    if "nccl" in getattr(args, "compare", []) and getattr(args, "device", "cpu") != "cuda":
        raise SystemExit("--compare nccl needs --device cuda")
    return _run_in_job(args)
