"""Cases for tests/tools/test_testing_kit.py: a failure, then a collective that only one rank enters (rank 0, or the
last with HANG_RANK=last), then tests that cannot run after it."""
import os

import numpy as np
import pytest

import hpc_c10d as dist


def test_fails_first(dist_rank):
    assert dist_rank == -1, "every rank fails this one"


@pytest.mark.time_limit(3)
def test_one_rank_all_reduces(dist_rank, dist_world_size):
    if dist_rank == (dist_world_size - 1 if os.environ.get("HANG_RANK") == "last" else 0):
        dist.all_reduce(np.ones(4, np.float32))


def test_later(dist_world):
    dist.all_reduce(np.ones(1))


@pytest.mark.parametrize("n", [1, 2])
def test_later_too(dist_world, n):
    dist.all_reduce(np.ones(n))
