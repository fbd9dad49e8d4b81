"""Non-blocking point-to-point: a one-shot isend/irecv and the tutorial's ring all-reduce.

Only the import line differs from a torch.distributed program.
"""
import os

import torch

import hpc_c10d as dist  # was: import torch.distributed as dist


def run_nonblocking(rank, size):
    """Non-blocking point-to-point communication: rank 0 to the last rank."""
    tensor = torch.zeros(1)
    req = None
    if rank == 0 and size > 1:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=size - 1)
        print("Rank 0 started sending")
    elif rank == size - 1 and size > 1:
        req = dist.irecv(tensor=tensor, src=0)
        print(f"Rank {rank} started receiving")
    if req is not None:
        req.wait()
        assert tensor[0].item() == 1.0, (rank, tensor)


def ring_allreduce(send, recv):
    """The tutorial's ring: pass buffers to the right, accumulate what arrives from the left."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.clone()
    recv_buff = send.clone()
    accum = send.clone()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def run_ring(rank, size):
    left, right = (rank - 1) % size, (rank + 1) % size
    # each rank sends to its right neighbour and receives from its left one, all at once
    if size > 1:
        got = torch.zeros(3, dtype=torch.int64)
        reqs = [dist.irecv(got, src=left), dist.isend(torch.tensor([rank, 2 * rank, 3 * rank]), dst=right)]
        for r in reqs:
            r.wait()
        assert got.tolist() == [left, 2 * left, 3 * left], (rank, got)

    data = torch.arange(4, dtype=torch.float64) + rank
    out = torch.zeros(4, dtype=torch.float64)
    ring_allreduce(data, out)
    expected = torch.arange(4, dtype=torch.float64) * size + size * (size - 1) / 2
    assert torch.equal(out, expected), (rank, out, expected)
    print(f"Rank {rank} ring all-reduce: {out.tolist()}")


if __name__ == "__main__":
    # the launcher's rank and size: MPICH's mpiexec sets PMI_*, Open MPI's OMPI_COMM_WORLD_*
    rank, size = (int(os.environ.get(f"PMI_{v}") or os.environ[f"OMPI_COMM_WORLD_{v}"]) for v in ("RANK", "SIZE"))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    run_nonblocking(rank, size)
    run_ring(rank, size)
    dist.destroy_process_group()
