"""Backend "hpc" under torch's debug aids: DETAIL fingerprints, sequence numbers, the flight
recorder, CommDebugMode, and device maps that mix backends.

The plugin's collectives run hpc_c10d's DETAIL checks (the same per-op path as the numpy API):
torch wraps no Python process group in its checker, and the plugin keeps its own gloo-based one
off a per-device "hpc" Backend (torch >= 2.14). The last rank deviates in one field; every
rank must raise torch's DistBackendError naming that field before any data moves, and the group
must still compute right afterwards.
"""
import pytest

from support.torch_world import tdist, torch, torch_world

from hpc_c10d.diagnostics import debug, flight_recorder
from hpc_c10d.torch.process_group import PER_DEVICE_BACKEND, ProcessGroupHPC, hpc_backend

pytestmark = pytest.mark.mpi


def _rank():
    return tdist.get_rank()


def _size():
    return tdist.get_world_size()


@pytest.fixture(params=["TORCH_DISTRIBUTED_DEBUG", "HPC_C10D_DEBUG"])
def checked(request):
    """A torch group over every rank, made while DETAIL is set through torch's knob or hpc_c10d's."""
    torch_world()
    if request.param == "TORCH_DISTRIBUTED_DEBUG":
        before = tdist.get_debug_level()
        tdist.set_debug_level(tdist.DebugLevel.DETAIL)
        restore = lambda: tdist.set_debug_level(before)  # noqa: E731
    else:
        before = debug.get_debug_level()
        debug.set_debug_level(debug.DebugLevel.DETAIL)
        restore = lambda: debug.set_debug_level(before)  # noqa: E731
    try:
        group = tdist.new_group(list(range(_size())))
    finally:
        restore()
    yield group
    tdist.destroy_process_group(group)


def _ones(n, dtype=torch.float32):
    return torch.ones(n, dtype=dtype)


def _all_gather(n):
    return lambda g: tdist.all_gather_into_tensor(_ones(n * _size()), _ones(n), group=g)


def _reduce_scatter(n):
    return lambda g: tdist.reduce_scatter_tensor(_ones(n), _ones(n * _size()), group=g)


# name -> (what the others run, what the last rank runs, the field that differs and how it reads on each side)
DEVIATIONS = {
    "all_reduce SUM sizes": (lambda g: tdist.all_reduce(_ones(4), group=g),
                             lambda g: tdist.all_reduce(_ones(5), group=g), ("shape", "(4,)", "(5,)")),
    "all_reduce AVG sizes": (lambda g: tdist.all_reduce(_ones(4), tdist.ReduceOp.AVG, group=g),
                             lambda g: tdist.all_reduce(_ones(5), tdist.ReduceOp.AVG, group=g),
                             ("shape", "(4,)", "(5,)")),
    "all_gather_into_tensor sizes": (_all_gather(4), _all_gather(5), ("shape", "(4,)", "(5,)")),
    "broadcast sizes": (lambda g: tdist.broadcast(_ones(4), 0, group=g),
                        lambda g: tdist.broadcast(_ones(5), 0, group=g), ("shape", "(4,)", "(5,)")),
    "reduce_scatter_tensor sizes": (_reduce_scatter(2), _reduce_scatter(3), ("shape", "(2,)", "(3,)")),
    "dtype": (lambda g: tdist.all_reduce(_ones(4), group=g),
              lambda g: tdist.all_reduce(_ones(4, torch.float64), group=g), ("dtype", "float32", "float64")),
    "op": (lambda g: tdist.all_reduce(_ones(4), group=g),
           lambda g: tdist.broadcast(_ones(4), 0, group=g), ("op", "all_reduce", "broadcast")),
    "barrier": (lambda g: tdist.barrier(group=g),
                lambda g: tdist.all_reduce(_ones(4), group=g), ("op", "barrier", "all_reduce")),
    "root": (lambda g: tdist.broadcast(_ones(4), 0, group=g),
             lambda g: tdist.broadcast(_ones(4), 1, group=g), ("root", "0", "1")),
    "reduce op": (lambda g: tdist.all_reduce(_ones(4), group=g),
                  lambda g: tdist.all_reduce(_ones(4), tdist.ReduceOp.MAX, group=g),
                  ("reduce_op", "RedOpType.SUM", "RedOpType.MAX")),
    "all_to_all_single dtype": (lambda g: tdist.all_to_all_single(_ones(_size()), _ones(_size()), group=g),
                                lambda g: tdist.all_to_all_single(_ones(_size(), torch.int32),
                                                                  _ones(_size(), torch.int32), group=g),
                                ("dtype", "float32", "int32")),
    "async all_reduce sizes": (lambda g: tdist.all_reduce(_ones(4), group=g, async_op=True).wait(),
                               lambda g: tdist.all_reduce(_ones(5), group=g, async_op=True).wait(),
                               ("shape", "(4,)", "(5,)")),
}


