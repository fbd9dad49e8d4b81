"""Blocking point-to-point, written like the PyTorch "Writing Distributed Applications" tutorial.

Only the import line differs from a torch.distributed program. The rank and world size come
from the launcher (MPICH's mpiexec sets PMI_RANK / PMI_SIZE, Open MPI's OMPI_COMM_WORLD_RANK /
OMPI_COMM_WORLD_SIZE) and are passed explicitly.
Exits non-zero if any rank ends up with the wrong data.
"""
import os

import torch

import hpc_c10d as dist  # was: import torch.distributed as dist


def run(rank, size):
    """Blocking point-to-point communication."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to every other process
        for dst in range(1, size):
            dist.send(tensor=tensor, dst=dst)
    else:
        # Receive tensor from process 0
        sender = dist.recv(tensor=tensor, src=0)
        assert sender == 0, sender
    print("Rank ", rank, " has data ", tensor[0])
    assert tensor[0].item() == 1.0, (rank, tensor)

    # a bigger payload the other way: every rank > 0 sends its rank-stamped vector to 0
    if rank == 0:
        for src in range(1, size):
            buf = torch.empty(1000, dtype=torch.float64)
            dist.recv(buf, src=src)
            assert torch.equal(buf, torch.arange(1000, dtype=torch.float64) * src), src
    else:
        dist.send(torch.arange(1000, dtype=torch.float64) * rank, dst=0)


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    assert dist.get_rank() == rank and dist.get_world_size() == size
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    rank, size = (int(os.environ.get(f"PMI_{v}") or os.environ[f"OMPI_COMM_WORLD_{v}"]) for v in ("RANK", "SIZE"))
    init_process(rank, size, run)
