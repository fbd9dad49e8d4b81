"""Cases for tests/tools/test_testing_kit.py: a test that fails on the last rank only, values that differ between
ranks, a fixture that breaks on the last rank only, then a test that passes."""
import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d.testing import assert_same_on_ranks


def test_fails_on_the_last_rank(dist_rank, dist_world_size):
    x = np.array([dist_rank], dtype=np.int64)
    dist.broadcast(x, src=0)
    assert dist_rank != dist_world_size - 1, f"the last rank's own check failed (broadcast gave {x[0]})"


def test_values_differ_between_ranks(dist_rank, dist_world_size):
    assert_same_on_ranks(np.arange(3) * (dist_rank == dist_world_size - 1))


@pytest.fixture
def broken_on_the_last_rank(dist_rank, dist_world_size):
    if dist_rank == dist_world_size - 1:
        raise RuntimeError("the last rank's fixture broke")


def test_needs_a_fixture_that_breaks(broken_on_the_last_rank):
    dist.all_reduce(np.ones(1))  # never reached: no rank runs a test whose setup failed on one


def test_still_runs_afterwards(dist_world):
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == dist.get_world_size()
