"""Data-parallel SGD on a tiny torch model with gradients averaged by all_reduce.

As in the tutorial: same initial weights everywhere, a different data shard per rank,
`average_gradients` after backward. Checks (1) a group collective, (2) that all ranks hold
bit-identical parameters after every step, and (3) that they match full-batch training.
Only the import line differs from a torch.distributed program.
"""
import os

import torch
import torch.nn as nn

import hpc_c10d as dist  # was: import torch.distributed as dist

STEPS = 5
SHARD = 8


def shard(r):
    g = torch.Generator().manual_seed(1000 + r)
    x = torch.randn(SHARD, 4, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.25
    return x, y


def make_model():
    torch.manual_seed(0)
    return nn.Linear(4, 1).double()


def average_gradients(model, group):
    """Gradient averaging."""
    size = float(dist.get_world_size(group))
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM, group=group)
        param.grad.data /= size


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run(rank, size):
    # the tutorial's group example: a group of the first two ranks sums a tensor
    first_two = list(range(min(2, size)))
    group = dist.new_group(first_two)
    tensor = torch.ones(1)
    if rank in first_two:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        assert tensor[0].item() == len(first_two), tensor
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER

    everyone = dist.new_group(list(range(size)))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = shard(rank)

    reference = make_model()  # every rank replays full-batch training locally
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    xs, ys = zip(*(shard(r) for r in range(size)))
    x_all, y_all = torch.cat(xs), torch.cat(ys)

    for step in range(STEPS):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        average_gradients(model, everyone)
        optimizer.step()

        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(x_all), y_all).backward()
        ref_opt.step()

        mine = flat_params(model)
        gathered = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(gathered, mine)
        for r, other in enumerate(gathered):
            assert torch.equal(other, mine), f"step {step}: rank {r} differs from rank {rank}"
        assert torch.allclose(mine, flat_params(reference), rtol=1e-12, atol=1e-12), (
            step, mine, flat_params(reference))
    print(f"Rank {rank}: loss {loss.item():.6f}, parameters identical on {size} ranks")


if __name__ == "__main__":
    # the launcher's rank and size: MPICH's mpiexec sets PMI_*, Open MPI's OMPI_COMM_WORLD_*
    rank, size = (int(os.environ.get(f"PMI_{v}") or os.environ[f"OMPI_COMM_WORLD_{v}"]) for v in ("RANK", "SIZE"))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    run(rank, size)
    dist.destroy_process_group()
