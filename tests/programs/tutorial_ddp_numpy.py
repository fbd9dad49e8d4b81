"""Data-parallel gradient descent on numpy arrays: the torch tutorial's averaging, no torch.

Linear least squares; each rank computes the gradient on its shard, gradients are summed
with all_reduce and divided by the world size. Parameters must stay bit-identical across
ranks and agree with full-batch descent computed locally.
"""
import numpy as np

import hpc_c10d as dist

STEPS = 10
SHARD = 16
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0])


def shard(r):
    rng = np.random.default_rng(1000 + r)
    x = rng.standard_normal((SHARD, 4))
    return x, x @ TRUE_W + 0.25


def grads(w, b, x, y):
    err = x @ w + b - y
    return 2 * x.T @ err / len(y), np.array([2 * err.mean()])


def main():
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = shard(rank)
    w, b = np.zeros(4), np.zeros(1)
    xs, ys = zip(*(shard(r) for r in range(size)))
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    w_ref, b_ref = w.copy(), b.copy()

    for step in range(STEPS):
        gw, gb = grads(w, b, x, y)
        for g in (gw, gb):
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            g /= size
        w -= 0.1 * gw
        b -= 0.1 * gb

        rw, rb = grads(w_ref, b_ref, x_all, y_all)
        w_ref -= 0.1 * rw
        b_ref -= 0.1 * rb

        mine = np.concatenate([w, b])
        everyone = np.empty(size * mine.size)
        dist.all_gather_into_tensor(everyone, mine)
        for r, other in enumerate(everyone.reshape(size, -1)):
            assert np.array_equal(other, mine), f"step {step}: rank {r} differs from rank {rank}"
        np.testing.assert_allclose(mine, np.concatenate([w_ref, b_ref]), rtol=1e-12, atol=1e-12)

    # AVG does the division in one call and agrees with SUM / size
    g = np.full(3, float(rank))
    dist.all_reduce(g, op=dist.ReduceOp.AVG)
    np.testing.assert_allclose(g, np.full(3, (size - 1) / 2))
    print(f"Rank {rank}: w={w.round(4).tolist()} identical on {size} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
