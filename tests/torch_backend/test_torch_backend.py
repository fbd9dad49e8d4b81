"""torch.distributed's functions on tensors, through backend "hpc" (any number of ranks).

Every result is compared with a reference computed locally from what each rank contributed.
"""
import datetime

import pytest

from support.torch_world import sizes_only, tdist, torch, torch_world

from hpc_c10d.torch.process_group import PER_DEVICE_BACKEND, hpc_backend

pytestmark = pytest.mark.mpi

ReduceOp = tdist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
OPS = {ReduceOp.SUM: lambda xs: torch.stack(xs).sum(0), ReduceOp.MAX: lambda xs: torch.stack(xs).amax(0),
       ReduceOp.MIN: lambda xs: torch.stack(xs).amin(0), ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0)}


@pytest.fixture(scope="module", autouse=True)
def world():
    return torch_world()


def _rank():
    return tdist.get_rank()


def _size():
    return tdist.get_world_size()


def contribution(rank, n=5, dtype=torch.float32):
    """What ``rank`` puts in: small integers (exact in every dtype, no uint8 overflow for products)."""
    return ((torch.arange(n) + rank) % 3 + 1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(OPS), ids=lambda op: str(op).split(".")[-1])
def test_all_reduce(dtype, op):
    t = contribution(_rank(), dtype=dtype)
    tdist.all_reduce(t, op=op)
    expected = OPS[op]([contribution(r, dtype=dtype) for r in range(_size())]).to(dtype)
    torch.testing.assert_close(t, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_all_reduce_avg_and_premul_sum(dtype):
    t = contribution(_rank(), dtype=dtype)
    tdist.all_reduce(t, op=ReduceOp.AVG)
    total = sum(contribution(r) for r in range(_size()))
    torch.testing.assert_close(t, (total / _size()).to(dtype))
    t = contribution(_rank(), dtype=dtype)
    tdist.all_reduce(t, op=tdist._make_nccl_premul_sum(0.5))
    torch.testing.assert_close(t, (total * 0.5).to(dtype))


def test_all_reduce_complex_and_large():
    z = torch.full((3,), complex(_rank(), 1.0), dtype=torch.complex64)
    tdist.all_reduce(z)
    torch.testing.assert_close(z, torch.full((3,), complex(sum(range(_size())), _size()), dtype=torch.complex64))
    big = torch.full((1 << 18,), float(_rank() + 1))  # 1 MiB
    tdist.all_reduce(big)
    assert torch.equal(big, torch.full_like(big, _size() * (_size() + 1) / 2))


def test_async_work_wait_and_future():
    t = contribution(_rank())
    work = tdist.all_reduce(t, async_op=True)
    assert work.wait(timeout=datetime.timedelta(seconds=60))
    if not PER_DEVICE_BACKEND:  # from 2.14 torch's Work trampoline reaches wait() and get_future() only
        assert work.is_completed() and work.is_success() and work.exception() is None
    expected = sum(contribution(r) for r in range(_size()))
    torch.testing.assert_close(t, expected)
    doubled = tdist.all_reduce(t, async_op=True).get_future().then(lambda fut: fut.value()[0] * 2)
    torch.testing.assert_close(doubled.wait(), expected * _size() * 2)


def test_a_blocking_calls_handle_is_finished_and_holds_that_calls_outputs():
    """With asyncOp false the group hands back a finished handle (one object, reused between
    blocking calls); its result() is the outputs of the call that returned it."""
    from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions

    backend = tdist.group.WORLD._get_backend(torch.device("cpu"))
    reduce_opts, broadcast_opts = AllreduceOptions(), BroadcastOptions()
    reduce_opts.asyncOp = broadcast_opts.asyncOp = False
    for value in (1.0, 2.0):
        summed, copied = torch.full((3,), value), torch.full((2,), value + _rank())
        work = backend.allreduce([summed], reduce_opts)
        assert work.is_completed() and work.wait() and work.result()[0] is summed
        torch.testing.assert_close(summed, torch.full((3,), value * _size()))
        work = backend.broadcast([copied], broadcast_opts)  # rootRank 0
        assert work.is_completed() and work.result()[0] is copied
        torch.testing.assert_close(copied, torch.full((2,), value))


def test_broadcast_from_every_root():
    for root in range(_size()):
        t = torch.full((4,), float(_rank()), dtype=torch.bfloat16)
        tdist.broadcast(t, src=root)
        assert torch.equal(t, torch.full((4,), float(root), dtype=torch.bfloat16))


def test_reduce_to_last_rank():
    root = _size() - 1
    t = contribution(_rank(), dtype=torch.int64)
    tdist.reduce(t, dst=root, op=ReduceOp.SUM)
    if _rank() == root:
        assert torch.equal(t, sum(contribution(r, dtype=torch.int64) for r in range(_size())))


def test_all_gather_list_and_tensor():
    mine = contribution(_rank(), dtype=torch.float16)
    outs = [torch.empty_like(mine) for _ in range(_size())]
    tdist.all_gather(outs, mine)
    for r, out in enumerate(outs):
        assert torch.equal(out, contribution(r, dtype=torch.float16))
    flat = torch.empty(_size() * mine.numel(), dtype=torch.float16)
    tdist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat([contribution(r, dtype=torch.float16) for r in range(_size())]))


