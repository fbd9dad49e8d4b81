"""destroy_process_group() then init_process_group() again, then a group on a sub-communicator.

1. init, all_reduce, destroy; init again (same process), all_reduce, destroy.
2. init_process_group(comm=MPI.COMM_WORLD.Split(rank % 2)): the default group is the
   parity class; its ranks and all_reduce are those of the sub-communicator.
"""
import numpy as np

import hpc_c10d as dist


def check_world_sum(tag):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.array([rank + 1, 10 * tag], dtype=np.int64)
    dist.all_reduce(x)
    assert x.tolist() == [size * (size + 1) // 2, 10 * tag * size], (tag, x)
    return rank, size


def main():
    dist.init_process_group()
    rank, size = check_world_sum(1)
    dist.destroy_process_group()
    assert not dist.is_initialized()

    dist.init_process_group()
    assert dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size()) == (rank, size)
    check_world_sum(2)
    sub = dist.new_group(list(range(size)))
    x = np.ones(2)
    dist.all_reduce(x, group=sub)
    assert x.tolist() == [size, size]
    dist.destroy_process_group()
    assert not dist.is_initialized()

    from mpi4py import MPI

    parity = [r for r in range(size) if r % 2 == rank % 2]
    comm = MPI.COMM_WORLD.Split(rank % 2, rank)
    dist.init_process_group(comm=comm)
    assert dist.get_world_size() == len(parity), (dist.get_world_size(), parity)
    assert dist.get_rank() == parity.index(rank), (dist.get_rank(), parity)
    x = np.array([rank], dtype=np.int64)
    dist.all_reduce(x)
    assert x[0] == sum(parity), (x, parity)
    objs = [None] * len(parity)
    dist.all_gather_object(objs, rank)
    assert objs == parity, objs
    dist.destroy_process_group()
    comm.Free()

    MPI.COMM_WORLD.Barrier()  # MPI itself is still usable
    print(f"rank {rank}: re-init and sub-communicator OK")


if __name__ == "__main__":
    main()
