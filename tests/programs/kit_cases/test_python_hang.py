"""Cases for tests/tools/test_testing_kit.py: rank 0 waits in Python past its time limit, then every rank
goes on with a fresh default group."""
import time

import numpy as np
import pytest

import hpc_c10d as dist


@pytest.mark.time_limit(2)
def test_rank_0_waits_for_ever(dist_rank):
    x = np.ones(2)
    dist.all_reduce(x)
    while dist_rank == 0:
        time.sleep(0.05)


def test_runs_on_a_fresh_group(dist_world):
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == dist.get_world_size()
