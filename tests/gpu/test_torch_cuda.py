"""torch CUDA tensors through backend "hpc", and torch's own NCCL beside it.

The path is the one ``HPC_C10D_TORCH_CUDA`` chooses: torch's ProcessGroupNCCL over the MPI store
(``nccl``, the default) or hpc_c10d's NCCL transport (``hpc``); tests/gpu/device_run.sh runs the
file under each. They need a CUDA build of torch and one GPU per rank (and for ``hpc`` CuPy and
NCCL), and skip with the reason otherwise. On a one-GPU machine they run at world size 1:
``mpiexec -n 1 python -m pytest --with-mpi -m mpi tests/gpu/test_torch_cuda.py``. Outputs start out
filled with a sentinel, so an operation that moves nothing fails even where one rank's result
equals its input.
"""
import pytest

from support.torch_world import tdist, torch, torch_world

pytestmark = pytest.mark.mpi

if not torch.cuda.is_available():
    pytest.skip(f"no CUDA GPU (torch {torch.__version__} sees none)", allow_module_level=True)

from hpc_c10d.nccl import cuda, library  # noqa: E402
from hpc_c10d.torch import hpc_backend  # noqa: E402
from hpc_c10d.torch.torch_nccl import cuda_path  # noqa: E402

PATH = cuda_path()
if PATH == "hpc" and (cuda.visible_devices()[0] == 0 or not library.available()):
    pytest.skip("hpc_c10d's NCCL transport moves CUDA tensors with CuPy and NCCL (pip install cupy-cuda13x "
                "nvidia-nccl-cu13)", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SENTINEL = -7.0


@pytest.fixture(scope="module")
def device():
    """This rank's GPU, made current, under torch's default group on backend "hpc"."""
    torch_world()
    count, size = torch.cuda.device_count(), tdist.get_world_size()
    if size > count:
        pytest.skip(f"{size} ranks but {count} GPU(s): one GPU per rank is needed")
    index = tdist.get_rank() % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def test_the_group_takes_the_chosen_path(device):
    assert hpc_backend().cuda_path == PATH
    x = _full(1, torch.float32, device)
    tdist.all_reduce(x)
    assert x.eq(tdist.get_world_size()).all().item()
    if PATH == "nccl":
        assert hpc_backend()._cuda.latest[1] == "allreduce"  # it went to torch's ProcessGroupNCCL


def test_coalesced_and_batched_calls(device):
    rank, size = _ranks()
    outs = [_full(SENTINEL, torch.float32, device, 2 * size) for _ in range(2)]
    ins = [_full(rank + k, torch.float32, device, 2) for k in range(2)]
    with tdist._coalescing_manager(async_ops=True) as manager:
        for out, inp in zip(outs, ins):
            tdist.all_gather_into_tensor(out, inp)
    manager.wait()
    for k, out in enumerate(outs):
        assert out.view(size, 2)[:, 0].tolist() == [float(r + k) for r in range(size)]
    got = _full(SENTINEL, torch.float32, device)
    ops = [tdist.P2POp(tdist.isend, _full(rank + 3, torch.float32, device), (rank + 1) % size),
           tdist.P2POp(tdist.irecv, got, (rank - 1) % size)]
    if size > 1:
        for work in tdist.batch_isend_irecv(ops):
            work.wait()
        assert got.eq((rank - 1) % size + 3).all().item()


def _ranks():
    return tdist.get_rank(), tdist.get_world_size()


def _full(value, dtype, device, n=8):
    return torch.full((n,), float(value), dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reductions(device, dtype):
    rank, size = _ranks()
    total = size * (size + 1) / 2
    x = _full(rank + 1, dtype, device)
    tdist.all_reduce(x)
    assert x.float().eq(total).all().item()
    x = _full(rank + 1, dtype, device)
    tdist.all_reduce(x, op=tdist.ReduceOp.AVG)
    assert torch.allclose(x.float(), torch.full_like(x.float(), total / size), rtol=1e-2)
    x = _full(rank + 1, dtype, device)
    tdist.all_reduce(x, op=tdist._make_nccl_premul_sum(0.5))
    assert x.float().eq(total / 2).all().item()
    x = _full(rank + 1, dtype, device)
    tdist.all_reduce(x, op=tdist.ReduceOp.MAX)
    assert x.float().eq(size).all().item()
    x = _full(rank + 1, dtype, device)
    tdist.reduce(x, dst=size - 1)
    assert x.float().eq(total if rank == size - 1 else rank + 1).all().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_data_movement(device, dtype):
    rank, size = _ranks()
    x = _full(rank + 1, dtype, device)
    tdist.broadcast(x, src=size - 1)
    assert x.float().eq(size).all().item()
    flat = _full(SENTINEL, dtype, device, 4 * size)
    tdist.all_gather_into_tensor(flat, _full(rank, dtype, device, 4))
    assert flat.float().view(size, 4)[:, 0].tolist() == [float(r) for r in range(size)]
    blocks = [_full(SENTINEL, dtype, device, 4) for _ in range(size)]
    tdist.all_gather(blocks, _full(rank, dtype, device, 4))
    assert [b.float()[0].item() for b in blocks] == [float(r) for r in range(size)]
    out = _full(SENTINEL, dtype, device, 4)
    tdist.reduce_scatter_tensor(out, torch.arange(4 * size, dtype=dtype, device=device))
    expected = torch.arange(rank * 4, rank * 4 + 4, device=device).float() * size
    assert torch.equal(out.float(), expected)
    inp = torch.arange(2 * size, dtype=dtype, device=device) + 100 * rank
    out = _full(SENTINEL, dtype, device, 2 * size)
    tdist.all_to_all_single(out, inp)
    assert out.float().tolist() == [float(100 * r + 2 * rank + i) for r in range(size) for i in range(2)]
    gathered = [_full(SENTINEL, dtype, device, 3) for _ in range(size)] if rank == 0 else None
    tdist.gather(_full(rank + 5, dtype, device, 3), gathered, dst=0)
    if rank == 0:
        assert [g.float()[0].item() for g in gathered] == [float(r + 5) for r in range(size)]
    got = _full(SENTINEL, dtype, device, 3)
    tdist.scatter(got, [_full(r + 9, dtype, device, 3) for r in range(size)] if rank == 0 else None, src=0)
    assert got.float().eq(rank + 9).all().item()
    tdist.barrier()


def test_async_work_orders_the_callers_stream(device):
    rank, size = _ranks()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device=device)
        for _ in range(20):
            x += 1  # queued before the collective on the same stream: it must wait for them
        work = tdist.all_reduce(x, async_op=True)
        work.wait()  # the stream waits; the host does not
        y = x * 2
    side.synchronize()
    assert y.min().item() == y.max().item() == 40.0 * size
    assert work.is_completed()


def _twin_models(device):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    reference.load_state_dict(model.state_dict())
    return model, reference


def _train(model, reference, device, full_params):
    """Three SGD steps: ``model`` on this rank's rows, ``reference`` alone on every rank's rows."""
    rank, size = _ranks()
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    gen = torch.Generator(device="cpu").manual_seed(3)
    for _ in range(3):
        x, y = torch.randn(4 * size, 16, generator=gen).to(device), torch.randn(4 * size, 4, generator=gen).to(device)
        for net, optimiser, rows in ((model, opt, slice(4 * rank, 4 * rank + 4)), (reference, ref_opt, slice(None))):
            optimiser.zero_grad()
            torch.nn.functional.mse_loss(net(x[rows]), y[rows]).backward()
            optimiser.step()
        for mine, ref in zip(full_params(model), reference.parameters()):
            torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-5)


