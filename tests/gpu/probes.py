#!/usr/bin/env python3
"""Small checks of the GPU machine that device_steps.py runs as steps of their own:

    python tests/gpu/probes.py environment      # what the machine is (always passes)
    mpiexec -n 2 python tests/gpu/probes.py mpi  # the carried MPICH starts ranks
    python tests/gpu/probes.py cupy             # CuPy compiles and runs a kernel (NVRTC), the GPU is shared
    mpiexec -n 1 python tests/gpu/probes.py nccl     # a one-rank NCCL communicator through hpc_c10d
    mpiexec -n 1 python tests/gpu/probes.py gpus_md  # docs/gpus.md's example, as written
    mpiexec -n 1 python tests/gpu/probes.py torch_path  # a torch CUDA all_reduce on "hpc", and its path

Each prints ``<probe> ok`` (with what it saw) when everything it checks held. A probe that needs
a GPU and finds none says "no CUDA GPU" and exits with 3.
"""
import importlib
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _version(module):
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception as exc:  # a probe reports whatever is missing or broken, and goes on
        return f"not importable ({type(exc).__name__}: {exc})"


def environment():
    """The machine, its GPU and the versions every later step depends on."""
    print(f"python {sys.version.split()[0]} at {sys.executable}; {platform.platform()}")
    query = "name,driver_version,compute_mode,memory.total"
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        smi = f"no nvidia-smi ({exc})"
    print(f"gpu ({query}): {smi or 'none'}")
    for module in ("numpy", "mpi4py", "ml_dtypes", "cupy", "torch", "h5py", "pytest", "hpc_c10d"):
        print(f"{module} {_version(module)}")
    try:
        import torch

        print(f"torch CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}")
    except ImportError:
        pass
    from hpc_c10d.nccl import library

    try:
        nccl = library.load()
        print(f"NCCL {'.'.join(map(str, nccl.version))} from {nccl.path}")
    except RuntimeError as exc:
        print(f"NCCL: {exc}")
    from mpi4py import MPI

    print(f"MPI: {MPI.Get_library_version().splitlines()[0]}")
    print("environment ok")


def mpi():
    """Every rank of the carried MPICH answers, and a collective adds up."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank() + 1)
    assert total == comm.Get_size() * (comm.Get_size() + 1) // 2, total
    if comm.Get_rank() == 0:
        print(f"mpi ok: {comm.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0]}")


NO_GPU_EXIT = 3


def gpu_or_exit():
    """Exit with NO_GPU_EXIT, saying why, where hpc_c10d sees no CUDA GPU."""
    from hpc_c10d.nccl import cuda

    count, why_none = cuda.visible_devices()
    if count == 0:
        print(f"no CUDA GPU ({why_none})", flush=True)
        sys.exit(NO_GPU_EXIT)


def cupy():
    """A CuPy kernel compiled at run time (NVRTC) gives the right answer; the GPU lets several
    processes in (EXCLUSIVE_PROCESS would break the multi-rank steps)."""
    gpu_or_exit()
    import cupy as cp

    got = float((cp.ones(4, dtype=cp.float32) + 1).sum())
    assert got == 8.0, got
    mode = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=60).stdout.strip()
    assert "Exclusive" not in mode, f"compute mode {mode}: two ranks cannot share the GPU"
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"cupy ok: {props['name'].decode()}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, "
          f"compute mode {mode}")


def nccl():
    """hpc_c10d's default group makes a one-rank NCCL communicator and all-reduces through it."""
    gpu_or_exit()
    import cupy as cp

    import hpc_c10d as dist
    from hpc_c10d.nccl import library

    dist.init_process_group()
    device = dist.nccl.bind_local_device()
    x = cp.arange(1 << 20, dtype=cp.float32)
    dist.all_reduce(x)
    expected = cp.arange(1 << 20, dtype=cp.float32) * dist.get_world_size()
    assert bool((x == expected).all())
    dist.destroy_process_group()
    print(f"nccl ok: NCCL {'.'.join(map(str, library.load().version))} on cuda:{device}")


def gpus_md():
    """docs/gpus.md's Python example as the page prints it, then a check of its result."""
    gpu_or_exit()
    with open(os.path.join(ROOT, "docs", "gpus.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert blocks, "docs/gpus.md has no Python example"
    from mpi4py import MPI

    scope = {}
    exec(compile(blocks[0], "docs/gpus.md", "exec"), scope)  # it ends with destroy_process_group()
    assert float(scope["x"][0]) == MPI.COMM_WORLD.Get_size(), float(scope["x"][0])
    print(f"gpus_md ok: the example ran on cuda:{scope['device']}")


def torch_path():
    """torch's default group on backend "hpc" all-reduces a CUDA tensor, on the path
    ``HPC_C10D_TORCH_CUDA`` chooses (torch's ProcessGroupNCCL unless it says ``hpc``), and is
    destroyed without a warning."""
    gpu_or_exit()
    import warnings

    import torch
    import torch.distributed as tdist

    from hpc_c10d.torch import hpc_backend
    from hpc_c10d.torch.torch_nccl import cuda_path

    tdist.init_process_group("hpc")
    torch.cuda.set_device(tdist.get_rank() % torch.cuda.device_count())
    x = torch.ones(1 << 20, device="cuda")
    tdist.all_reduce(x)
    assert x.eq(tdist.get_world_size()).all().item()
    path = hpc_backend().cuda_path
    assert path == cuda_path(), (path, cuda_path())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tdist.destroy_process_group()
    print(f"torch_path ok: a CUDA all_reduce on backend 'hpc' took the {path!r} path")


if __name__ == "__main__":
    {f.__name__: f for f in (environment, mpi, cupy, nccl, gpus_md, torch_path)}[sys.argv[1]]()
