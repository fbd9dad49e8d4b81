"""The bench's command line: one sub-command per sub-benchmark, every option with its help.

Help text is plain (no reST markup): it is what ``--help`` prints.
"""

from __future__ import annotations

import argparse
from typing import Callable

from .collective_ops import COLLECTIVES, REDUCTIONS
from .p2p import P2P_OPS
from .stores import STORE_OPS
from .training import STRATEGIES
from .units import parse_bytes, parse_range

__all__ = ["parser", "PROG", "SUB_BENCHMARKS"]

PROG = "python -m hpc_c10d bench"
_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")

#: sub-command -> (one line for the listing, what its --help says)
SUB_BENCHMARKS = {
    "collectives": ("collectives over a size sweep (nccl-tests columns)",
                    "Time hpc_c10d's collectives over a size sweep, with nccl-tests' algorithm and bus bandwidth. "
                    "A checking pass first compares every result with a numpy reference and counts the wrong "
                    "elements. Run it under the launcher your jobs use (mpiexec, srun)."),
    "torch": ("torch.distributed on backend 'hpc' (the plugin) vs gloo vs raw mpi4py, and a DDP step",
              "Time torch.distributed's own calls on backend 'hpc' (hpc_c10d.torch) against gloo over the same "
              "ranks and raw mpi4py, then a DDP training step of a small MLP on each, and the same step "
              "without DDP. Needs torch."),
    "p2p": ("send/recv latency and bandwidth between rank pairs (OSU style)",
            "Point-to-point between rank pairs (0,1), (2,3), ..., OSU style: latency is half a blocking "
            "ping-pong round trip; bandwidth is a window of 64 nonblocking sends, then an empty "
            "acknowledgement. An odd last rank sits out. Needs at least 2 ranks."),
    "stores": ("MPIStore operations (vs TCPStore with --compare)",
               "Time MPIStore's set, get, add and compare_set, every rank at once on keys of its own, and an add "
               "by every rank to one shared key. Every result is checked. With --busy-owner, rank 0 computes in "
               "pure Python instead while the others time single operations on keys it holds."),
    "startup": ("init + first collective + store ops, swept over world sizes (run as ONE process: it launches "
                "the jobs)",
                "Start-up at scale: for each world size, launch jobs that time init_process_group plus a first "
                "all_reduce, then a store set, a get of the neighbour's key and an add to one shared key; the "
                "launch's wall time beside them. Run it as ONE process, not under mpiexec or srun: it launches "
                "the jobs itself."),
    "training": ("a DDP and an FSDP2 training step on backend 'hpc' vs torch's own backend",
                 "Time a DDP step and an FSDP2 (fully_shard) step of one MLP on backend 'hpc' (the plugin) against "
                 "torch's own backend over the same ranks (gloo on CPU, NCCL with --device cuda), after a "
                 "checking step that compares the two backends' parameters; on a GPU also each step's peak "
                 "memory. Needs torch."),
    "checkpoint": ("HDF5 checkpoint save/load bandwidth vs one process with h5py (and torch's with --compare)",
                   "Save and load bandwidth of hpc_c10d.checkpoint, every rank writing and reading its uneven slab "
                   "of one float64 array in one HDF5 file, against one process writing and reading the whole "
                   "array with plain h5py. Needs h5py."),
}

#: sub-command -> (what --compare may name, what a bare --compare times, its help)
_COMPARISONS = {
    "collectives": (("mpi4py", "torch", "nccl", "plugin", "hpc_c10d-tensors"), ("mpi4py", "torch"),
                    "also time the same calls through raw mpi4py (Allreduce, Bcast, ...) and torch.distributed "
                    "(gloo on CPU, NCCL with --device cuda) on the same memory, in the same rounds; IMPLS is a "
                    "comma list of mpi4py, torch, nccl, plugin, hpc_c10d-tensors (default mpi4py,torch; torch "
                    "where installed); nccl, with --device cuda, is the direct NCCL call (ncclAllReduce, ...) on "
                    "the same communicator; plugin is torch.distributed on backend 'hpc'; hpc_c10d-tensors is "
                    "hpc_c10d's own API called with torch tensors"),
    "p2p": (("mpi4py", "torch"), ("mpi4py", "torch"),
            "also time raw mpi4py Send/Recv/Isend/Irecv and torch.distributed's send/recv/isend/irecv (gloo) "
            "between the same pairs; IMPLS is mpi4py, torch or both (default both; torch where installed)"),
    "stores": (("torch",), ("torch",),
               "also time torch's TCPStore, its server on rank 0 (where torch is installed)"),
    "checkpoint": (("torch.save", "dcp"), ("torch.save", "dcp"),
                   "also time torch.save/torch.load of each rank's slab (a file per rank) and "
                   "torch.distributed.checkpoint saving and loading the slabs in place; IMPLS is torch.save, dcp "
                   "or both (default both; where torch is installed)"),
    "startup": (("torch",), ("torch",),
                "also launch jobs that start torch's default env:// rendezvous (TCPStore on rank 0, gloo) "
                "(where torch is installed)"),
}


