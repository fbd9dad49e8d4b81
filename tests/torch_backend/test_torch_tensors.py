"""The collectives on torch CPU tensors: results written in place into the tensor's storage,
references computed with torch itself."""
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; torch-tensor tests skipped")

import hpc_c10d as dist  # noqa: E402
from support.reference import (BFLOAT16, OPS, Deferred, a2a_chunk, make_op, op_valid, raises_everywhere,  # noqa: E402
                               rank_data, reduce_inputs, split_count)

pytestmark = pytest.mark.mpi

# torch dtype -> numpy dtype used to build the (shared, rank-derived) input data
NP_OF = {
    torch.bool: np.dtype(np.bool_), torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8), torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64), torch.float16: np.dtype(np.float16),
    torch.bfloat16: BFLOAT16, torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64), torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
TORCH_DTYPES = list(NP_OF)
PAIRS = [(t, op) for t in TORCH_DTYPES for op in OPS if op_valid(NP_OF[t], op)]
MOVE_DTYPES = [torch.bool, torch.int64, torch.float16, torch.bfloat16, torch.float32,
               torch.complex64]


def _tid(t):
    return str(t).replace("torch.", "")


def T(a, dtype):
    """numpy data -> a fresh contiguous torch tensor of ``dtype`` (values are exact)."""
    a = np.asarray(a)
    if a.dtype == BFLOAT16:
        a = a.astype(np.float32)
    return torch.from_numpy(a.copy()).to(dtype)


def tdata(shape, dtype, seed):
    return T(rank_data(shape, NP_OF[dtype], seed), dtype)


def treduce(tensors, op, factor=2.0):
    """torch reference for reducing ``tensors`` (one per rank) with op name ``op``."""
    dt = tensors[0].dtype
    s = torch.stack(tensors)
    n = len(tensors)
    if dt == torch.bool:
        fn = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
              "PRODUCT": torch.logical_and, "MIN": torch.logical_and,
              "BAND": torch.logical_and, "BXOR": torch.logical_xor}[op]
        return functools.reduce(fn, tensors).clone()
    if op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        return functools.reduce(fn, tensors).clone()
    if op == "SUM":
        res = s.sum(0)
    elif op == "PRODUCT":
        res = s.prod(0)
    elif op == "MIN":
        res = s.amin(0)
    elif op == "MAX":
        res = s.amax(0)
    elif op == "AVG":
        res = (torch.div(s.sum(0), n, rounding_mode="trunc")
               if not (dt.is_floating_point or dt.is_complex) else s.sum(0) / n)
    elif op == "PREMUL_SUM":
        res = factor * s.sum(0)
    else:
        raise AssertionError(op)
    return res.to(dt)


def assert_t(actual, expected):
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected), (actual, expected)


def _rinputs(shape, dtype, op, size):
    return [T(a, dtype) for a in reduce_inputs(shape, NP_OF[dtype], op, size)]


# ------------------------------------------------------------------------------ reductions

@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{_tid(p[0])}-{p[1]}")
def test_all_reduce(world, rank, size, pair):
    dtype, op = pair
    inputs = _rinputs((4, 5), dtype, op, size)
    t = inputs[rank].clone()
    ptr = t.data_ptr()
    assert dist.all_reduce(t, op=make_op(op)) is None
    assert t.data_ptr() == ptr
    assert_t(t, treduce(inputs, op))


@pytest.mark.parametrize("dtype,op", [(torch.complex64, "MAX"), (torch.complex64, "PRODUCT"),
                                      (torch.float32, "BAND"), (torch.bfloat16, "BXOR"),
                                      (torch.bool, "AVG"), (torch.int64, "PREMUL_SUM")],
                         ids=_tid)
def test_invalid_op_raises(world, rank, size, dtype, op):
    t = tdata((3,), dtype, rank)
    before = t.clone()
    raises_everywhere(lambda: dist.all_reduce(t, op=make_op(op)))
    assert_t(t, before)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=_tid)
