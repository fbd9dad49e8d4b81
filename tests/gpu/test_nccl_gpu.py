"""GPU collectives through the NCCL backend, checked against numpy references.

They need a CUDA GPU per rank, CuPy and NCCL, and skip with the reason otherwise. Run them
at world size 1 on a single-GPU machine (``mpiexec -n 1 python -m pytest --with-mpi -m mpi
tests/gpu/test_nccl_gpu.py``), at larger sizes on a node with that many GPUs; with more ranks than
GPUs, the one test that runs checks the refusal to put two ranks on one GPU. Scenarios that
need a process of their own (tests/programs/nccl_scenarios.py) run as one-rank jobs from rank 0.
"""

import os
import time

import numpy as np
import pytest

import hpc_c10d as dist
from support.gpu_plan import OWN, SHARED, gpu_plan as decide_gpu_plan
from support.launch import ROOT, launch
from hpc_c10d.errors import DistBackendError
from hpc_c10d.nccl import library
from hpc_c10d.nccl.buffers import as_device_buffer

pytestmark = pytest.mark.mpi

cupy = pytest.importorskip("cupy", reason="the GPU tests need cupy (pip install cupy-cuda13x nvidia-nccl-cu13)")
REDUCIBLE = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]
OPS = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}


@pytest.fixture(scope="module")
def gpu_plan(world):
    """Whether every rank has a GPU of its own (support/gpu_plan.py): the same answer everywhere."""
    return decide_gpu_plan()


@pytest.fixture(scope="module")
def gpu(gpu_plan):
    """This rank's GPU, made current; every rank skips alike unless each has its own (see the refusal test)."""
    if gpu_plan != OWN:
        pytest.skip(gpu_plan if gpu_plan != SHARED else "some ranks share a GPU: one GPU per rank is needed")
    return dist.nccl.bind_local_device()


def _contribution(rank, count, dtype):
    return ((np.arange(count) % 3) + rank + 1).astype(dtype)


def _everyone(count, dtype):
    return [_contribution(r, count, dtype) for r in range(dist.get_world_size())]


def _close(got, expected):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64),
                               rtol=1e-2 if np.dtype(expected.dtype).itemsize == 2 else 1e-6)


@pytest.mark.parametrize("name", REDUCIBLE)
@pytest.mark.parametrize("op", list(OPS))
def test_all_reduce_every_dtype_and_op(gpu, name, op):
    rank, count = dist.get_rank(), 1000
    x = cupy.asarray(_contribution(rank, count, name))
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
    expected = _everyone(count, name)[0].copy()
    for other in _everyone(count, name)[1:]:
        expected = OPS[op](expected, other).astype(name)
    _close(cupy.asnumpy(x), expected)


@pytest.mark.parametrize("name", ["float32", "float64", "int32"])
def test_all_reduce_avg_and_premul_sum(gpu, name):
    size, rank = dist.get_world_size(), dist.get_rank()
    x = cupy.asarray(_contribution(rank, 64, name))
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    total = np.sum(_everyone(64, name), axis=0)
    _close(cupy.asnumpy(x), (total / size).astype(name) if name != "int32" else total // size)
    if name != "int32":
        y = cupy.asarray(_contribution(rank, 64, name))
        dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5))
        _close(cupy.asnumpy(y), total * 0.5)


def test_bool_and_complex_reductions(gpu):
    flags = cupy.asarray(np.array([dist.get_rank() == 0, False, True]))
    dist.all_reduce(flags)  # "any"
    assert cupy.asnumpy(flags).tolist() == [True, False, True]
    z = cupy.asarray(np.array([1 + 2j, 3 - 1j], dtype=np.complex64) * (dist.get_rank() + 1))
    dist.all_reduce(z)
    factor = sum(range(1, dist.get_world_size() + 1))
    np.testing.assert_allclose(cupy.asnumpy(z), np.array([1 + 2j, 3 - 1j]) * factor)