@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather_coalesced_lays_out_one_list_per_rank(async_op):
    """torch's layout is output_tensor_lists[rank][tensor]; with as many same-shaped tensors as
    ranks a transposed result would raise nothing."""
    inputs = [torch.full((2,), 10 * j + _rank(), dtype=torch.int64) for j in range(_size())]
    outputs = [[torch.zeros(2, dtype=torch.int64) for _ in inputs] for _ in range(_size())]
    with pytest.warns(FutureWarning):
        done = tdist.all_gather_coalesced(outputs, inputs, async_op=async_op)
    if async_op:
        done.wait()
    for r in range(_size()):
        for j in range(_size()):
            assert torch.equal(outputs[r][j], torch.full((2,), 10 * j + r, dtype=torch.int64)), (r, j)


def test_all_gather_into_tensor_with_input_inside_output():
    """FSDP2's pattern: the input is this rank's block of the output buffer."""
    n = 4
    flat = torch.zeros(_size() * n)
    block = flat[_rank() * n:(_rank() + 1) * n]
    block.copy_(contribution(_rank(), n))
    tdist.all_gather_into_tensor(flat, block)
    assert torch.equal(flat, torch.cat([contribution(r, n) for r in range(_size())]))


def test_reduce_scatter_list_and_tensor():
    n = 3
    inputs = [contribution(_rank() + k, n) for k in range(_size())]
    out = torch.empty(n)
    tdist.reduce_scatter(out, inputs)
    torch.testing.assert_close(out, sum(contribution(r + _rank(), n) for r in range(_size())))
    whole = torch.cat(inputs)
    tdist.reduce_scatter_tensor(out, whole, op=ReduceOp.MAX)
    torch.testing.assert_close(out, torch.stack([contribution(r + _rank(), n) for r in range(_size())]).amax(0))


