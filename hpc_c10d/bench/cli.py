"""``python -m hpc_c10d bench SUB-BENCHMARK [options]``: parse, run on every rank, report on rank 0.

Exit status: 0, 1 when the checking pass found wrong results, 2 when nothing was measured (a bad
option, or something the sub-benchmark needs is missing: said once, by rank 0).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from typing import Any

import numpy as np

from ..mpi import bootstrap
from . import checkpoint, collectives, p2p, stores, torch_plugin, training
from .optional import unimportable
from .options import PROG, SUB_BENCHMARKS, parser
from .report import Progress, Record, table, write_csv, write_json, wrong_total
from .sweep import BASELINE, TENSORS, Sweep
from .torch_side import torch_missing

__all__ = ["main", "parser"]

_QUIET_EXIT_DELAY_S = 1.0  # see _refuse
# the compared implementations that need torch
TORCH_IMPLS = ("torch", torch_plugin.PLUGIN, TENSORS, *checkpoint.TORCH_SAVERS)


def _meta(args: argparse.Namespace, ranks: int, notes: dict[str, str]) -> dict[str, Any]:
    from .. import __version__

    meta = {"command": " ".join([PROG, *args.argv]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "ranks": ranks,
            "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "hpc_c10d": __version__, "notes": notes,
            "torch": getattr(sys.modules.get("torch"), "__version__", None)}
    if "mpi4py.MPI" in sys.modules:
        from ..mpi.bootstrap import library_version

        meta["mpi_library"] = library_version()
    if getattr(args, "device", "cpu") == "cuda":
        meta["gpu"] = _gpu_meta()
    return meta


def _gpu_meta() -> str:
    """This rank's GPU, its driver, and the CUDA and NCCL versions in use, in one line."""
    from ..nccl import cuda, library

    runtime = cuda.cupy().cuda.runtime
    props = runtime.getDeviceProperties(runtime.getDevice())

    def version(code: int) -> str:
        return f"{code // 1000}.{code % 1000 // 10}"

    return (f"{props['name'].decode()}, driver CUDA {version(runtime.driverGetVersion())}, runtime CUDA "
            f"{version(runtime.runtimeGetVersion())}, NCCL {'.'.join(map(str, library.load().version))}")


def _emit(args: argparse.Namespace, records: list[Record], meta: dict[str, Any]) -> None:
    if args.format == "table":
        print(f"# {meta['command']}\n# {meta['ranks']} ranks on {meta['host']} ({meta['cpus']} CPUs), "
              f"{meta.get('mpi_library', 'no MPI in this process')}, hpc_c10d {meta['hpc_c10d']}, "
              f"torch {meta['torch'] or 'not loaded'}")
        if "gpu" in meta:
            print(f"# GPU: {meta['gpu']}")
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
    from ..arrays import bfloat16_dtype

    return bfloat16_dtype() if name == "bfloat16" else np.dtype(name)


def _anywhere(comm: Any, problem: str | None) -> str | None:
    """The first rank's problem, on every rank (None: no rank has one); collective."""
    return next((p for p in comm.allgather(problem) if p), None)


def _lacking(args: argparse.Namespace, ranks: int) -> str | None:
    """What this rank lacks to run the sub-benchmark as asked (None: nothing)."""
    if getattr(args, "device", "cpu") == "cuda" and (problem := unimportable("cupy", "cuda13", "cuda12")):
        return f"--device cuda: {problem}"
    if args.bench in ("torch", "training"):
        return torch_missing()
    if args.bench == "p2p" and ranks < 2:
        return "needs at least 2 ranks (it pairs rank 0 with 1, 2 with 3, ...)"
    if args.bench == "stores" and args.busy_owner and ranks < 2:
        return "--busy-owner needs at least 2 ranks (rank 0 computes, the others time store operations)"
    if args.bench == "checkpoint":
        return checkpoint.unusable(args.dir)
    if args.plot and (problem := unimportable("matplotlib", "plot")):
        return f"--plot: {problem}"
    return None


def _refuse(args: argparse.Namespace, problem: str, says: bool) -> int:
    """Say why the sub-benchmark cannot run (where ``says``: one process of the job), return exit status 2.

    The other processes wait a moment first: Open MPI's launcher ends the whole job at the first
    non-zero exit, which could kill the one that says why before its line is out."""
    if says:
        print(f"{PROG} {args.bench}: {problem}", file=sys.stderr, flush=True)
    else:
        time.sleep(_QUIET_EXIT_DELAY_S)
    return 2


def _start_torch_sub_benchmark(args: argparse.Namespace, comm: Any) -> tuple[dict, list[str], dict, Any]:
    """bench torch: torch's default group on the plugin, gloo beside it, raw mpi4py on the world;
    bench training: the plugin's default group and torch's own backend for the device beside it."""
    if args.bench == "training":
        tdist, native = torch_plugin.start("nccl" if args.device == "cuda" else "gloo")
        return {}, [torch_plugin.PLUGIN, training.NATIVE], {}, (tdist, native)
    tdist, gloo = torch_plugin.start()
    apis = {torch_plugin.PLUGIN: (tdist, True), torch_plugin.GLOO: (torch_plugin.OnGroup(tdist, gloo), True)}
    return apis, [torch_plugin.PLUGIN, "mpi4py", torch_plugin.GLOO], {}, (tdist, gloo)


def _leave_out(impls: list[str], notes: dict[str, str], impl: str, why: str | None) -> None:
    """Drop ``impl`` from the compared ``impls``, with ``why`` as its note, when there is a why."""
    if why and impl in impls:
        impls.remove(impl)
        notes[impl] = why


