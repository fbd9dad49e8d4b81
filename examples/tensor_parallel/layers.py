"""A tensor-parallel MLP block in numpy (the Megatron-LM split): the example that
docs/testing_your_code.md tests with hpc_c10d's pytest plugin.

The first layer's weight is split by columns, so each rank computes its slice of the hidden
activations with no communication; the second layer's weight is split by rows, so each rank's
partial product covers its slice of the hidden units and one ``all_reduce`` sums them.
"""

from __future__ import annotations

import numpy as np

import hpc_c10d as dist


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def serial_mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """The reference: the same block on one process."""
    return gelu(x @ w1 + b1) @ w2 + b2


class ParallelMLP:
    """``gelu(x @ w1 + b1) @ w2 + b2`` with the hidden units split across the ranks of ``group``."""

    def __init__(self, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, group=None) -> None:
        self.group = group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        hidden = w1.shape[1]
        if hidden % size:
            raise ValueError(f"{hidden} hidden units do not split evenly over {size} ranks")
        mine = slice(rank * hidden // size, (rank + 1) * hidden // size)
        self.w1, self.b1 = w1[:, mine].copy(), b1[mine].copy()  # column-parallel: this rank's columns
        self.w2, self.b2 = w2[mine, :].copy(), b2.copy()  # row-parallel: the matching rows

    def __call__(self, x: np.ndarray) -> np.ndarray:
        partial = gelu(x @ self.w1 + self.b1) @ self.w2  # this rank's share of the output
        dist.all_reduce(partial, group=self.group)
        return partial + self.b2
