"""The NCCL backend's parts that need no GPU: torch's dtype and op rules for NCCL, the library
binding, device choice and parsing, and (under mpiexec) the MPI exchange of unique IDs and
the collective refusal when a rank has no GPU. GPU operations are in test_nccl_gpu.py."""

import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d.arrays import SUPPORTED_DTYPES, bfloat16_dtype
from hpc_c10d.errors import DistBackendError
from hpc_c10d.nccl import library
from hpc_c10d.nccl.buffers import _c_contiguous, as_device_buffer
from hpc_c10d.nccl.device import device_index, local_device
from hpc_c10d.nccl.dtypes import nccl_reduction
from hpc_c10d.nccl.library import DataType, RedOp
from hpc_c10d.reduce_op import ReduceOp, RedOpType

needs_nccl = pytest.mark.skipif(not library.available(),
                                reason="the NCCL library is not installed (pip install nvidia-nccl-cu13)")


def _dtype(name):
    return bfloat16_dtype() if name == "bfloat16" else np.dtype(name)


NCCL_TYPES = {"int8": DataType.INT8, "uint8": DataType.UINT8, "int32": DataType.INT32, "uint32": DataType.UINT32,
              "int64": DataType.INT64, "uint64": DataType.UINT64, "float16": DataType.FLOAT16,
              "float32": DataType.FLOAT32, "float64": DataType.FLOAT64, "bfloat16": DataType.BFLOAT16,
              "bool": DataType.UINT8, "complex64": DataType.FLOAT32, "complex128": DataType.FLOAT64}


@pytest.mark.parametrize("name", SUPPORTED_DTYPES)
@pytest.mark.parametrize("op", [RedOpType.SUM, RedOpType.AVG, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX])
def test_reductions_follow_torchs_nccl_rules(name, op):
    dtype = _dtype(name)
    if name in ("int16", "uint16"):
        with pytest.raises(TypeError, match="not supported for NCCL"):
            nccl_reduction(op, dtype, "all_reduce")
        return
    complex_refused = name.startswith("complex") and op not in (RedOpType.SUM, RedOpType.AVG)
    if complex_refused or (name == "bool" and op is RedOpType.AVG):
        with pytest.raises(ValueError, match="does not support"):
            nccl_reduction(op, dtype, "all_reduce")
        return
    red = nccl_reduction(op, dtype, "all_reduce")
    assert red.datatype == NCCL_TYPES[name]
    assert red.width == (2 if name.startswith("complex") else 1)
    expected = {RedOpType.SUM: RedOp.SUM, RedOpType.AVG: RedOp.AVG, RedOpType.PRODUCT: RedOp.PROD,
                RedOpType.MIN: RedOp.MIN, RedOpType.MAX: RedOp.MAX}[op]
    if name == "bool" and op is RedOpType.SUM:
        expected = RedOp.MAX  # "any", as torch's NCCL backend maps it
    assert (red.op, red.factor) == (expected, None)


@pytest.mark.parametrize("op", [RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR])
@pytest.mark.parametrize("name", ["int32", "uint8", "bool"])
def test_bitwise_reductions_raise_as_torch_does(op, name):
    with pytest.raises(ValueError, match=f"Cannot use ReduceOp.{op.name} with NCCL"):
        nccl_reduction(op, _dtype(name), "all_reduce")


@pytest.mark.parametrize("name,factor", [("float32", 0.25), ("float64", 1 / 3), ("float16", 0.5),
                                         ("bfloat16", 0.125), ("complex64", 2.0), ("complex128", complex(0.5, 0))])
def test_premul_sum_carries_its_factor_in_the_nccl_type(name, factor):
    red = nccl_reduction(dist._make_nccl_premul_sum(factor), _dtype(name), "all_reduce")
    element = {"complex64": np.float32, "complex128": np.float64}.get(name, _dtype(name))
    assert red.op is None
    assert np.frombuffer(red.factor, dtype=element)[0] == np.asarray(complex(factor).real, dtype=element)


def test_premul_sum_refuses_complex_factors_and_integers():
    with pytest.raises(ValueError, match="must be real"):
        nccl_reduction(dist._make_nccl_premul_sum(1j), np.dtype(np.complex64), "all_reduce")
    with pytest.raises(ValueError, match="PREMUL_SUM only on floating-point"):
        nccl_reduction(dist._make_nccl_premul_sum(2), np.dtype(np.int32), "all_reduce")


def test_a_reduce_op_instance_works_like_its_member():
    assert nccl_reduction(ReduceOp(RedOpType.MAX), np.dtype(np.float32), "all_reduce").op == RedOp.MAX


