"""Data-parallel training of a small numpy MLP: each rank trains on its shard, gradients are averaged.

Run:  mpiexec -n 4 python examples/data_parallel.py [--steps 200]

The only communication is ``dist.all_reduce(grad, op=ReduceOp.AVG)`` on one flat gradient buffer
per step (one call instead of one per parameter), which is how DDP buckets gradients.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import hpc_c10d as dist


def make_data(rank: int, world: int, samples: int, features: int):
    """Synthetic regression data; each rank gets a different shard of the same problem."""
    truth = np.random.default_rng(0).standard_normal((features, 1))
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((samples // world, features))
    y = np.tanh(x @ truth) + 0.01 * rng.standard_normal((len(x), 1))
    return x, y


class MLP:
    """Two-layer perceptron whose parameters and gradients live in two flat buffers."""

    def __init__(self, features: int, hidden: int) -> None:
        shapes = [(features, hidden), (hidden,), (hidden, 1), (1,)]
        sizes = [int(np.prod(s)) for s in shapes]
        self.flat = np.random.default_rng(42).standard_normal(sum(sizes)) * 0.1
        self.grad = np.zeros_like(self.flat)
        offsets = np.cumsum([0, *sizes])
        self.params = [self.flat[a:b].reshape(s) for a, b, s in zip(offsets, offsets[1:], shapes)]
        self.grads = [self.grad[a:b].reshape(s) for a, b, s in zip(offsets, offsets[1:], shapes)]

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray) -> float:
        w1, b1, w2, b2 = self.params
        h = np.tanh(x @ w1 + b1)
        err = h @ w2 + b2 - y
        d_out = 2 * err / len(x)
        d_h = (d_out @ w2.T) * (1 - h**2)
        gw1, gb1, gw2, gb2 = self.grads
        gw1[...] = x.T @ d_h
        gb1[...] = d_h.sum(0)
        gw2[...] = h.T @ d_out
        gb2[...] = d_out.sum(0)
        return float(np.mean(err**2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group()  # rank and world size come from mpiexec/srun
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(rank, world, args.samples, features=32)
    model = MLP(features=32, hidden=64)
    loss = np.zeros(1)
    if rank == 0:
        print(f"training on {world} rank(s), {len(x)} samples each, {model.flat.size} parameters")
    start = time.perf_counter()
    first = None
    for step in range(1, args.steps + 1):
        loss[0] = model.loss_and_grad(x, y)
        dist.all_reduce(model.grad, op=dist.ReduceOp.AVG)  # average gradients over ranks
        model.flat -= args.lr * model.grad
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        first = first if first is not None else loss[0]
        if rank == 0 and (step % 25 == 0 or step == 1):
            print(f"step {step:4d}  loss {loss[0]:.5f}  {time.perf_counter() - start:6.2f} s")
    elapsed = time.perf_counter() - start

    replicas = [None] * world
    dist.all_gather_object(replicas, model.flat)
    in_sync = all(np.array_equal(replicas[0], r) for r in replicas)
    if rank == 0:
        rate = args.steps * len(x) * world / elapsed
        print(f"done: loss {first:.5f} -> {loss[0]:.5f}, {rate:,.0f} samples/s, "
              f"replicas identical: {in_sync}")
    dist.destroy_process_group()
    return 0 if in_sync and loss[0] < first else 1


if __name__ == "__main__":
    raise SystemExit(main())
