"""shrink_group with every rank alive, on any MPI: torch's argument checks, and live ranks left out.

Only subgroups are shrunk here (the session's default group must stay whole for the tests after);
shrinking the default group, and shrinking after a rank died (ULFM), run as jobs of their own in
tests/failures/test_ulfm.py.
"""
import numpy as np
import pytest

import hpc_c10d as dist

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks, flags, error, message", [
    ((0,), dist.SHRINK_DEFAULT, TypeError, "ranks_to_exclude must be a list, but got tuple"),
    ([], dist.SHRINK_DEFAULT, ValueError, "ranks_to_exclude cannot be empty"),
    ([0], 2, ValueError, "Invalid shrink_flags value: 2"),
    ([0], "abort", ValueError, "Invalid shrink_flags value: abort"),
])
def test_arguments_are_checked_as_torch_does(world, ranks, flags, error, message):
    with pytest.raises(error, match=message):
        dist.shrink_group(ranks, shrink_flags=flags)


def test_ranks_are_checked_as_torch_does(world, rank, size):
    if size == 1:
        with pytest.raises(ValueError, match="Cannot shrink a process group with size 1"):
            dist.shrink_group([0])
        return
    for ranks, error, message in [
        ([0.5], TypeError, "Element at index 0 is float: 0.5"),
        ([size], ValueError, f"Rank {size} at index 0 is out of bounds for group size {size}"),
        ([-1], ValueError, "Rank -1 at index 0 is out of bounds"),
        ([1, 1], ValueError, "Duplicate rank 1 found in ranks_to_exclude at index 1"),
        (list(range(size)), ValueError, f"Cannot exclude all {size} ranks from process group"),
        ([rank], RuntimeError, f"Current rank {rank} is in the exclusion list"),
    ]:
        with pytest.raises(error, match=message):
            dist.shrink_group(ranks)
    assert dist.get_world_size() == size  # nothing changed


@pytest.mark.parametrize("left_out", ["last", "first_and_last"])
def test_live_ranks_left_out_of_a_subgroup(world, rank, size, left_out):
    if size < (3 if left_out == "first_and_last" else 2):
        pytest.skip(f"leaving out {left_out.replace('_', ' ')} rank(s) needs a rank that stays")
    group = dist.new_group()
    excluded = [size - 1] if left_out == "last" else [0, size - 1]
    staying = [r for r in range(size) if r not in excluded]
    if rank in excluded:  # those left out take no part, as torch requires
        dist.destroy_process_group(group)
        return
    shrunk = dist.shrink_group(excluded, group=group)
    assert dist.get_process_group_ranks(shrunk) == staying
    assert dist.get_rank(shrunk) == staying.index(rank)
    data = np.full(4, rank + 1.0)
    dist.all_reduce(data, group=shrunk)
    np.testing.assert_array_equal(data, np.full(4, sum(r + 1.0 for r in staying)))
    with pytest.raises(ValueError, match="Invalid process group specified or has been destroyed"):
        dist.all_reduce(np.ones(1), group=group)  # the old group is gone on the ranks that shrank it
    dist.destroy_process_group(shrunk)


def test_shrink_abort_needs_ulfm(world, size):
    from mpi4py import MPI

    from hpc_c10d.mpi import ulfm

    if ulfm.enabled(MPI) or size == 1:
        pytest.skip("the MPI here can revoke (ULFM)" if size > 1 else "needs a rank to leave out")
    with pytest.raises(RuntimeError, match="SHRINK_ABORT.*needs an MPI that outlives a dead process .ULFM."):
        dist.shrink_group([size - 1] if dist.get_rank() != size - 1 else [0], shrink_flags=dist.SHRINK_ABORT)
