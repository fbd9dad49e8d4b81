"""Thread pools at init_process_group: each rank's BLAS/OpenMP pools hold its share of the node's cores
(read back with threadpoolctl and torch under mpiexec), unless the user sized them or switched this off."""
import importlib.util
import json

import pytest

from support.launch import job_sizes, launch, mpiexec
from hpc_c10d.job import threads

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
PROGRAM = "tests/programs/thread_pools.py"
ANNOUNCEMENT = "thread pools limited to"


def _run(nprocs, *args, **env):
    """Every rank's record, and stderr, of the program in a job without any thread setting of ours."""
    clean = {name: "" for name in threads.THREAD_VARIABLES + (threads.SWITCH,)}
    result, cmd = launch(nprocs, [PROGRAM, *args], 120, env={**clean, **env})
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    records = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("[")))
    assert sorted(r["rank"] for r in records) == list(range(nprocs))
    return records, result.stderr


def _expected(record, records):
    """The reference: this rank's cores divided among the ranks whose masks overlap them."""
    mine = set(record["mask"])
    sharing = sum(1 for other in records if mine & set(other["mask"]))
    return max(1, len(mine) // sharing)


@pytest.mark.parametrize("nprocs", job_sizes(1, 3))
def test_pools_hold_this_ranks_share_of_the_cores(nprocs):
    want_torch = importlib.util.find_spec("torch") is not None
    records, stderr = _run(nprocs, *(["--torch"] if want_torch else []))
    for record in records:
        expected = _expected(record, records)
        assert record["after"] and set(record["after"].values()) == {expected}, record
        if want_torch:
            assert record["torch"] == expected, record
    assert stderr.count(ANNOUNCEMENT) == (1 if nprocs > 1 else 0), stderr


def test_torch_backend_hpc_limits_the_pools_too():
    pytest.importorskip("torch", reason="torch is not installed")
    records, stderr = _run(2, "--torch", "--plugin")
    for record in records:
        expected = _expected(record, records)
        assert set(record["after"].values()) == {expected} and record["torch"] == expected, record
    assert stderr.count(ANNOUNCEMENT) == 1, stderr


@pytest.mark.parametrize("env", [{"OMP_NUM_THREADS": "2"}, {"OPENBLAS_NUM_THREADS": "2"},
                                 {threads.SWITCH: "0"}])
def test_pools_are_left_alone_when_the_user_chose(env):
    records, stderr = _run(2, **env)
    for record in records:
        assert record["after"] == record["before"], record
    assert ANNOUNCEMENT not in stderr


@pytest.mark.parametrize("mine, masks, expected", [
    ({0, 1}, [{0, 1}, {0, 1}], (1, 2)),
    ({0, 1, 2, 3}, [{0, 1, 2, 3}, {4, 5, 6, 7}], (4, 1)),  # bound by the launcher: no one shares
    ({0, 1, 2, 3, 4, 5, 6, 7}, [set(range(8))] * 3, (2, 3)),
    ({0}, [{0}] * 4, (1, 4)),  # never below one thread
])
def test_share_divides_the_mask_among_the_ranks_that_overlap_it(mine, masks, expected):
    assert threads.share(mine, masks) == expected


def test_a_bad_switch_is_a_value_error_before_mpi_starts(monkeypatch):
    import hpc_c10d as dist

    monkeypatch.setenv(threads.SWITCH, "yes")
    with pytest.raises(ValueError, match="HPC_C10D_LIMIT_THREADS='yes' must be 1"):
        dist.init_process_group()
    assert not dist.is_initialized()