def test_reduce_every_root(world, rank, size, dtype):
    op = "SUM" if dtype != torch.bool else "BXOR"
    inputs = _rinputs((3, 4), dtype, op, size)
    check = Deferred(assert_t)
    for root in range(size):
        t = inputs[rank].clone()
        dist.reduce(t, dst=root, op=make_op(op))
        check(f"root {root}", t, treduce(inputs, op) if rank == root else inputs[rank])
    check.verify()


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=_tid)
def test_reduce_scatter_tensor_and_list(world, rank, size, dtype):
    op = "SUM" if dtype != torch.bool else "MAX"
    inputs = _rinputs((size, 2, 3), dtype, op, size)
    expected = treduce(inputs, op)[rank]
    out = torch.zeros((2, 3), dtype=dtype)
    dist.reduce_scatter_tensor(out, inputs[rank].clone(), op=make_op(op))
    out2 = torch.zeros((2, 3), dtype=dtype)
    dist.reduce_scatter(out2, [c.clone() for c in inputs[rank].unbind(0)], op=make_op(op))
    assert_t(out, expected)
    assert_t(out2, expected)


# ------------------------------------------------------------------------------ data movement

@pytest.mark.parametrize("shape", [(), (0,), (2, 3, 4)], ids=["scalar", "empty", "3d"])
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=_tid)
def test_broadcast_every_root(world, rank, size, dtype, shape):
    check = Deferred(assert_t)
    for root in range(size):
        t = tdata(shape, dtype, rank)
        dist.broadcast(t, src=root)
        check(f"root {root}", t, tdata(shape, dtype, root))
    check.verify()


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=_tid)
def test_all_gather_and_into_tensor(world, rank, size, dtype):
    outs = [torch.zeros((2, 3), dtype=dtype) for _ in range(size)]
    dist.all_gather(outs, tdata((2, 3), dtype, rank))
    out = torch.zeros((2 * size, 3), dtype=dtype)
    dist.all_gather_into_tensor(out, tdata((2, 3), dtype, rank))
    stacked = torch.zeros((size, 2, 3), dtype=dtype)
    dist.all_gather_into_tensor(stacked, tdata((2, 3), dtype, rank))
    for r in range(size):
        assert_t(outs[r], tdata((2, 3), dtype, r))
    assert_t(out, torch.cat([tdata((2, 3), dtype, r) for r in range(size)]))
    assert_t(stacked, torch.stack([tdata((2, 3), dtype, r) for r in range(size)]))


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=_tid)
def test_gather_scatter_every_root(world, rank, size, dtype):
    check = Deferred(assert_t)
    for root in range(size):
        glist = [torch.zeros(5, dtype=dtype) for _ in range(size)] if rank == root else None
        dist.gather(tdata((5,), dtype, rank), glist, dst=root)
        if rank == root:
            for r in range(size):
                check(f"gather root {root} from {r}", glist[r], tdata((5,), dtype, r))
        slist = [tdata((5,), dtype, 4 * root + k) for k in range(size)] if rank == root else None
        out = torch.zeros(5, dtype=dtype)
        dist.scatter(out, slist, src=root)
        check(f"scatter root {root}", out, tdata((5,), dtype, 4 * root + rank))
    check.verify()


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=_tid)
def test_all_to_all_uneven(world, rank, size, dtype):
    npdt = NP_OF[dtype]
    inp = [T(a2a_chunk(rank, p, npdt, split_count(rank, p), (2,)), dtype) for p in range(size)]
    out = [torch.zeros((split_count(p, rank), 2), dtype=dtype) for p in range(size)]
    dist.all_to_all(out, inp)
    for p in range(size):
        assert_t(out[p], T(a2a_chunk(p, rank, npdt, split_count(p, rank), (2,)), dtype))


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=_tid)
def test_all_to_all_single_uneven(world, rank, size, dtype):
    npdt = NP_OF[dtype]
    ins = [split_count(rank, p) for p in range(size)]
    outs = [split_count(p, rank) for p in range(size)]
    inp = torch.cat([T(a2a_chunk(rank, p, npdt, ins[p], (3,)), dtype) for p in range(size)])
    out = torch.zeros((sum(outs), 3), dtype=dtype)
    dist.all_to_all_single(out, inp, outs, ins)
    assert_t(out, torch.cat([T(a2a_chunk(p, rank, npdt, outs[p], (3,)), dtype)
                             for p in range(size)]))


