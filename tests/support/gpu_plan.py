"""Whether the GPU tests can run, decided by every rank together.

Each rank sees its own GPUs; on nodes with different GPU counts a rank-local decision would let
some ranks skip a test whose collectives the others then wait in for ever.
"""

from mpi4py import MPI

from hpc_c10d.nccl import cuda, library

OWN, SHARED = "own", "shared"


def gpu_plan(comm=MPI.COMM_WORLD) -> str:
    """``OWN`` when every rank of ``comm`` has a GPU of its own, ``SHARED`` when every rank has one
    but some share it, else why some rank cannot run GPU tests; the same answer on every rank
    (collective over ``comm``)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    on_this_node = node.Get_size()
    node.Free()
    gpus, why_none = cuda.visible_devices()
    why = f"no CUDA GPU ({why_none})" if gpus == 0 else "" if library.available() else "no NCCL library"
    views = comm.allgather((why, on_this_node > gpus))
    missing = [f"rank {r}: {why}" for r, (why, _) in enumerate(views) if why]
    if missing:
        return "the NCCL GPU tests need a GPU per rank: " + "; ".join(missing[:4])
    return SHARED if any(crowded for _, crowded in views) else OWN
