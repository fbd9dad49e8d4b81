"""Cases for tests/tools/test_testing_kit.py: tests that pass, skip and fail alike on every rank."""
import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d.testing import assert_same_on_ranks


def test_all_reduce_sums(dist_world, dist_rank, dist_world_size):
    x = np.full(4, dist_rank + 1, dtype=np.float32)
    dist.all_reduce(x)
    np.testing.assert_array_equal(x, np.full(4, dist_world_size * (dist_world_size + 1) / 2, np.float32))
    assert_same_on_ranks(x)


@pytest.mark.world_size(2, 4)
def test_only_at_two_or_four(dist_world_size):
    assert dist_world_size in (2, 4)


@pytest.mark.world_size(min_size=3)
def test_only_from_three(dist_world_size):
    assert dist_world_size >= 3


def test_subgroup_and_store(dist_new_group, dist_store, dist_rank, dist_world_size):
    group = dist_new_group(list(range(0, dist_world_size, 2)))
    if dist_rank % 2 == 0:
        y = np.ones(2, np.int64)
        dist.all_reduce(y, group=group)
        assert y[0] == len(range(0, dist_world_size, 2))
    dist_store.set(f"rank{dist_rank}", str(dist_rank))
    assert dist_store.get(f"rank{(dist_rank + 1) % dist_world_size}") == str((dist_rank + 1) % dist_world_size).encode()


def test_temp_paths(rank_tmp_path, shared_tmp_path, dist_rank, dist_world_size):
    (rank_tmp_path / "mine.txt").write_text(str(dist_rank))
    dist.barrier()
    assert sorted(p.name for p in shared_tmp_path.iterdir()) == sorted(f"rank{r}" for r in range(dist_world_size))


def test_skipped_on_every_rank():
    pytest.skip("skipped alike on every rank")


@pytest.mark.mpi(min_size=2)
@pytest.mark.world_size(max_size=3)
def test_composes_with_pytest_mpi(dist_world_size):
    assert 2 <= dist_world_size <= 3


def test_skipped_by_the_last_rank_only(dist_rank, dist_world_size):
    if dist_rank == dist_world_size - 1:
        pytest.skip("the last rank lacks something")