# ------------------------------------------------------------------------------ storage / autograd

def test_all_reduce_writes_into_a_view(world, rank, size):
    base = torch.zeros((4, 6), dtype=torch.float32)
    base[1:3] = rank + 1
    dist.all_reduce(base[1:3])
    expected = torch.zeros((4, 6))
    expected[1:3] = size * (size + 1) / 2
    assert_t(base, expected)


def test_requires_grad_under_no_grad(world, rank, size):
    t = torch.full((3,), float(rank + 1), requires_grad=True)
    with torch.no_grad():
        dist.all_reduce(t)
        dist.broadcast(t, src=size - 1)
    assert t.requires_grad
    assert_t(t.detach(), torch.full((3,), size * (size + 1) / 2))


def test_detached_tensor_shares_storage(world, rank, size):
    leaf = torch.full((4,), float(rank), requires_grad=True)
    d = leaf.detach()
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    assert_t(d, torch.full((4,), float(size - 1)))
    assert_t(leaf.detach(), torch.full((4,), float(size - 1)))  # same storage as the leaf


def test_requires_grad_input_is_only_read(world, rank, size):
    """A tensor that requires grad may be a send-only input without any no_grad context."""
    emb = torch.full((2, 3), float(rank), requires_grad=True)
    outs = [torch.zeros((2, 3)) for _ in range(size)]
    dist.all_gather(outs, emb)
    big = torch.zeros((2 * size, 3))
    dist.all_gather_into_tensor(big, emb * 2)  # a non-leaf with grad history
    for r in range(size):
        assert_t(outs[r], torch.full((2, 3), float(r)))
    assert_t(big, torch.cat([torch.full((2, 3), 2.0 * r) for r in range(size)]))
    assert emb.requires_grad


def test_noncontiguous_bfloat16_input(world, rank, size):
    src = tdata((4, 6), torch.bfloat16, rank)
    out = torch.zeros((size * 4, 3), dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, src[:, ::2])
    assert_t(out, torch.cat([tdata((4, 6), torch.bfloat16, r)[:, ::2] for r in range(size)]))


def test_noncontiguous_input_is_fine(world, rank, size):
    src = tdata((6, 4), torch.float32, rank)
    outs = [torch.zeros(6) for _ in range(size)]
    dist.all_gather(outs, src[:, 1])
    for r in range(size):
        assert_t(outs[r], tdata((6, 4), torch.float32, r)[:, 1].contiguous())


@pytest.mark.parametrize("make", [lambda: torch.arange(10.0)[::2],
                                  lambda: torch.arange(12.0).reshape(3, 4).t()],
                         ids=["strided", "transposed"])
def test_noncontiguous_output_raises(world, rank, size, make):
    t = make()
    before = t.clone()
    raises_everywhere(lambda: dist.all_reduce(t))
    assert_t(t, before)


# ------------------------------------------------------------------------------ async

def test_async_future_returns_the_tensor(world, rank, size):
    inputs = _rinputs((5,), torch.bfloat16, "SUM", size)
    t = inputs[rank].clone()
    work = dist.all_reduce(t, async_op=True)
    value = work.get_future().wait()
    assert isinstance(value, list) and len(value) == 1
    assert isinstance(value[0], torch.Tensor) and value[0].data_ptr() == t.data_ptr()
    assert work.is_completed() and work.is_success()
    assert_t(t, treduce(inputs, "SUM"))


def test_async_mixed_ops_reverse_wait(world, rank, size):
    a = tdata((4,), torch.float16, rank)
    b = torch.full((3,), rank, dtype=torch.int64)
    out = torch.zeros((size, 2), dtype=torch.complex64)
    works = [dist.broadcast(a, src=0, async_op=True),
             dist.all_reduce(b, op=dist.ReduceOp.SUM, async_op=True),
             dist.all_gather_into_tensor(out, tdata((2,), torch.complex64, rank), async_op=True)]
    for w in reversed(works):
        w.wait()
    assert_t(a, tdata((4,), torch.float16, 0))
    assert_t(b, torch.full((3,), size * (size - 1) // 2, dtype=torch.int64))
    assert_t(out, torch.stack([tdata((2,), torch.complex64, r) for r in range(size)]))