def test_all_to_all_single_uneven_and_list():
    size, rank = _size(), _rank()
    # rank r sends (r + d + 1) rows to rank d, each row filled with 100 * r + d
    send_counts = [rank + d + 1 for d in range(size)]
    recv_counts = [s + rank + 1 for s in range(size)]
    inp = torch.cat([torch.full((c, 2), 100.0 * rank + d) for d, c in enumerate(send_counts)])
    out = torch.empty(sum(recv_counts), 2)
    tdist.all_to_all_single(out, inp, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    expected = torch.cat([torch.full((c, 2), 100.0 * s + rank) for s, c in enumerate(recv_counts)])
    assert torch.equal(out, expected)
    outs = [torch.empty(2, dtype=torch.int32) for _ in range(size)]
    tdist.all_to_all(outs, [torch.full((2,), 10 * rank + d, dtype=torch.int32) for d in range(size)])
    assert [o.tolist() for o in outs] == [[10 * s + rank] * 2 for s in range(size)]


def test_gather_and_scatter():
    root = 0
    mine = contribution(_rank())
    gathered = [torch.empty_like(mine) for _ in range(_size())] if _rank() == root else None
    tdist.gather(mine, gathered, dst=root)
    if _rank() == root:
        for r, g in enumerate(gathered):
            assert torch.equal(g, contribution(r))
    out = torch.empty(5)
    pieces = [contribution(r) * 7 for r in range(_size())] if _rank() == root else None
    tdist.scatter(out, pieces, src=root)
    assert torch.equal(out, contribution(_rank()) * 7)


def test_barrier_and_monitored_state():
    tdist.barrier()
    assert tdist.barrier(async_op=True).wait()


def test_object_collectives():
    rank, size = _rank(), _size()
    objs = [None] * size
    tdist.all_gather_object(objs, {"rank": rank, "text": "x" * rank})
    assert objs == [{"rank": r, "text": "x" * r} for r in range(size)]
    box = [("from", rank), None]
    tdist.broadcast_object_list(box, src=size - 1)
    assert box == [("from", size - 1), None]
    out = [None]
    tdist.scatter_object_list(out, [f"for {r}" for r in range(size)] if rank == 0 else None, src=0)
    assert out == [f"for {rank}"]
    gathered = [None] * size if rank == 0 else None
    tdist.gather_object(rank * 3, gathered, dst=0)
    if rank == 0:
        assert gathered == [r * 3 for r in range(size)]


@sizes_only(1, 2, 3, 4)
def test_batch_isend_irecv_is_one_batch_of_the_backend(monkeypatch):
    """torch's batch_isend_irecv on backend "hpc" reaches the backend once, with every operation
    (on CUDA tensors: one NCCL group, so a ring cannot wait on itself), not one isend at a time."""
    from hpc_c10d.torch.process_group import ProcessGroupHPC

    batches = []
    original = ProcessGroupHPC.batch_p2p

    def recorded(self, ops):
        batches.append([(is_send, peer) for is_send, _, peer, _ in ops])
        return original(self, ops)

    monkeypatch.setattr(ProcessGroupHPC, "batch_p2p", recorded)
    rank, size = _rank(), _size()
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(4, dtype=torch.float64)
    sent = torch.full((4,), rank + 0.5, dtype=torch.float64)
    ops = [tdist.P2POp(tdist.irecv, got, left), tdist.P2POp(tdist.isend, sent, right)]
    works = tdist.batch_isend_irecv(ops)
    assert len(works) == 2
    for work in works:
        work.wait()
    assert torch.equal(got, torch.full((4,), left + 0.5, dtype=torch.float64))
    assert batches == [[(False, left), (True, right)]]


@sizes_only(2, 3, 4)
def test_send_recv_ring_and_any_source():
    rank, size = _rank(), _size()
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(3, dtype=torch.bfloat16)
    ops = [tdist.P2POp(tdist.isend, torch.full((3,), float(rank), dtype=torch.bfloat16), right),
           tdist.P2POp(tdist.irecv, got, left)]
    for work in tdist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got, torch.full((3,), float(left), dtype=torch.bfloat16))
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            buf = torch.empty(1, dtype=torch.int64)
            src = tdist.recv(buf)
            assert buf.item() == src * 11
            seen.add(src)
        assert seen == set(range(1, size))
    else:
        tdist.send(torch.tensor([rank * 11]), dst=0)


@sizes_only(2, 3, 4)
def test_point_to_point_handles_answer_every_method():
    """isend/irecv handles say they are done, hold their tensor and, from any source, the sender
    (from torch 2.14 the plugin's isend/irecv hand back the backend's own handle)."""
    rank, size = _rank(), _size()
    right, left = (rank + 1) % size, (rank - 1) % size
    sent, got = torch.full((2,), float(rank)), torch.empty(2)
    works = [tdist.isend(sent, right), tdist.irecv(got, left)]
    for work in works:
        assert work.wait() and work.is_completed() and work.is_success() and work.exception() is None
    assert works[1].result()[0] is got and torch.equal(got, torch.full((2,), float(left)))
    anyone = torch.empty(2)
    work = tdist.isend(sent, right), tdist.irecv(anyone)
    for w in work:
        w.wait()
    assert work[1]._source_rank() == left and torch.equal(anyone, torch.full((2,), float(left)))


