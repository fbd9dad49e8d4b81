"""torch's own ``dist.shrink_group`` on backend "hpc", every rank alive: torch's checks, and a
subgroup without its last rank (shrinking after a death: tests/failures/test_ulfm.py)."""
import pytest

from support.torch_world import tdist, torch, torch_world

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", autouse=True)
def world():
    return torch_world()


def test_backend_hpc_supports_shrinking(world):
    assert world._get_backend(torch.device("cpu")).supports_shrinking
    with pytest.raises(ValueError, match="ranks_to_exclude cannot be empty"):
        tdist.shrink_group([])
    if tdist.get_world_size() > 1:
        with pytest.raises(RuntimeError, match=f"Current rank {tdist.get_rank()} is in the exclusion list"):
            tdist.shrink_group([tdist.get_rank()])


def test_a_subgroup_without_its_last_rank(world):
    size, rank = tdist.get_world_size(), tdist.get_rank()
    if size < 2:
        pytest.skip("needs a rank to leave out")
    group = tdist.new_group(list(range(size)))
    if rank == size - 1:
        tdist.destroy_process_group(group)
        return
    shrunk = tdist.shrink_group([size - 1], group=group)
    assert tdist.get_process_group_ranks(shrunk) == list(range(size - 1))
    assert shrunk.rank() == rank and shrunk.size() == size - 1
    t = torch.full((3,), float(rank + 1))
    tdist.all_reduce(t, group=shrunk)
    assert torch.equal(t, torch.full((3,), float(sum(range(1, size)))))
    assert group not in tdist.distributed_c10d._world.pg_map  # torch forgot the old group
    tdist.destroy_process_group(shrunk)