@pytest.mark.parametrize("case", sorted(DEVIATIONS))
def test_a_mismatch_raises_torchs_error_on_every_rank_before_data_moves(checked, case):
    size, rank = _size(), _rank()
    if size < 2:
        pytest.skip("a mismatch needs two ranks")
    common, deviant, (field, first, last) = DEVIATIONS[case]
    with pytest.raises(tdist.DistBackendError) as caught:
        (deviant if rank == size - 1 else common)(checked)
    message = str(caught.value)
    others = "rank 0" if size == 2 else f"ranks 0-{size - 2}"
    assert "Detected mismatch between collectives" in message, message
    assert f"{field} differs: {others}: {first}; rank {size - 1}: {last}" in message, message

    x = torch.full((3,), float(rank + 1))  # the group still works, with nothing mixed in
    tdist.all_reduce(x, group=checked)
    torch.testing.assert_close(x, torch.full((3,), size * (size + 1) / 2))


def test_coalesced_operations_are_checked_one_by_one(checked):
    size, rank = _size(), _rank()
    if size < 2:
        pytest.skip("a mismatch needs two ranks")
    n = 5 if rank == size - 1 else 4
    with pytest.raises(tdist.DistBackendError, match="shape differs"):
        with tdist._coalescing_manager(group=checked):
            tdist.all_reduce(_ones(3), group=checked)
            tdist.all_reduce(_ones(n), group=checked)
    x = torch.full((3,), float(rank))
    tdist.all_reduce(x, group=checked)
    torch.testing.assert_close(x, torch.full((3,), float(sum(range(size)))))


def test_matching_collectives_on_a_checked_group_are_exact(checked):
    size, rank = _size(), _rank()
    x = torch.arange(4.0) + rank
    tdist.all_reduce(x, group=checked)
    torch.testing.assert_close(x, sum(torch.arange(4.0) + r for r in range(size)))
    out = torch.empty(2 * size)
    tdist.all_gather_into_tensor(out, torch.full((2,), float(rank)), group=checked)
    torch.testing.assert_close(out, torch.arange(size, dtype=torch.float32).repeat_interleave(2))
    x = torch.full((3,), float(rank))
    tdist.broadcast(x, size - 1, group=checked)
    torch.testing.assert_close(x, torch.full((3,), float(size - 1)))
    # all-to-all blocks may differ by rank: rank r sends r + 1 elements to everyone
    out = torch.empty(sum(r + 1 for r in range(size)))
    tdist.all_to_all_single(out, torch.full(((rank + 1) * size,), float(rank)), [r + 1 for r in range(size)],
                            [rank + 1] * size, group=checked)
    torch.testing.assert_close(out, torch.cat([torch.full((r + 1,), float(r)) for r in range(size)]))
    tdist.barrier(group=checked)


