"""Cases for tests/tools/test_testing_kit.py: a collective only rank 0 enters; then a test that needs every rank."""
import numpy as np
import pytest

import hpc_c10d as dist


@pytest.mark.time_limit(3)
def test_only_rank_0_all_reduces(dist_rank):
    x = np.ones(4, dtype=np.float32)
    if dist_rank == 0:
        dist.all_reduce(x)


def test_runs_on_a_fresh_group(dist_world):
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == dist.get_world_size()