def _parameter_count(text: str) -> int:
    """``"100M"`` → 100_000_000 (K, M, G are decimal here: parameters, not bytes)."""
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:].upper(), 1)
    try:
        count = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a parameter count: {text!r} (e.g. 100M)") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"a parameter count must be positive, got {text!r}")
    return count


def _choices(allowed: tuple[str, ...], everything: str = "all") -> Callable[[str], list[str]]:
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
    out.add_argument("--format", choices=("table", "json", "csv"), default="table",
                     help="what goes to stdout (default table)")
    out.add_argument("--json", metavar="PATH", help="also write JSON here")
    out.add_argument("--csv", metavar="PATH", help="also write CSV here")
    out.add_argument("--plot", metavar="PNG", help="also draw a plot (needs matplotlib)")
    out.add_argument("--plot-metric", choices=("auto", "busbw", "time"), default="auto",
                     help="what the plot shows: bus bandwidth, time of the slowest rank, or auto (bandwidth "
                          "where there is one)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def _compare_option(sub: argparse.ArgumentParser, name: str) -> None:
    allowed, bare, text = _COMPARISONS[name]
    sub.add_argument("--compare", nargs="?", const=list(bare), default=[], type=_choices(allowed),
                     metavar="IMPLS" if len(allowed) > 1 else allowed[0], help=text)


def _timing_options(sub: argparse.ArgumentParser, rounds: int) -> None:
    timing = sub.add_argument_group("timing")
    timing.add_argument("-n", "--iters", type=_non_negative, default=0,
                        help="calls per timed batch (default 0: calibrated)")
    timing.add_argument("--batch-ms", type=float, default=10.0,
                        help="calibrated batches last about this long (default 10)")
    timing.add_argument("--max-iters", type=_positive, default=2000,
                        help="cap on calibrated calls per batch (default 2000)")
    timing.add_argument("-w", "--warmup", type=_non_negative, default=5,
                        help="untimed calls first, per size (default 5)")
    timing.add_argument("-r", "--rounds", type=_positive, default=rounds, help=f"timed batches (default {rounds})")


def _sized_options(sub: argparse.ArgumentParser, ops: tuple[str, ...], default_ops: str, sizes: str = "8:4M",
                   factor: int = 4) -> None:
    sub.add_argument("--ops", type=_choices(ops), default=default_ops,
                     help=f"{', '.join(ops)} or all (default {default_ops})")
    sub.add_argument("-b", "--sizes", type=parse_range, default=sizes, metavar="MIN:MAX",
                     help=f"bytes, e.g. 8:256M (default {sizes})")
    sub.add_argument("-f", "--factor", type=_growth, default=factor, help=f"size step factor (default {factor})")
    sub.add_argument("-d", "--dtype", choices=_DTYPES, default="float32", metavar="DTYPE",
                     help=f"element type: {', '.join(_DTYPES)} (default float32)")
    sub.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="where the buffers live: cpu (numpy arrays) or cuda (cupy arrays, NCCL) (default cpu)")


def _reduction_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("-o", "--redop", choices=tuple(REDUCTIONS), default="sum",
                     help="the reduction of the reducing collectives (default sum)")
    sub.add_argument("-a", "--async", dest="async_op", action="store_true",
                     help="each call with async_op=True, then wait() on its Work")