def test_every_plugin_operation_is_numbered_and_recorded(monkeypatch):
    """Each collective of a plugin group, blocking or not, takes the group's next sequence number
    and leaves an entry in the flight recorder's ring with its op, shape and dtype."""
    torch_world()
    monkeypatch.setenv(flight_recorder.BUFFER_ENV, "16")  # the ring on, for groups made now
    group = tdist.new_group(list(range(_size())))
    inner = hpc_backend(group)._inner
    x = torch.ones(3)
    tdist.all_reduce(x, group=group)
    tdist.broadcast(x, 0, group=group, async_op=True).wait()
    tdist.barrier(group=group)
    assert inner._seq == 3
    entries = [e for e in flight_recorder.snapshot("test")["entries"] if e["group"] == inner._name]
    assert [(e["op"], e["seq"], e["shape"], e["dtype"]) for e in entries[-3:]] == [
        ("allreduce", 1, [3], "float32"), ("broadcast", 2, [3], "float32"), ("barrier", 3, None, None)]
    assert [e["state"] for e in entries[-3:]] == ["completed", "scheduled", "completed"]
    tdist.destroy_process_group(group)


def test_hang_reports_name_the_group_as_torch_describes_it():
    """The plugin's flight recorder and watchdog describe a group as torch does (from torch 2.14
    torch's own ProcessGroup holds the description, given after the backend was made)."""
    torch_world()
    group = tdist.new_group(list(range(_size())), group_desc="halo exchange")
    assert hpc_backend(group)._inner.group_desc == "halo exchange"
    assert hpc_backend()._inner.group_desc == "default_pg"
    tdist.destroy_process_group(group)


_NO_PYTHON_BACKEND = (f"torch {torch.__version__} lets no Python class be a per-device Backend, so torch calls "
                      "the plugin's ProcessGroup directly, past its c10d dispatcher ops (docs/torch_backend.md)")


def _counted(group, mesh):
    """What CommDebugMode counts while a few collectives and a DTensor distribution run on ``group``."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    size = tdist.get_world_size(group)
    mode = CommDebugMode()
    with mode:
        t = torch.ones(4)
        tdist.all_reduce(t, group=group)
        tdist.broadcast(t, 0, group=group)
        tdist.all_gather_into_tensor(torch.empty(4 * size), t, group=group)
        tdist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * size), group=group)
        tdist.all_reduce(t, group=group, async_op=True).wait()
        tdist.barrier(group=group)
        distribute_tensor(torch.arange(2.0 * size), mesh, [Shard(0)])  # DTensorAPITest.test_distribute_tensor_rank
    assert torch.equal(t, torch.full((4,), float(size * size)))
    return {str(op): count for op, count in mode.get_comm_counts().items()}


@pytest.mark.skipif(not PER_DEVICE_BACKEND, reason=_NO_PYTHON_BACKEND)
def test_comm_debug_mode_counts_the_same_operations_as_on_gloo():
    from torch.distributed.device_mesh import DeviceMesh

    world = torch_world()
    gloo = tdist.new_group(backend="gloo")
    counts = _counted(world, DeviceMesh.from_group(world, "cpu"))
    assert counts == _counted(gloo, DeviceMesh.from_group(gloo, "cpu"))
    assert counts["c10d.allreduce_"] == 2 and counts["c10d.scatter_"] == 1
    tdist.destroy_process_group(gloo)


@pytest.mark.skipif(not PER_DEVICE_BACKEND, reason=_NO_PYTHON_BACKEND)
def test_a_device_map_gives_hpc_one_device_and_another_backend_the_other():
    torch_world()
    group = tdist.new_group(backend="cpu:hpc,cuda:gloo")
    assert isinstance(group._get_backend(torch.device("cpu")), ProcessGroupHPC)
    assert type(group._get_backend(torch.device("cuda"))).__name__ == "ProcessGroupGloo"
    t = torch.full((3,), float(_rank()))
    tdist.all_reduce(t, group=group)
    assert torch.equal(t, torch.full((3,), float(sum(range(_size())))))
    tdist.destroy_process_group(group)