def test_device_choice_is_local_rank_modulo_visible_gpus():
    assert [local_device(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [local_device(r, 1) for r in range(3)] == [0, 0, 0]  # SLURM: one GPU per task, seen as 0
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        local_device(0, 0)


def test_device_ids_parse_like_torch_devices():
    assert device_index(3) == 3
    assert device_index("cuda:2") == 2
    with pytest.raises(ValueError, match="must be a CUDA device"):
        device_index("cpu")
    with pytest.raises(ValueError, match="non-negative"):
        device_index(-1)
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError):
            device_index(bad)


def test_device_ids_accept_torch_devices():
    torch = pytest.importorskip("torch")
    assert device_index(torch.device("cuda", 1)) == 1
    with pytest.raises(ValueError, match="must be a CUDA device"):
        device_index(torch.device("cpu"))


def test_contiguity_from_array_interface_strides():
    assert _c_contiguous((2, 3), None, 4)
    assert _c_contiguous((2, 3), (12, 4), 4)
    assert not _c_contiguous((2, 3), (4, 8), 4)  # Fortran order
    assert _c_contiguous((1, 3), (999, 4), 4)  # extent 1: its stride does not matter


def test_host_arrays_are_not_device_buffers():
    with pytest.raises(TypeError, match="expected `tensor` to be a CUDA array"):
        as_device_buffer(np.zeros(3))
    with pytest.raises(TypeError, match="expected `x` to be a CUDA array"):
        as_device_buffer([1, 2], "x")


@needs_nccl
def test_library_loads_without_a_gpu_and_gives_fresh_unique_ids():
    nccl = library.load()
    major, minor, _ = nccl.version
    assert (major, minor) >= (2, 7)
    assert nccl.has_split == ((major, minor) >= (2, 18))
    first, second = nccl.unique_id(), nccl.unique_id()
    assert len(first) == len(second) == library.UNIQUE_ID_BYTES
    assert first != second


@needs_nccl
def test_library_errors_name_the_call_and_nccls_reason():
    nccl = library.load()
    with pytest.raises(DistBackendError, match=r"NCCL error in ncclTest: .*NCCL 2\."):
        nccl.check(4, "ncclTest")  # ncclInvalidArgument
    nccl.check(0, "ncclTest")


def test_a_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(library, "_loaded", None)
    monkeypatch.setattr(library, "_failure", None)
    monkeypatch.setenv(library.LIBRARY_ENV, str(tmp_path / "libnccl.so.2"))
    with pytest.raises(RuntimeError, match=f"could not be loaded .*{library.LIBRARY_ENV}"):
        library.load()
    assert not library.available()


@pytest.mark.mpi(min_size=2)
@needs_nccl
def test_unique_id_reaches_every_rank_over_mpi(world):
    from mpi4py import MPI

    from hpc_c10d.nccl.comm import exchange_unique_id

    comm = MPI.COMM_WORLD
    nccl = library.load()
    ids = [exchange_unique_id(comm, nccl) for _ in range(2)]
    for uid in ids:
        assert len(uid) == library.UNIQUE_ID_BYTES
        assert comm.allgather(uid) == [uid] * comm.Get_size()
    assert ids[0] != ids[1]
    odd = comm.Split(comm.Get_rank() % 2, comm.Get_rank())  # a subgroup gets an ID of its own
    sub_id = exchange_unique_id(odd, nccl)
    assert odd.allgather(sub_id) == [sub_id] * odd.Get_size()
    assert sub_id not in ids
    odd.Free()


@pytest.mark.mpi(min_size=2)
@needs_nccl
def test_a_rank_without_a_gpu_fails_every_rank_alike(world):
    from mpi4py import MPI

    from hpc_c10d.nccl import cuda
    from hpc_c10d.nccl.comm import check_members

    if cuda.device_count() > 0:
        pytest.skip("this machine has a GPU; the refusal is for ranks without one")
    with pytest.raises(DistBackendError, match="no CUDA device is visible") as caught:
        check_members(MPI.COMM_WORLD, 0, "the test group", library.load().version)
    message = str(caught.value)
    assert all(f"rank {r} on" in message for r in range(MPI.COMM_WORLD.Get_size()))
    assert MPI.COMM_WORLD.allgather(message) == [message] * MPI.COMM_WORLD.Get_size()


def test_a_span_of_array_interface_blocks_keeps_the_stream_they_name():
    from hpc_c10d.nccl.backend import _span
    from hpc_c10d.nccl.buffers import DeviceBuffer

    dtype = np.dtype(np.float32)
    blocks = [DeviceBuffer(0x1000 + 16 * i, 4, dtype, (4,), 0, None, "cai", True, stream_hint=0xBEEF)
              for i in range(3)]
    span = _span(blocks)
    assert span is not None and (span.ptr, span.size, span.kind) == (0x1000, 12, "cai")
    assert span.stream_hint == 0xBEEF  # the caller's stream, not the legacy default one
    assert _span([blocks[0], blocks[2]]) is None  # not back to back


@pytest.mark.parametrize("name,code", [("float8_e4m3fn", DataType.FLOAT8E4M3), ("float8_e5m2", DataType.FLOAT8E5M2)])
def test_float8_reduces_as_nccls_own_fp8_types(name, code):
    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, name))
    for op in (RedOpType.SUM, RedOpType.AVG, RedOpType.MIN, RedOpType.MAX, RedOpType.PRODUCT):
        red = nccl_reduction(op, dtype, "all_reduce")
        assert (red.datatype, red.width) == (code, 1)
    with pytest.raises(ValueError, match="Cannot use ReduceOp.BAND with NCCL"):
        nccl_reduction(RedOpType.BAND, dtype, "all_reduce")
    with pytest.raises(TypeError, match="Unsupported Float8 type for NCCL reduction"):
        nccl_reduction(RedOpType.SUM, dtype, "all_reduce", native_fp8=False)  # NCCL before 2.24


