"""Cases for tests/tools/test_testing_kit.py: rank 0 waits for a store key that no rank sets; then a test
on a fresh group."""
from datetime import timedelta

import numpy as np
import pytest

import hpc_c10d as dist


@pytest.mark.time_limit(2)
def test_rank_0_waits_for_a_key_nobody_sets(dist_store, dist_rank):
    if dist_rank == 0:
        dist_store.wait(["never-set"], timedelta(seconds=60))


def test_runs_on_a_fresh_group(dist_world):
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == dist.get_world_size()