@sizes_only(2, 3, 4)
def test_subgroup_of_even_ranks():
    evens = list(range(0, _size(), 2))
    group = tdist.new_group(evens)
    t = torch.ones(2) * _rank()
    if _rank() in evens:
        tdist.all_reduce(t, group=group)
        assert torch.equal(t, torch.ones(2) * sum(evens))
        assert tdist.get_rank(group) == evens.index(_rank())
        assert tdist.get_process_group_ranks(group) == evens
    else:
        assert group == tdist.GroupMember.NON_GROUP_MEMBER
    tdist.destroy_process_group(group)


def test_functional_collectives_find_the_group_by_name():
    import torch.distributed._functional_collectives as funcol

    t = contribution(_rank())
    reduced = funcol.all_reduce(t, "sum", tdist.group.WORLD)
    torch.testing.assert_close(reduced, sum(contribution(r) for r in range(_size())))
    gathered = funcol.all_gather_tensor(t, 0, tdist.group.WORLD)
    torch.testing.assert_close(gathered, torch.cat([contribution(r) for r in range(_size())]))


def test_bad_input_raises_on_every_rank_before_communicating():
    with pytest.raises(ValueError, match="C-contiguous"):
        tdist.all_reduce(torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="one array per rank"):
        tdist.all_gather([torch.zeros(1)] * (_size() + 1), torch.zeros(1))
    with pytest.raises(ValueError, match="output has"):
        tdist.all_gather_into_tensor(torch.zeros(_size() + 1), torch.zeros(1))
    with pytest.raises(ValueError, match="bitwise"):
        tdist.all_reduce(torch.zeros(2), op=ReduceOp.BAND)
    tdist.barrier()  # everyone is still in step


def test_cuda_is_claimed_only_with_the_gpu_extras():
    import importlib.util

    from hpc_c10d.torch.devices import devices

    has_cupy = importlib.util.find_spec("cupy") is not None
    assert devices() == (["cpu", "cuda"] if has_cupy else ["cpu"])
    assert tdist.Backend.backend_capability["hpc"] == devices()


def test_a_blocking_operation_past_its_timeout_raises_on_the_rank_that_waits():
    """As with torch's gloo: rank 0 alone enters a barrier of a group whose timeout is 1 s and
    gets torch's DistBackendError ("Timed out") instead of waiting for ever; an async operation's
    wait() keeps to the group's timeout too. The other ranks go on."""
    if _size() < 2:
        pytest.skip("needs a second rank that stays away")
    group = tdist.new_group(timeout=datetime.timedelta(seconds=1))
    if _rank() == 0:
        with pytest.raises(tdist.DistBackendError, match=r"^barrier seq 1 of group \S+: Timed out "):
            tdist.barrier(group)
        work = tdist.all_reduce(torch.ones(1), group=group, async_op=True)
        with pytest.raises(tdist.DistBackendError, match=" Timed out "):
            work.wait()
    tdist.barrier()
    tdist.destroy_process_group(group)


def test_torch_finds_the_backend_for_each_device_it_serves():
    """torch's Python side asks the group for its backend per device (timeouts, eager init,
    object collectives' device); its C++ side asks for the backend's name (DDP's logger)."""
    from hpc_c10d.torch.devices import devices

    world = tdist.group.WORLD
    assert [d.type for d in world._device_types] == devices()
    assert world._get_backend(torch.device("cpu")).name() == "hpc"
    with pytest.raises(RuntimeError, match="No backend type associated with device type xpu"):
        world._get_backend(torch.device("xpu"))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    model(torch.ones(4, 3)).sum().backward()
    # from 2.14 torch's own group holds the backend, and C++ names a Python one "custom"
    assert model._get_ddp_logging_data()["backend_name"] == ("custom" if PER_DEVICE_BACKEND else "hpc")