def test_broadcast_and_reduce_with_global_roots(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    root = size - 1
    x = cupy.asarray(_contribution(rank, 33, np.int16))  # int16 moves as bytes
    dist.broadcast(x, src=root)
    assert (cupy.asnumpy(x) == _contribution(root, 33, np.int16)).all()
    y = cupy.asarray(_contribution(rank, 33, np.float32))
    dist.reduce(y, dst=root)
    expected = np.sum(_everyone(33, np.float32), axis=0) if rank == root else _contribution(rank, 33, np.float32)
    _close(cupy.asnumpy(y), expected)


def test_all_gather_forms(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    x = cupy.asarray(_contribution(rank, 10, np.float32))
    flat = cupy.empty(10 * size, dtype=cupy.float32)
    dist.all_gather_into_tensor(flat, x)
    assert (cupy.asnumpy(flat) == np.concatenate(_everyone(10, np.float32))).all()
    separate = [cupy.full(10, -1, dtype=cupy.float32) for _ in range(size)]
    dist.all_gather(separate, x)
    chunks = list(cupy.zeros(10 * size, dtype=cupy.float32).reshape(size, 10))  # back to back: one NCCL call
    dist.all_gather(chunks, x)
    for got in (separate, chunks):
        assert all((cupy.asnumpy(g) == e).all() for g, e in zip(got, _everyone(10, np.float32)))
    in_place = cupy.zeros(10 * size, dtype=cupy.float32)  # FSDP's form: the input is this rank's block
    in_place[rank * 10:(rank + 1) * 10] = x
    dist.all_gather_into_tensor(in_place, in_place[rank * 10:(rank + 1) * 10])
    assert (cupy.asnumpy(in_place) == np.concatenate(_everyone(10, np.float32))).all()


def test_reduce_scatter_forms(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    data = cupy.asarray(_contribution(rank, 8 * size, np.float64))
    out = cupy.empty(8, dtype=cupy.float64)
    dist.reduce_scatter_tensor(out, data)
    total = np.sum(_everyone(8 * size, np.float64), axis=0)
    _close(cupy.asnumpy(out), total[rank * 8:(rank + 1) * 8])
    separate = [cupy.asarray(_contribution(rank, 8, np.float64)) * (r + 1) for r in range(size)]
    out2 = cupy.empty(8, dtype=cupy.float64)
    dist.reduce_scatter(out2, separate, op=dist.ReduceOp.MAX)
    _close(cupy.asnumpy(out2), _contribution(size - 1, 8, np.float64) * (rank + 1))


def test_all_to_all_forms(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    inp = cupy.arange(size * 4, dtype=cupy.int64) + 100 * rank
    out = cupy.empty_like(inp)
    dist.all_to_all_single(out, inp)
    expected = np.concatenate([np.arange(rank * 4, rank * 4 + 4) + 100 * r for r in range(size)])
    assert (cupy.asnumpy(out) == expected).all()
    # uneven: rank r sends r+1 rows to each peer
    send_rows = [rank + 1] * size
    recv_rows = [r + 1 for r in range(size)]
    inp2 = cupy.full((sum(send_rows), 2), rank, dtype=cupy.float32)
    out2 = cupy.empty((sum(recv_rows), 2), dtype=cupy.float32)
    dist.all_to_all_single(out2, inp2, recv_rows, send_rows)
    assert (cupy.asnumpy(out2)[:, 0] == np.repeat(np.arange(size), recv_rows)).all()
    outs = [cupy.empty(3, dtype=cupy.int32) for _ in range(size)]
    dist.all_to_all(outs, [cupy.full(3, rank * 10 + r, dtype=cupy.int32) for r in range(size)])
    assert [int(o[0]) for o in outs] == [r * 10 + rank for r in range(size)]


def test_gather_and_scatter(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    x = cupy.asarray(_contribution(rank, 5, np.uint8))
    gathered = [cupy.zeros(5, dtype=cupy.uint8) for _ in range(size)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    if rank == 0:
        assert all((cupy.asnumpy(g) == e).all() for g, e in zip(gathered, _everyone(5, np.uint8)))
    out = cupy.zeros(5, dtype=cupy.uint8)
    parts = [cupy.asarray(_contribution(r, 5, np.uint8)) for r in range(size)] if rank == 0 else None
    dist.scatter(out, parts, src=0)
    assert (cupy.asnumpy(out) == _contribution(rank, 5, np.uint8)).all()


def test_point_to_point_ring_and_batch(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    if size < 2:
        pytest.skip("point-to-point needs two ranks")
    right, left = (rank + 1) % size, (rank - 1) % size
    got = cupy.zeros(4, dtype=cupy.float32)
    if rank % 2 == 0:
        dist.send(cupy.full(4, rank, dtype=cupy.float32), dst=right)
        dist.recv(got, src=left)
    else:
        dist.recv(got, src=left)
        dist.send(cupy.full(4, rank, dtype=cupy.float32), dst=right)
    assert (cupy.asnumpy(got) == left).all()
    got2 = cupy.zeros(4, dtype=cupy.float32)
    ops = [dist.P2POp(dist.isend, cupy.full(4, rank + 10, dtype=cupy.float32), right),
           dist.P2POp(dist.irecv, got2, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert (cupy.asnumpy(got2) == left + 10).all()


def test_the_op_waits_for_work_queued_on_the_callers_stream(gpu):
    size = dist.get_world_size()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.zeros(1 << 22, dtype=cupy.float32)
        for _ in range(50):  # long enough that an unordered collective would see zeros
            x += 1
        dist.all_reduce(x)
        x *= 2  # queued after the collective on the same stream: sees its result
        stream.synchronize()
    assert float(x.min()) == float(x.max()) == 100.0 * size


def test_a_result_waited_for_on_another_stream_is_correct(gpu):
    size = dist.get_world_size()
    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with producer:
        x = cupy.zeros(1 << 22, dtype=cupy.float32)
        for _ in range(50):
            x += 1
        work = dist.all_reduce(x, async_op=True)  # ordered after the producer's additions
    with consumer:
        work.wait()  # the consumer, now current, waits for the collective; the host does not
        y = x * 2
    consumer.synchronize()
    assert float(y.min()) == float(y.max()) == 100.0 * size


def test_async_work_waits_on_the_stream_and_completes(gpu):
    size = dist.get_world_size()
    x = cupy.ones(1 << 20, dtype=cupy.float32)
    work = dist.all_reduce(x, async_op=True)
    assert work.wait() is True  # the current stream now waits; the host does not
    x += 1
    cupy.cuda.get_current_stream().synchronize()
    assert float(x[0]) == size + 1
    assert work.is_completed() and work.is_success()
    y = cupy.ones(8, dtype=cupy.float32)
    future = dist.all_reduce(y, async_op=True).get_future()
    assert future.wait()[0] is y
    assert float(y[0]) == size
    assert dist.all_reduce(cupy.ones(4), async_op=True).wait(timeout=60)
    z = cupy.ones(8, dtype=cupy.float32)
    doubled = dist.all_reduce(z, async_op=True).get_future().then(lambda fut: fut.value()[0] * 2).wait()
    assert float(doubled[0]) == 2 * size  # a chained future of GPU work waits for it too


def test_torch_cuda_tensors_including_bfloat16(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch is a CPU build here")
    size, rank = dist.get_world_size(), dist.get_rank()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.full((100,), rank + 1, dtype=dtype, device=f"cuda:{gpu}")
        dist.all_reduce(t)
        assert t.float().eq(size * (size + 1) / 2).all().item()
    t = torch.arange(6, dtype=torch.bfloat16, device=f"cuda:{gpu}")
    dist.broadcast(t, src=0)
    assert t.float().tolist() == list(range(6))


def test_mixed_cpu_and_gpu_arrays_go_to_their_backends(gpu):
    size = dist.get_world_size()
    host, device = np.ones(4, dtype=np.float32), cupy.ones(4, dtype=cupy.float32)
    dist.all_reduce(host)
    dist.all_reduce(device)
    assert host[0] == size and float(device[0]) == size
    objects = [{"rank": dist.get_rank()}]
    dist.broadcast_object_list(objects, src=0)  # object collectives stay on MPI
    assert objects == [{"rank": 0}]
    with pytest.raises(ValueError, match="one device type"):
        dist.all_gather([np.zeros(4, np.float32)] * size, device)


def test_bad_input_raises_before_any_communication(gpu):
    with pytest.raises(ValueError, match="Cannot use ReduceOp.BAND with NCCL"):
        dist.all_reduce(cupy.ones(4, dtype=cupy.int32), op=dist.ReduceOp.BAND)
    with pytest.raises(TypeError, match="not supported for NCCL"):
        dist.all_reduce(cupy.ones(4, dtype=cupy.int16))
    with pytest.raises(ValueError, match="C-contiguous"):
        dist.all_reduce(cupy.ones((4, 4), dtype=cupy.float32).T)
    with pytest.raises(ValueError, match="any source"):
        dist.recv(cupy.ones(4))
    dist.barrier()  # every rank is still in step


def test_subgroups_get_split_or_fresh_communicators(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])
    x = cupy.full(3, rank, dtype=cupy.int64)
    if rank % 2 == 0:
        dist.all_reduce(x, group=evens)
        assert int(x[0]) == sum(range(0, size, 2))
    dist.destroy_process_group(evens)


def test_groups_made_while_a_device_is_bound_split_the_parents_communicator(gpu):
    world = dist.group.WORLD
    dist.all_reduce(cupy.ones(1))  # the world's communicator on this GPU exists
    world._bind_device(gpu)  # as init_process_group(device_id=...) does
    try:
        group = dist.new_group(list(range(dist.get_world_size()))[::-1][:max(1, dist.get_world_size() - 1)])
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            transport = group._transports["cuda"]  # created by the split, before any GPU operation
            x = cupy.full(5, dist.get_rank() + 1, dtype=cupy.float32)
            dist.all_reduce(x, group=group)
            members = dist.get_process_group_ranks(group)
            assert float(x[0]) == sum(r + 1 for r in members)
            assert len(transport._comms) == 1
        dist.destroy_process_group(group)
    finally:
        world.bound_device_id = None


def test_an_aborted_communicator_refuses_further_work(gpu):
    group = dist.new_group(list(range(dist.get_world_size())))
    dist.all_reduce(cupy.ones(4), group=group)
    group._transport_for_device("cuda").abort()
    with pytest.raises(DistBackendError, match="aborted"):
        dist.all_reduce(cupy.ones(4), group=group)
    dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=2)
def test_two_ranks_on_one_gpu_are_refused(gpu_plan):
    if gpu_plan != SHARED:
        pytest.skip("every rank has a GPU of its own here" if gpu_plan == OWN else gpu_plan)
    group = dist.new_group(list(range(dist.get_world_size())))
    with pytest.raises(DistBackendError, match="must not use the same GPU"):
        dist.all_reduce(cupy.ones(4, dtype=cupy.float32), group=group)
    dist.destroy_process_group(group)


def test_a_group_made_after_the_parents_communicator_was_aborted_gets_a_fresh_one(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    world = dist.group.WORLD
    dist.all_reduce(cupy.ones(1))
    world._bind_device(gpu)  # new groups would be split from the world's communicator...
    try:
        world._transport_for_device("cuda").abort()  # ...but it was aborted (watchdog, timed-out wait)
        group = dist.new_group(list(range(size)))
        (comm,) = group._transports["cuda"]._comms.values()
        assert comm.state == "live"
        x = cupy.full(3, rank + 1, dtype=cupy.float32)
        dist.all_reduce(x, group=group)
        assert float(x[0]) == size * (size + 1) / 2
        dist.destroy_process_group(group)
    finally:
        world.bound_device_id = None
        world._transports.pop("cuda").close()  # the world's next GPU operation makes a new communicator


def test_a_failure_inside_a_group_keeps_the_launched_part_tracked_and_raises_the_first_error(gpu):
    group = dist.new_group(list(range(dist.get_world_size())))
    backend = group._transport_for_device("cuda")
    comm = backend._connect(gpu)
    x = cupy.ones(8, dtype=cupy.float32)
    buf = as_device_buffer(x)
    nccl = backend._nccl
    good = backend._moving(lambda h, s: nccl.ncclBroadcast(buf.ptr, buf.ptr, buf.nbytes, 1, 0, h, s))
    bad = backend._moving(lambda h, s: nccl.ncclBroadcast(buf.ptr, buf.ptr, buf.nbytes, 99, 0, h, s))  # no type 99
    with pytest.raises(DistBackendError, match="ncclTestGroup") as caught:
        backend._launch("test", comm, buf, backend._group([good, bad], "ncclTestGroup"), False, [x], buf)
    assert "ncclGroupEnd" not in str(caught.value).split(";")[0]  # the first failure, not the group's end
    work = backend._pending[-1]
    assert work._exception is caught.value and work._keep is buf  # the buffers stay referenced
    dist.barrier(group=group)  # waits for whatever was launched; the ranks are in step
    dist.destroy_process_group(group)


def test_works_of_a_destroyed_group_count_as_done(gpu):
    size = dist.get_world_size()
    group = dist.new_group(list(range(size)))
    x = cupy.ones(1 << 20, dtype=cupy.float32)
    works = [dist.all_reduce(x, group=group, async_op=True) for _ in range(4)]
    dist.destroy_process_group(group)  # waits for them, then destroys the communicator
    assert all(w.is_completed() and w.is_success() for w in works)
    assert works[-1].wait() is True
    assert float(x[0]) == size ** 4


def test_barrier_waits_for_this_ranks_queued_gpu_work(gpu):
    size = dist.get_world_size()
    group = dist.new_group(list(range(size)))
    x = cupy.zeros(1 << 22, dtype=cupy.float32)
    for _ in range(50):
        x += 1  # queued on the current stream; the all-reduce waits for it
    work = dist.all_reduce(x, group=group, async_op=True)
    dist.barrier(group=group)
    assert all(w._passed() for w in group._transports["cuda"]._pending)
    assert work.is_completed()  # no host synchronisation since the barrier
    assert float(x[0]) == 50.0 * size
    dist.destroy_process_group(group)


def test_all_to_all_single_refuses_a_mismatched_own_block_on_that_rank_only(gpu):
    size, rank = dist.get_world_size(), dist.get_rank()
    in_splits, out_splits = [1] * size, [1] * size
    if rank == 0:
        out_splits[0] = 2  # only rank 0 can see that its own blocks disagree
    inp = cupy.arange(size, dtype=cupy.float32) + 10 * rank
    out = cupy.full(sum(out_splits), -1, dtype=cupy.float32)
    if rank == 0:
        with pytest.raises(ValueError, match="the block this rank sends itself"):
            dist.all_to_all_single(out, inp, out_splits, in_splits)
    else:
        dist.all_to_all_single(out, inp, out_splits, in_splits)
    got = cupy.asnumpy(out)
    offsets = np.concatenate([[0], np.cumsum(out_splits)[:-1]])
    for peer in range(size):
        if peer == rank == 0:
            assert (got[:2] == -1).all()  # left as it was
        else:
            assert got[offsets[peer]] == rank + 10 * peer  # the peers' blocks arrived all the same
    dist.barrier()  # every rank is still in step


def test_float8_tensors_move_and_reduce(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch is a CPU build here")
    size, rank = dist.get_world_size(), dist.get_rank()
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = torch.full((16,), rank + 1, device=f"cuda:{gpu}").to(dtype)
        dist.broadcast(t, src=size - 1)
        assert t.float().eq(size).all().item()
        out = torch.empty(16 * size, device=f"cuda:{gpu}").to(dtype)
        dist.all_gather_into_tensor(out, torch.full((16,), rank, device=f"cuda:{gpu}").to(dtype))
        assert out.float().view(size, 16)[:, 0].tolist() == list(range(size))
        if library.load().version >= (2, 24, 0):
            r = torch.ones(16, device=f"cuda:{gpu}").to(dtype)
            dist.all_reduce(r)
            assert r.float().eq(size).all().item()


def _scenario(name, timeout_s=120, **env):
    """Run one scenario of tests/programs/nccl_scenarios.py as a one-rank job (from rank 0 only)."""
    if dist.get_rank() != 0:
        pytest.skip("rank 0 runs the scenario as a job of its own")
    proc, cmd = launch(1, [os.path.join(ROOT, "tests", "programs", "nccl_scenarios.py"), name], timeout_s, env=env)
    assert f"{name} ok" in proc.stdout, f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_nonblocking_nccl_from_the_environment_is_waited_out(gpu):
    proc = _scenario("nonblocking_environment", NCCL_COMM_BLOCKING="0")
    assert proc.returncode == 0, proc.stderr


def test_a_sticky_cuda_error_fails_the_work_instead_of_leaving_it_running(gpu):
    _scenario("sticky_cuda_error")


def test_an_abort_from_another_thread_never_races_an_enqueue(gpu):
    proc = _scenario("abort_from_another_thread")
    assert proc.returncode == 0, proc.stderr


def test_nccl_is_closed_at_exit_with_a_warning_when_the_program_never_destroyed_its_groups(gpu):
    start = time.monotonic()
    proc = _scenario("exit_without_destroy")
    assert proc.returncode == 0, proc.stderr
    assert "destroy_process_group() was not called" in proc.stderr
    assert time.monotonic() - start < 60
