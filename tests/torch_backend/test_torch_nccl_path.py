"""How backend "hpc" hands CUDA tensors to torch's ProcessGroupNCCL, checked on CPUs.

The routing is checked with a *recording stand-in* for torch's ProcessGroupNCCL (it records each
call and hands back a finished handle; it moves no data) and CPU tensors that say they are CUDA
ones: which method of torch's backend each of ours calls, with which arguments, the group's
counts, the watchdog's view, barrier, coalesced and batched calls, and the bfloat16 PREMUL_SUM
rewrite. The real ProcessGroupNCCL runs in tests/gpu/test_torch_cuda.py on the GPU machine.
"""
from datetime import timedelta

import pytest

from support.torch_world import tdist, torch, torch_world

from hpc_c10d.diagnostics import watchdog
from hpc_c10d.torch import hpc_backend
from hpc_c10d.torch.torch_nccl import CUDA_ENV, TorchNCCL, cuda_path, torch_nccl

_c10d = pytest.importorskip("torch._C._distributed_c10d")


class CudaTensor(torch.Tensor):
    """A CPU tensor that says it is a CUDA one (what the routing reads), and nothing more."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


def _cuda(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype).as_subclass(CudaTensor)


class RecordingNCCL:
    """A recording stand-in for torch's ProcessGroupNCCL: each call is kept with its arguments
    (the reduce op's type read at call time) and answered with a handle that is complete."""

    def __init__(self):
        self.calls = []
        self.done = True

    def __getattr__(self, name):
        def call(*args):
            ops = [a.reduceOp.op for a in args if hasattr(a, "reduceOp")]
            self.calls.append((name, args, ops))
            return self
        return call

    def is_completed(self):
        return self.done


@pytest.fixture
def routed():
    """The default group's backend with the stand-in as its torch NCCL, put back afterwards."""
    torch_world()
    pg = hpc_backend()
    saved, saved_watch = pg._cuda, pg._inner._gpu_watch
    recorder = RecordingNCCL()
    pg._cuda = pg._inner._gpu_watch = TorchNCCL(recorder)
    try:
        yield pg, recorder
    finally:
        pg._cuda, pg._inner._gpu_watch = saved, saved_watch


@pytest.mark.mpi
def test_cpu_tensors_stay_on_mpi_when_a_torch_nccl_is_there(routed):
    pg, recorder = routed
    x = torch.ones(3)
    tdist.all_reduce(x)
    assert x.tolist() == [tdist.get_world_size()] * 3
    assert recorder.calls == [] and not pg._cuda.used


@pytest.mark.mpi
def test_each_method_goes_to_torchs_method_of_the_same_name(routed):
    pg, recorder = routed
    a, b = _cuda(1.0, 2.0), _cuda(3.0, 4.0)
    calls = [
        ("allreduce", ([a], _c10d.AllreduceOptions())),
        ("broadcast", ([a], _c10d.BroadcastOptions())),
        ("reduce", ([a], _c10d.ReduceOptions())),
        ("allgather", ([[a]], [b], _c10d.AllgatherOptions())),
        ("_allgather_base", (a, b, _c10d.AllgatherOptions())),
        ("gather", ([[a]], [b], _c10d.GatherOptions())),
        ("scatter", ([a], [[b]], _c10d.ScatterOptions())),
        ("reduce_scatter", ([a], [[b]], _c10d.ReduceScatterOptions())),
        ("_reduce_scatter_base", (a, b, _c10d.ReduceScatterOptions())),
        ("alltoall_base", (a, b, [], [], _c10d.AllToAllOptions())),
        ("alltoall", ([a], [b], _c10d.AllToAllOptions())),
        ("send", ([a], 0, 5)),
        ("recv", ([a], 0, 5)),
    ]
    seq, p2p_seq = pg._inner._seq, pg._inner._p2p_seq
    for name, args in calls:
        assert getattr(pg, name)(*args) is recorder
    assert [(name, args) for name, args, _ in recorder.calls] == calls
    assert pg._inner._seq == seq + len(calls) - 2 and pg._inner._p2p_seq == p2p_seq + 2
    assert pg._cuda.used and pg._cuda.latest[:2] == (recorder, "recv")
    pg.all_gather_single(a, b)  # torch 2.14's names for the same methods
    pg.reduce_scatter_single(a, b)
    pg.all_to_all_single(a, b, [], [])
    assert [name for name, _, _ in recorder.calls[-3:]] == ["_allgather_base", "_reduce_scatter_base", "alltoall_base"]


@pytest.mark.mpi
def test_barrier_goes_to_torchs_nccl_once_it_ran_something(routed):
    pg, recorder = routed
    pg.barrier(_c10d.BarrierOptions())  # nothing on the GPU yet: the group's MPI barrier
    assert recorder.calls == []
    pg.allreduce([_cuda(1.0)])
    assert pg.barrier(_c10d.BarrierOptions()) is recorder
    assert [name for name, _, _ in recorder.calls] == ["allreduce", "barrier"]


@pytest.mark.mpi
def test_coalesced_and_batched_calls_are_one_group_of_torchs(routed):
    pg, recorder = routed
    outs, ins = [_cuda(0.0, 0.0), _cuda(0.0, 0.0)], [_cuda(1.0), _cuda(2.0)]
    assert pg.allgather_into_tensor_coalesced(outs, ins, _c10d.AllgatherOptions()) is recorder
    works = pg.batch_p2p([(True, ins[0], 1, 0), (False, ins[1], 1, 0)])
    assert works == [recorder, recorder]
    names = [name for name, _, _ in recorder.calls]
    assert names == ["_start_coalescing", "_allgather_base", "_allgather_base", "_end_coalescing",
                     "_start_coalescing", "send", "recv", "_end_coalescing"]
    assert recorder.calls[5][1] == ([ins[0]], 1, 0) and recorder.calls[6][1] == ([ins[1]], 1, 0)


@pytest.mark.mpi
@pytest.mark.parametrize("factor", [0.5, "tensor"])
def test_a_bfloat16_premul_sum_reaches_torch_as_a_sum_of_scaled_inputs(routed, factor):
    pg, recorder = routed
    f = torch.tensor(0.5, dtype=torch.bfloat16) if factor == "tensor" else factor
    premul = tdist._make_nccl_premul_sum(f)
    x = _cuda(4.0, 6.0, dtype=torch.bfloat16)
    opts = _c10d.AllreduceOptions()
    opts.reduceOp = premul
    pg.allreduce([x], opts)
    assert x.tolist() == [2.0, 3.0]  # scaled in place; NCCL then sums
    assert recorder.calls[-1][2] == [tdist.ReduceOp.RedOpType.SUM]
    assert opts.reduceOp.op == tdist.ReduceOp.RedOpType.PREMUL_SUM  # the caller's options are put back
    source = _cuda(8.0, 2.0, dtype=torch.bfloat16)
    rs = _c10d.ReduceScatterOptions()
    rs.reduceOp = premul
    pg._reduce_scatter_base(_cuda(0.0, dtype=torch.bfloat16), source, rs)
    name, args, ops = recorder.calls[-1]
    assert name == "_reduce_scatter_base" and ops == [tdist.ReduceOp.RedOpType.SUM]
    assert args[1].tolist() == [4.0, 1.0] and source.tolist() == [8.0, 2.0]  # scaled into a new tensor
    y = _cuda(4.0, dtype=torch.float32)  # float32 is right in torch's NCCL: left to it
    opts.reduceOp = premul
    pg.allreduce([y], opts)
    assert y.tolist() == [4.0] and recorder.calls[-1][2] == [tdist.ReduceOp.RedOpType.PREMUL_SUM]


@pytest.mark.mpi
def test_the_watchdog_sees_an_operation_torchs_nccl_has_not_finished(routed):
    pg, recorder = routed
    pg.allreduce([_cuda(1.0)])
    recorder.done = False
    assert pg._cuda._overdue(60.0) is None  # too young
    stuck = pg._cuda._overdue(0.0)
    assert stuck is not None and stuck.op_name == "allreduce" and stuck.where == "cuda:0"
    assert pg._cuda._overdue(0.0) is stuck  # the same report each time: the watchdog acts once
    assert stuck.age() >= 0 and pg._cuda._async_failure() is None
    recorder.done = True
    assert pg._cuda._overdue(0.0) is None


def test_the_path_setting(monkeypatch):
    has_nccl = tdist.is_nccl_available()
    monkeypatch.delenv(CUDA_ENV, raising=False)
    assert cuda_path() == ("nccl" if has_nccl else "hpc")
    monkeypatch.setenv(CUDA_ENV, "HPC")
    assert cuda_path() == "hpc"
    monkeypatch.setenv(CUDA_ENV, "gloo")
    with pytest.raises(ValueError, match="use one of nccl, hpc"):
        cuda_path()
    monkeypatch.setenv(CUDA_ENV, "nccl")
    if has_nccl:
        assert cuda_path() == "nccl"
    else:
        with pytest.raises(ValueError, match="built without NCCL"):
            cuda_path()


def test_no_torch_nccl_without_a_gpu_or_when_hpc_is_chosen(monkeypatch):
    monkeypatch.setenv(CUDA_ENV, "hpc")
    assert torch_nccl(object(), 0, 1, [], "g", timedelta(seconds=1)) is None
    monkeypatch.delenv(CUDA_ENV)
    if not torch.cuda.is_available():
        assert torch_nccl(object(), 0, 1, [], "g", timedelta(seconds=1)) is None
    assert torch_nccl(None, 0, 1, [], "g", timedelta(seconds=1)) is None


def test_torchs_watchdog_waits_for_ours_to_report(monkeypatch):
    monkeypatch.setattr(watchdog, "_watchdog", None)
    assert watchdog.report_time() == 0.0

    class Running:
        grace = 5.0

    monkeypatch.setattr(watchdog, "_watchdog", Running())
    assert watchdog.report_time() > 2 * Running.grace
