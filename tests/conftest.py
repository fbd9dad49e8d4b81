"""Shared fixtures: one process group for the whole session, at whatever size mpiexec gave; the
designated simulated cluster for serial tests that start multi-node jobs on it. Under pytest-xdist
(run_suite.py --jobs) the tests of the simulated cluster run one after another on one worker."""
from pathlib import Path

import pytest

from support import launch, ledger
import hpc_c10d as dist


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=60,
                     help="examples per plan of tests/core/test_fuzz.py (CI's fixed budget: 60)")
    parser.addoption("--fuzz-seed", type=int, default=None,
                     help="tests/core/test_fuzz.py: draw from this seed instead of the derandomized examples")
    parser.addoption("--fuzz-classes", default=None, metavar="PATH",
                     help="tests/core/test_fuzz.py: write the classes of refusals it met into PATH (docs/bad_input.md)")
    parser.addoption("--skip-ran", default=None, metavar="PATH",
                     help="leave out the tests whose ids (tests/support/ledger.py) PATH lists, a line each: what an "
                          "earlier run ran already (run_suite.py --skip-ran-in)")


# Test files whose tests start jobs on the designated simulated cluster: they share its nodes and links (a
# test cuts node2's link). Jobs on the designated SLURM cluster share nothing but its CPUs.
SIM_CLUSTER_TESTS = frozenset({"test_sim_cluster", "test_multinode", "test_multinode_faults", "test_ulfm_multinode"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``--dist load`` (run_suite.py --jobs): each test goes to the next free worker, but the
    tests of the simulated cluster go to one worker, one after another."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneSimClusterWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return "sim cluster" if Path(nodeid.partition("::")[0]).stem in SIM_CLUSTER_TESTS else nodeid

    return OneSimClusterWorker(config, log)


def pytest_collection_modifyitems(config, items):
    """Leave out what ``--skip-ran`` lists; put the tests marked ``long`` first (a stable sort), so
    that under xdist no worker starts one while the others run out of work."""
    path = config.getoption("--skip-ran")
    if path:
        with open(path) as f:
            ran = set(f.read().splitlines())
        done = {item for item in items if ledger.item_id(item.nodeid) in ran}
        if done:
            config.hook.pytest_deselected(items=list(done))
            items[:] = [item for item in items if item not in done]
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def world():
    """The default process group, initialised once per test session."""
    if not dist.is_initialized():
        dist.init_process_group()
    return dist.group.WORLD


@pytest.fixture
def rank(world):
    return dist.get_rank()


@pytest.fixture
def size(world):
    return dist.get_world_size()


@pytest.fixture(scope="session")
def sim_cluster():
    """The designated simulated cluster's settings (``launch.sim_cluster_settings``) for a serial test
    that starts jobs on 2 of its nodes; skips without one, fails under HPC_C10D_REQUIRE_SIM_CLUSTER=1."""
    if launch.outer_world_size() > 1:
        pytest.skip("serial test that starts jobs on the simulated cluster itself; run without mpiexec")
    problem = launch.sim_cluster_problem(2) if launch.mpiexec() else \
        "no mpiexec beside the Python interpreter or on PATH"
    if problem:
        if launch.sim_cluster_required():
            pytest.fail(f"{launch.SIM_REQUIRED}=1 but {problem}")
        pytest.skip(problem)
    return launch.sim_cluster_settings()


def pytest_sessionfinish(session, exitstatus):
    if dist.is_initialized():
        dist.destroy_process_group()
