"""The shared set-up of the torch tests (tests/support/torch_world.py) checked: ranks, the
backend, the store, and hpc_c10d's view of the node under torch's default group.
"""
import pytest

from support.torch_world import tdist, torch_world  # first: without torch it skips this file

from hpc_c10d.torch.process_group import hpc_backend


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
