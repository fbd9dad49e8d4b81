"""Shared fixtures: one process group for the whole session, at whatever size mpiexec gave."""
import pytest

import hpc_c10d as dist


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


def pytest_sessionfinish(session, exitstatus):
    if dist.is_initialized():
        dist.destroy_process_group()
