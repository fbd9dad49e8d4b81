"""Tests of layers.py, run on several ranks at once:

    mpiexec -n 4 python -m pytest --hpc-c10d examples/tensor_parallel/test_layers.py
"""

import numpy as np
import pytest

from hpc_c10d.testing import assert_same_on_ranks
from layers import ParallelMLP, serial_mlp

FEATURES, HIDDEN, OUT = 8, 24, 5  # 24 hidden units split evenly over 1, 2, 3 or 4 ranks


def weights(dtype=np.float64):
    rng = np.random.default_rng(0)  # the same full weights on every rank
    shapes = [(FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, OUT), (OUT,)]
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_matches_the_serial_block(dist_world, dtype, rtol):
    x = np.random.default_rng(1).standard_normal((6, FEATURES)).astype(dtype)
    y = ParallelMLP(*weights(dtype))(x)
    np.testing.assert_allclose(y, serial_mlp(x, *weights(dtype)), rtol=rtol, atol=rtol)
    assert_same_on_ranks(y)  # every rank ends with the whole output


@pytest.mark.world_size(min_size=2)
def test_each_rank_keeps_only_its_share(dist_rank, dist_world_size):
    layer = ParallelMLP(*weights())
    assert layer.w1.shape == (FEATURES, HIDDEN // dist_world_size)
    assert layer.w2.shape == (HIDDEN // dist_world_size, OUT)
    np.testing.assert_array_equal(layer.w1[:, 0], weights()[0][:, dist_rank * HIDDEN // dist_world_size])


@pytest.mark.world_size(2, 4)
def test_two_blocks_side_by_side_in_subgroups(dist_new_group, dist_rank, dist_world_size):
    pairs = [dist_new_group([r, r + 1]) for r in range(0, dist_world_size, 2)]  # every rank makes every group
    x = np.random.default_rng(2 + dist_rank // 2).standard_normal((3, FEATURES))  # one input per pair
    y = ParallelMLP(*weights(), group=pairs[dist_rank // 2])(x)
    np.testing.assert_allclose(y, serial_mlp(x, *weights()), rtol=1e-12, atol=1e-12)
    assert_same_on_ranks(y, group=pairs[dist_rank // 2])


def test_a_bad_split_is_refused_on_every_rank(dist_world_size):
    w1, b1, w2, b2 = weights()
    if dist_world_size == 1:
        pytest.skip("one rank takes every split")
    with pytest.raises(ValueError, match="do not split evenly"):
        ParallelMLP(w1[:, :dist_world_size + 1], b1[:dist_world_size + 1], w2[:dist_world_size + 1], b2)