@pytest.mark.parametrize("name", ["float8_e4m3fnuz", "float8_e5m2fnuz"])
def test_float8_fnuz_moves_but_does_not_reduce(name):
    import ml_dtypes

    from hpc_c10d.nccl.buffers import device_supported

    dtype = np.dtype(getattr(ml_dtypes, name))
    assert device_supported(dtype)
    with pytest.raises(TypeError, match="Unsupported Float8 type for NCCL reduction"):
        nccl_reduction(RedOpType.SUM, dtype, "all_reduce")


def test_torch_float8_tensors_are_device_dtypes():
    torch = pytest.importorskip("torch")
    import ml_dtypes

    from hpc_c10d.nccl.buffers import _torch_dtype, device_supported

    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        assert _torch_dtype(getattr(torch, name)) == np.dtype(getattr(ml_dtypes, name))
        assert device_supported(_torch_dtype(getattr(torch, name)))
    assert _torch_dtype(torch.bfloat16) == bfloat16_dtype()
    if hasattr(torch, "float8_e8m0fnu"):
        with pytest.raises(TypeError, match="not supported by the NCCL backend"):
            _torch_dtype(torch.float8_e8m0fnu)


@needs_nccl
def test_a_finished_call_is_settled_without_polling_and_a_failed_one_raises():
    from hpc_c10d.nccl.comm import settle

    nccl = library.load()
    settle(nccl, 0, 0, "ncclTest", 1.0)  # ncclSuccess: no poll of the (absent) communicator
    with pytest.raises(DistBackendError, match="NCCL error in ncclTest"):
        settle(nccl, 0, 5, "ncclTest", 1.0)  # ncclInvalidUsage


def _recorded(calls: list, cls: type, name: str):
    """``cls.name`` that first appends ("Class.name", *args) to ``calls``."""
    original = getattr(cls, name)

    def recorded(self, *args):
        calls.append((f"{cls.__name__}.{name}", *args))
        return original(self, *args)

    return recorded


@pytest.mark.mpi(min_size=1)
@needs_nccl
def test_barrier_waits_for_the_gpu_transport_then_makes_the_same_mpi_call_on_every_rank(world, monkeypatch):
    """Once the group has a GPU transport, its queued work is waited for first; the MPI barrier is
    always the CPU transport's, so a rank with a GPU transport and one without make the same MPI call."""
    from hpc_c10d.mpi.backend import MPIBackend
    from hpc_c10d.nccl.backend import NCCLBackend

    group = dist.new_group(list(range(dist.get_world_size())))
    calls: list[tuple] = []
    for cls, name in ((NCCLBackend, "_finish_queued"), (NCCLBackend, "barrier"), (MPIBackend, "barrier")):
        monkeypatch.setattr(cls, name, _recorded(calls, cls, name))
    dist.barrier(group=group)
    assert calls == [("MPIBackend.barrier", False)]  # no GPU transport yet
    if dist.get_rank() % 2 == 0:  # a GPU transport on some ranks only (made without a GPU: the library loads)
        group._transport_for_device("cuda")
    calls.clear()
    dist.barrier(group=group)
    assert dist.barrier(group=group, async_op=True).wait()
    waited = [("NCCLBackend._finish_queued",)] if dist.get_rank() % 2 == 0 else []
    assert calls == [*waited, ("MPIBackend.barrier", False), *waited, ("MPIBackend.barrier", True)]
    dist.destroy_process_group(group)
