"""A plain torch.distributed DDP script: no hpc_c10d import, no environment variables.

Launched as ``mpiexec -n 4 python torch_unmodified_ddp.py`` (or ``srun -n 4 --mpi=pmi2``): torch
loads backend "hpc" through its entry point, and the default ``env://`` rendezvous falls back
to MPI because MASTER_ADDR/MASTER_PORT are unset. Each rank checks its DDP model against a
model trained on the whole batch alone and prints one line; a mismatch exits non-zero.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def main():
    dist.init_process_group(backend="hpc")
    rank, size = dist.get_rank(), dist.get_world_size()
    ddp, alone = DDP(model()), model()
    opt, opt_alone = torch.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(alone.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(2 * size, 8, generator=data), torch.randn(2 * size, 1, generator=data)
        for net, optimizer, rows in ((ddp, opt, slice(2 * rank, 2 * rank + 2)), (alone, opt_alone, slice(None))):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x[rows]), y[rows]).backward()
            optimizer.step()
    for p, q in zip(ddp.module.parameters(), alone.parameters()):
        torch.testing.assert_close(p, q)
    print(f"rank {rank}/{size} backend {dist.get_backend()}: DDP matches single-process training", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