def _start_hpc_c10d(args: argparse.Namespace, comm: Any) -> tuple[dict, list[str], dict, Any]:
    """Every other sub-benchmark: hpc_c10d's world, and torch.distributed beside it when compared."""
    import hpc_c10d as dist

    dist.init_process_group()
    impls = _compared(args)
    notes: dict[str, str] = {}
    apis: dict[str, tuple[Any, bool]] = {BASELINE: (dist, False)}
    device = getattr(args, "device", "cpu")
    if device == "cuda":  # a host MPI would read device memory
        _leave_out(impls, notes, "mpi4py", "raw mpi4py on GPU arrays needs a CUDA-aware MPI; compare with "
                                           "--compare nccl")
    for needs_torch in TORCH_IMPLS:
        if needs_torch in impls:
            _leave_out(impls, notes, needs_torch, _anywhere(comm, torch_missing()))
    tdist = None
    if set(TORCH_IMPLS) & set(impls) and args.bench != "stores":
        # torch's default group on the plugin (mpi://: no port), torch's own backend as a group beside it
        tdist, native = torch_plugin.start("nccl" if device == "cuda" else "gloo")
        apis.update({"torch": (torch_plugin.OnGroup(tdist, native), True), torch_plugin.PLUGIN: (tdist, True),
                     TENSORS: (dist, True)})
    return apis, impls, notes, (tdist, None)


def _measure(args: argparse.Namespace, bench: Sweep, tdist: Any, gloo: Any) -> list[Record]:
    """Run the sub-benchmark ``args.bench`` on every rank."""
    if args.bench == "p2p":
        return p2p.run(bench, args.ops, args.sizes, args.factor, _dtype(args.dtype))
    if args.bench == "stores":
        return stores.run(bench, args.ops, {"default": None, "on": True, "off": False}[args.tcp_libuv],
                          args.busy_owner)
    if args.bench == "training":
        return training.run(bench, tdist, gloo, args.params, args.dtype, args.batch, args.strategies)
    if args.bench == "checkpoint":
        return checkpoint.run(bench, args.size, args.dir, [c for c in args.compare if c in checkpoint.TORCH_SAVERS])
    records = collectives.run(bench, args.ops, args.sizes, args.factor, _dtype(args.dtype), args.redop, args.bench)
    if args.bench == "torch":
        records += torch_plugin.run_method(bench, tdist)
    if args.bench == "torch" and args.ddp_batch:
        records += torch_plugin.run_ddp(bench, gloo, args.ddp_batch)
    return records


def _run_in_job(args: argparse.Namespace) -> int:
    """Every rank: check what the sub-benchmark needs, start the libraries, run it, report on rank 0, shut down."""
    comm = bootstrap.initialize().COMM_WORLD
    problem = _anywhere(comm, _lacking(args, comm.Get_size()))
    if problem:
        return _refuse(args, problem, says=comm.Get_rank() == 0)
    starter = _start_torch_sub_benchmark if args.bench in ("torch", "training") else _start_hpc_c10d
    apis, impls, notes, (tdist, gloo) = starter(args, comm)
    bench = Sweep(apis=apis, comm=comm, impls=impls, device=getattr(args, "device", "cpu"),
                  async_op=getattr(args, "async_op", False), iters=getattr(args, "iters", 1),
                  batch_s=getattr(args, "batch_ms", 10.0) / 1e3, max_iters=getattr(args, "max_iters", 1),
                  warmup=getattr(args, "warmup", 0), rounds=args.rounds,
                  progress=Progress(0, comm.Get_rank() == 0 and not args.quiet), notes=notes)
    records = _measure(args, bench, tdist, gloo)
    if comm.Get_rank() == 0:
        _emit(args, records, _meta(args, comm.Get_size(), bench.notes))
    if tdist is not None:
        tdist.destroy_process_group()
    if BASELINE in apis:
        apis[BASELINE][0].destroy_process_group()
    return 1 if wrong_total(records) else 0


def _run_startup(args: argparse.Namespace) -> int:
    """The start-up sweep, from one process outside MPI (or one rank of a job it launched)."""
    from ..job.jobenv import detect
    from .startup import child, sweep

    if args.child:
        return child(args.child, args.out_dir)
    job = detect()
    if (job.env_size or 1) > 1:
        return _refuse(args, "run it as one process (not under mpiexec or srun); it launches the jobs",
                       says=not job.env_rank)
    problem = _lacking(args, max(args.ranks))
    if problem:
        return _refuse(args, problem, says=True)
    launcher = args.launcher
    if launcher == "auto":
        launcher = "srun" if job.in_slurm_job else "mpiexec"
    impls = _compared(args)
    notes: dict[str, str] = {}
    if "torch" in impls:
        _leave_out(impls, notes, "torch", torch_missing())
    records = sweep(args.ranks, impls, launcher, args.repeats, args.timeout, Progress(0, not args.quiet))
    _emit(args, records, _meta(args, max(args.ranks), notes))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one sub-benchmark; the exit status is the module's (0, 1: wrong results, 2: nothing measured)."""
    argv = sys.argv[2:] if argv is None else argv
    top = parser()
    args = top.parse_args(argv)
    args.argv = argv
    if args.bench is None:
        top.error(f"name a sub-benchmark: {', '.join(SUB_BENCHMARKS)} ({PROG} --help says what each measures)")
    if "nccl" in args.compare and getattr(args, "device", "cpu") != "cuda":
        top.error("--compare nccl needs --device cuda")
    if args.bench == "startup":
        return _run_startup(args)
    return _run_in_job(args)