def test_ddp_matches_one_process(device):
    model, reference = _twin_models(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    _train(ddp, reference, device, lambda m: m.module.parameters())


def test_fsdp2_matches_one_process(device):
    from torch.distributed.fsdp import fully_shard

    model, reference = _twin_models(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    _train(model, reference, device, lambda m: [p.full_tensor() for p in m.parameters()])


def test_functional_collectives_carry_gradients(device):
    import torch.distributed.nn.functional as fn

    rank, size = _ranks()
    x = torch.full((3,), float(rank + 1), device=device, requires_grad=True)
    gathered = fn.all_gather(x)
    loss = sum((r + 1) * g.sum() for r, g in enumerate(gathered))
    loss.backward()  # all_gather's backward reduce-scatters: every rank weighted this rank's block by rank + 1
    assert x.grad.eq(size * (rank + 1)).all().item()
    z = torch.full((2,), float(rank + 1), device=device, requires_grad=True)
    (fn.all_reduce(z) * 3).sum().backward()
    assert z.grad.eq(3 * size).all().item()


def test_torchs_own_nccl_beside_hpc(device):
    rank, size = _ranks()
    group = tdist.new_group(list(range(size)), backend="nccl")  # bootstrapped through the default (MPI) store
    assert tdist.get_backend(group) == "nccl"
    x = _full(rank + 1, torch.float32, device)
    tdist.all_reduce(x, group=group)
    torch.cuda.synchronize()
    assert x.eq(size * (size + 1) / 2).all().item()
    tdist.destroy_process_group(group)
