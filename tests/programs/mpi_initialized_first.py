"""The application initialises MPI (mpi4py) before hpc_c10d; both keep working.

MPI is initialised by `from mpi4py import MPI`; init_process_group() must adopt it, and
destroy_process_group() must leave it usable for the application.
"""
from mpi4py import MPI

import numpy as np

assert MPI.Is_initialized()
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
expected = comm.allreduce(rank * rank, op=MPI.SUM)

import hpc_c10d as dist  # noqa: E402 - imported after MPI on purpose

dist.init_process_group()
assert (dist.get_rank(), dist.get_world_size()) == (rank, size)
x = np.array([rank * rank], dtype=np.int64)
dist.all_reduce(x)
assert x[0] == expected, (x, expected)

# interleave application MPI traffic with hpc_c10d collectives
ys = comm.allgather(rank)
assert ys == list(range(size))
b = np.array([rank], dtype=np.float64)
dist.broadcast(b, src=size - 1)
assert b[0] == size - 1
dist.destroy_process_group()

assert MPI.Is_initialized() and not MPI.Is_finalized()
assert comm.allreduce(1) == size
print(f"rank {rank}: MPI-first program OK")