def parser() -> argparse.ArgumentParser:
    """The bench's argument parser (its sub-commands are the sub-benchmarks)."""
    top = argparse.ArgumentParser(prog=PROG, description="Benchmarks of hpc_c10d on this machine, each result "
                                  "checked. Run a sub-benchmark under the launcher your jobs use; rank 0 prints.")
    subs = top.add_subparsers(dest="bench", title="sub-benchmarks")
    adders = {name: subs.add_parser(name, help=listed, description=described)
              for name, (listed, described) in SUB_BENCHMARKS.items()}

    coll = adders["collectives"]
    _sized_options(coll, tuple(COLLECTIVES), "all_reduce")
    _reduction_options(coll)
    _timing_options(coll, 11)

    plug = adders["torch"]
    _sized_options(plug, tuple(COLLECTIVES), "all_reduce", sizes="8:1M", factor=128)
    _reduction_options(plug)
    plug.add_argument("--ddp-batch", type=_non_negative, default=32, help="rows per rank in the DDP step (0: no DDP)")
    _timing_options(plug, 11)
    plug.set_defaults(compare=[])  # gloo and raw mpi4py are always beside the plugin

    train = adders["training"]
    train.add_argument("--params", type=_parameter_count, default="1M",
                       help="about how many parameters the MLP has, e.g. 100M (default 1M)")
    train.add_argument("-d", "--dtype", choices=("float32", "bfloat16"), default="float32",
                       help="parameter type (default float32)")
    train.add_argument("--batch", type=_positive, default=32, help="rows per rank and step (default 32)")
    train.add_argument("--strategies", type=_choices(STRATEGIES), default="all",
                       help=f"{', '.join(STRATEGIES)} or all (default all)")
    train.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="where the model lives: cpu (torch's gloo beside) or cuda (NCCL) (default cpu)")
    _timing_options(train, 5)
    train.set_defaults(compare=[])  # torch's own backend is always beside the plugin

    p2p = adders["p2p"]
    _sized_options(p2p, P2P_OPS, "all")
    _timing_options(p2p, 11)

    stores = adders["stores"]
    stores.add_argument("--ops", type=_choices(STORE_OPS), default="all",
                        help=f"{', '.join(STORE_OPS)} or all (default all)")
    stores.add_argument("--tcp-libuv", choices=("default", "on", "off"), default="default",
                        help="with --compare: TCPStore's server on libuv (on), on its older backend (off), or "
                             "torch's default")
    stores.add_argument("--busy-owner", type=_seconds, default=0.0, metavar="SECONDS",
                        help="rank 0 computes in pure Python (no MPI calls) for SECONDS while the other ranks time "
                             "set, get, add and compare_set one at a time on keys rank 0 holds: per-call latency "
                             "(median, p99, max), as between nodes when the ranks are on different hosts "
                             "(default 0: the usual sweep)")
    _timing_options(stores, 5)

    start = adders["startup"]
    start.add_argument("--ranks", type=_rank_counts, default="2:16",
                       help="world sizes: e.g. 2:64 (doubling) or 2,3,4 (default 2:16)")
    start.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto",
                       help="auto (the default): srun inside a SLURM allocation, else mpiexec")
    start.add_argument("--repeats", type=_positive, default=3,
                       help="launches per world size and implementation, alternating (default 3)")
    start.add_argument("--timeout", type=_seconds, default=600.0,
                       help="seconds per launch before it is killed (default 600)")
    start.add_argument("--child", choices=("hpc_c10d", "torch"), help=argparse.SUPPRESS)
    start.add_argument("--out-dir", help=argparse.SUPPRESS)

    ckpt = adders["checkpoint"]
    ckpt.add_argument("--size", type=parse_bytes, default="256M", help="global array bytes (default 256M)")
    ckpt.add_argument("--dir", default=".", help="an existing directory the files go to (default .)")
    ckpt.add_argument("-r", "--rounds", type=_positive, default=5,
                      help="write and read rounds, the implementations taking turns (default 5)")
    ckpt.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="where the slabs live: cpu, or cuda (torch CUDA tensors, else cupy arrays) (default cpu)")

    for name, sub in adders.items():
        _output_options(sub)
        if name in _COMPARISONS:
            _compare_option(sub, name)
    return top