def _sparse_contribution(rank, dtype, empty_on_rank0=False):
    """Rank r's COO tensor of shape (2, size + 1, 3) (one dense dimension): entries r and r + 1 of
    row r % 2, each a row of three (r + 1)s; ranks overlap, so the sum must coalesce."""
    if empty_on_rank0 and rank == 0:
        return torch.sparse_coo_tensor(torch.zeros((2, 0), dtype=torch.int64), torch.zeros((0, 3), dtype=dtype),
                                       (2, _size() + 1, 3))
    indices = torch.tensor([[rank % 2, rank % 2], [rank, rank + 1]])
    return torch.sparse_coo_tensor(indices, torch.full((2, 3), rank + 1, dtype=dtype), (2, _size() + 1, 3))


@pytest.mark.parametrize("empty_on_rank0", [False, True], ids=["every-rank", "rank0-empty"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16], ids=str)
def test_sparse_all_reduce_sums_every_ranks_nonzeros(dtype, empty_on_rank0):
    """As torch's gloo: the sum of COO tensors, coalesced, its nonzeros the union of the ranks'."""
    t = _sparse_contribution(_rank(), dtype, empty_on_rank0)
    tdist.all_reduce(t)
    assert t.is_sparse and t.is_coalesced()
    expected = sum(_sparse_contribution(r, dtype, empty_on_rank0).to_dense() for r in range(_size()))
    torch.testing.assert_close(t.to_dense(), expected)


def test_sparse_all_reduce_refuses_what_it_cannot_sum_on_every_rank():
    with pytest.raises(RuntimeError, match="SUM only"):
        tdist.all_reduce(_sparse_contribution(_rank(), torch.float32), op=ReduceOp.MAX)
    shape = (2, _size() + 1 + (_rank() == 0), 3)  # rank 0's is bigger
    odd = torch.sparse_coo_tensor(torch.zeros((3, 0), dtype=torch.int64), torch.zeros(0), shape)
    if _size() > 1:
        with pytest.raises(ValueError, match="same shape"):
            tdist.all_reduce(odd)
    tdist.barrier()  # everyone is still in step


def test_sparse_all_reduce_of_a_vector():
    """One sparse dimension, as in torch's own test: the (nonzeros, 1) index block is strided (a
    byte view of it failed on the ranks holding 2+ nonzeros, after rank 0 had started sending)."""
    mine = torch.sparse_coo_tensor(torch.arange(_rank() + 1).reshape(1, -1), torch.ones(_rank() + 1), (_size(),))
    tdist.all_reduce(mine)
    torch.testing.assert_close(mine.to_dense(), torch.tensor([float(_size() - i) for i in range(_size())]))


@pytest.mark.skipif(not hasattr(tdist, "gather_single"),
                    reason=f"torch {torch.__version__} has no gather_single (2.14 adds it)")
def test_gather_single_is_refused_by_torch_before_anything_is_sent():
    """torch 2.14's Backend trampoline does not forward gather_single to a Python backend, so torch
    refuses it on every rank (docs/torch_backend.md); gather serves instead."""
    rank, size = _rank(), _size()
    out = torch.empty(size * 3) if rank == 0 else None
    with pytest.raises(RuntimeError, match="Backend hpc does not support gather_single"):
        tdist.gather_single(torch.full((3,), float(rank)), out, dst=0)
    tdist.barrier()


@pytest.mark.skipif(not hasattr(tdist, "set_timeout"),
                    reason=f"torch {torch.__version__} has no set_timeout (2.14 adds it)")
def test_set_timeout_reaches_the_backend():
    group = tdist.new_group(list(range(_size())))
    tdist.set_timeout(datetime.timedelta(seconds=42), group)
    assert hpc_backend(group)._inner._timeout == datetime.timedelta(seconds=42)
    tdist.destroy_process_group(group)
