"""DeviceMesh, DTensor and distributed checkpoints (DCP) on backend "hpc" (2 and 4 ranks)."""
import os
import shutil
import tempfile

import pytest

from support.torch_world import sizes_only, tdist, torch, torch_world

pytestmark = [pytest.mark.mpi, sizes_only(2, 4)]


@pytest.fixture(scope="module", autouse=True)
def world():
    return torch_world()


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (tdist.get_world_size(),))


def whole(rows_per_rank=2, cols=3):
    return torch.arange(tdist.get_world_size() * rows_per_rank * cols, dtype=torch.float32).reshape(-1, cols)


def test_dtensor_shard_compute_and_redistribute(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = whole()
    dt = distribute_tensor(full, mesh, [Shard(0)])
    assert dt.to_local().shape == (2, 3)
    torch.testing.assert_close(dt.full_tensor(), full)
    torch.testing.assert_close((dt * 2).sum().full_tensor(), full.sum() * 2)
    weight = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    product = dt @ distribute_tensor(weight, mesh, [Replicate()])
    torch.testing.assert_close(product.full_tensor(), full @ weight)
    replicated = dt.redistribute(mesh, [Replicate()])
    torch.testing.assert_close(replicated.to_local(), full)


@sizes_only(4)
def test_two_dimensional_mesh_groups():
    from torch.distributed.device_mesh import init_device_mesh

    mesh2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = tdist.get_rank()
    for dim, partners in (("tp", [rank - rank % 2, rank - rank % 2 + 1]), ("dp", [rank % 2, rank % 2 + 2])):
        t = torch.tensor([float(rank)])
        tdist.all_reduce(t, group=mesh2d.get_group(dim))
        assert t.item() == sum(partners), dim


def test_dcp_save_and_load_sharded_state(mesh):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor

    box = [tempfile.mkdtemp(prefix="hpc_c10d_dcp_") if tdist.get_rank() == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    path = os.path.join(box[0], "ckpt")
    full = whole()
    dcp.save({"w": distribute_tensor(full, mesh, [Shard(0)]), "step": torch.tensor(7)}, checkpoint_id=path)
    target = {"w": distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)]), "step": torch.tensor(0)}
    dcp.load(target, checkpoint_id=path)
    tdist.barrier()
    if tdist.get_rank() == 0:
        shutil.rmtree(box[0])
    torch.testing.assert_close(target["w"].full_tensor(), full)
    assert target["step"].item() == 7
