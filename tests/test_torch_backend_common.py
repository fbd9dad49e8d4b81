"""Shared set-up for the torch-backend tests, and the checks of the set-up itself.

Every MPI rank of a pytest run initialises torch.distributed once, with backend "hpc" and the
``mpi://`` rendezvous, beside hpc_c10d's own default group (conftest). The group stays up for
the whole session; MPIStore's exit hook frees the rendezvous store.
"""
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'torch>=2.11,<2.16')")
tdist = pytest.importorskip("torch.distributed")

from hpc_c10d.torch import BACKEND_NAME, register  # noqa: E402
from hpc_c10d.torch._process_group import hpc_backend  # noqa: E402


def _guest_watchdog():
    """The watchdog torch's default group starts writes its dumps and alarm files into a directory
    the ranks share, made here and removed at exit, and holds no roll call (no ports)."""
    import atexit
    import shutil
    import tempfile

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    folder = comm.bcast(tempfile.mkdtemp(prefix="hpc_c10d-traces-") if comm.Get_rank() == 0 else None)
    if comm.Get_rank() == 0:
        atexit.register(shutil.rmtree, folder, True)
    os.environ.setdefault("HPC_C10D_TRACE_DIR", folder)
    os.environ.setdefault("HPC_C10D_ABORT_GRACE", "0")


def torch_world():
    """torch's default group on backend "hpc" (initialised on first use)."""
    if not tdist.is_initialized():
        register()
        _guest_watchdog()
        tdist.init_process_group(BACKEND_NAME, init_method="mpi://")
    return tdist.group.WORLD


def sizes_only(*sizes):
    """Skip unless the MPI world has one of ``sizes`` ranks (for tests that need a partner)."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    return pytest.mark.skipif(size not in sizes, reason=f"runs at {sizes} ranks; this run has {size}")


@pytest.mark.mpi
def test_rendezvous_gives_mpi_ranks_and_the_hpc_backend():
    from mpi4py import MPI

    world = torch_world()
    assert tdist.get_rank() == MPI.COMM_WORLD.Get_rank()
    assert tdist.get_world_size() == MPI.COMM_WORLD.Get_size()
    assert tdist.get_backend() == "hpc" and hpc_backend(world).name() == "hpc"


@pytest.mark.mpi
def test_default_store_is_shared_through_mpi():
    torch_world()
    store = tdist.distributed_c10d._get_default_store()
    rank, size = tdist.get_rank(), tdist.get_world_size()
    store.set(f"common/{rank}", str(rank * 10))
    store.wait([f"common/{r}" for r in range(size)])
    assert [store.get(f"common/{r}") for r in range(size)] == [str(r * 10).encode() for r in range(size)]
    assert store.add("common/counter", 1) >= 1
    tdist.barrier()
    assert store.add("common/counter", 0) == size



@pytest.mark.mpi
def test_hpc_c10d_knows_each_ranks_place_on_its_node_under_torch(monkeypatch):
    """hpc_c10d's node-local rank (what bind_local_device and new_subgroups read) with torch's world on
    "hpc" as the only default group: alone, this file leaves hpc_c10d none of its own."""
    import socket

    import hpc_c10d

    torch_world()
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    hosts = [None] * tdist.get_world_size()
    tdist.all_gather_object(hosts, socket.gethostname())
    rank = tdist.get_rank()
    assert hpc_c10d.get_node_local_rank() == hosts[:rank].count(hosts[rank])
