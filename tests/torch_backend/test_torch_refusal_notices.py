"""One rank's refusal under torch on backend "hpc": the others raise torch's DistBackendError.

The refusal is hpc_c10d's (torch's own checks in torch.distributed run before the backend is
called and tell nobody: docs/hangs.md, "One rank refuses"). The group's timeout (120 s) is far
beyond the test's time limit (60 s), so only the refusal's notice can end the others' wait.
"""
import datetime

import pytest

from support.torch_world import tdist, torch, torch_world

pytestmark = [pytest.mark.mpi, pytest.mark.world_size(2, 3), pytest.mark.time_limit(60)]


@pytest.fixture(scope="module", autouse=True)
def world():
    return torch_world()


def test_all_to_all_refused_by_one_rank_ends_everywhere_with_torch_errors():
    rank, size = tdist.get_rank(), tdist.get_world_size()
    group = tdist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=120))
    outs = [torch.zeros(3 if rank == 0 and i == 0 else 2) for i in range(size)]
    ins = [torch.zeros(2) for _ in range(size)]
    try:
        tdist.all_to_all(outs, ins, group=group)
    except Exception as exc:  # noqa: B902 - judged below
        error = exc
    else:
        error = None
    if rank == 0:
        assert type(error) is ValueError, error
    else:
        assert isinstance(error, tdist.DistBackendError), error
        assert "rank 0 refused its arguments" in str(error) and "all_to_all #" in str(error), error
    with pytest.raises(tdist.DistBackendError, match="unusable"):
        tdist.all_reduce(torch.ones(2), group=group)
    tdist.destroy_process_group(group)
    t = torch.ones(2)
    tdist.all_reduce(t)  # the world goes on
    assert t.tolist() == [size, size]
