"""Every claimed dtype x every ReduceOp, for each reducing collective, plus dtype round-trips
through the data-movement collectives.  Invalid dtype/op pairs must raise ValueError on every
rank before any communication, so the ranks stay in step afterwards."""
import numpy as np
import pytest

import hpc_c10d as dist
from support.reference import (ALL_DTYPES, COMPLEX_DTYPES, FLOAT_DTYPES, INT_DTYPES, OPS, Deferred, assert_same,
                               dtype_id, empty_like_filled, make_op, op_valid, raises_everywhere, rank_data,
                               reduce_inputs, reduce_ref)

pytestmark = pytest.mark.mpi

SHAPE = (4, 5)  # 20 elements: covers every bool truth-table row up to 4 ranks

VALID = [(dt, op) for dt in ALL_DTYPES for op in OPS if op_valid(dt, op)]
INVALID = [(dt, op) for dt in ALL_DTYPES for op in OPS if not op_valid(dt, op)]


def _pair_id(p):
    return f"{dtype_id(p[0])}-{p[1]}"


# ---------------------------------------------------------------- reductions, valid pairs

@pytest.mark.parametrize("pair", VALID, ids=_pair_id)
def test_all_reduce(world, rank, size, pair):
    dt, op = pair
    inputs = reduce_inputs(SHAPE, dt, op, size)
    x = inputs[rank].copy()
    assert dist.all_reduce(x, op=make_op(op)) is None
    assert_same(x, reduce_ref(inputs, op))


@pytest.mark.parametrize("pair", VALID, ids=_pair_id)
def test_all_reduce_and_reduce_large(world, rank, size, pair):
    # 65537 elements: past any eager/segment threshold, so user-defined MPI reductions
    # (bool, float16, bfloat16, AVG, PREMUL_SUM ...) are applied chunk by chunk
    dt, op = pair
    inputs = reduce_inputs((65537,), dt, op, size)
    expected = reduce_ref(inputs, op)
    x = inputs[rank].copy()
    dist.all_reduce(x, op=make_op(op))
    root = size - 1
    y = inputs[rank].copy()
    dist.reduce(y, dst=root, op=make_op(op))
    assert_same(x, expected)
    assert_same(y, expected if rank == root else inputs[rank])


@pytest.mark.parametrize("pair", VALID, ids=_pair_id)
def test_reduce_every_root(world, rank, size, pair):
    dt, op = pair
    inputs = reduce_inputs(SHAPE, dt, op, size)
    check, returned = Deferred(), []
    for root in range(size):
        x = inputs[rank].copy()
        returned.append(dist.reduce(x, dst=root, op=make_op(op)))
        # the non-destination input is left unchanged
        check(f"root {root}", x, reduce_ref(inputs, op) if rank == root else inputs[rank])
    check.verify()
    assert returned == [None] * size


@pytest.mark.parametrize("pair", VALID, ids=_pair_id)
def test_reduce_scatter_tensor(world, rank, size, pair):
    dt, op = pair
    # rank r's input is size blocks of SHAPE; block k goes (reduced) to rank k
    inputs = reduce_inputs((size,) + SHAPE, dt, op, size)
    out = empty_like_filled(SHAPE, dt)
    assert dist.reduce_scatter_tensor(out, inputs[rank].copy(), op=make_op(op)) is None
    assert_same(out, reduce_ref(inputs, op)[rank])


@pytest.mark.parametrize("pair", VALID, ids=_pair_id)
def test_reduce_scatter_list(world, rank, size, pair):
    dt, op = pair
    inputs = reduce_inputs((size,) + SHAPE, dt, op, size)
    out = empty_like_filled(SHAPE, dt)
    input_list = [inputs[rank][k].copy() for k in range(size)]
    assert dist.reduce_scatter(out, input_list, op=make_op(op)) is None
    assert_same(out, reduce_ref(inputs, op)[rank])


# ---------------------------------------------------------------- reductions, invalid pairs

def _call_reducing(name, x, op, size):
    if name == "all_reduce":
        dist.all_reduce(x, op=op)
    elif name == "reduce":
        dist.reduce(x, dst=0, op=op)
    elif name == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(x[:1].copy(), np.concatenate([x[:1]] * size), op=op)
    elif name == "reduce_scatter":
        dist.reduce_scatter(x[:1].copy(), [x[:1].copy() for _ in range(size)], op=op)
    elif name == "all_reduce_async":
        dist.all_reduce(x, op=op, async_op=True).wait()
    else:
        raise AssertionError(name)


@pytest.mark.parametrize("coll", ["all_reduce", "reduce", "reduce_scatter_tensor",
                                  "reduce_scatter", "all_reduce_async"])
@pytest.mark.parametrize("pair", INVALID, ids=_pair_id)
def test_invalid_op_raises_value_error(world, rank, size, pair, coll):
    dt, op = pair
    x = rank_data((3,), dt, rank)
    before = x.copy()
    raises_everywhere(lambda: _call_reducing(coll, x, make_op(op), size))
    assert_same(x, before)


# ---------------------------------------------------------------- op-specific semantics

@pytest.mark.parametrize("dt", INT_DTYPES, ids=dtype_id)
def test_avg_on_ints_truncates_toward_zero(world, rank, size, dt):
    # mostly negative sums for signed types, so truncation (not floor) is observable
    shift = 0 if np.dtype(dt).kind == "u" else -5
    inputs = [((np.arange(12) * (r + 1)) % 7 + shift).astype(dt) for r in range(size)]
    x = inputs[rank].copy()
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    expected = reduce_ref(inputs, "AVG")
    assert_same(x, expected)
    sums = np.stack(inputs).astype(np.int64).sum(axis=0)
    if size > 1 and shift:  # self-check: the data really has negative non-divisible sums
        assert np.any((sums < 0) & (sums % size != 0))


@pytest.mark.parametrize("factor", [2.0, 0.5, -1.0, 3, np.array([0.5]), np.float32(4.0)],
                         ids=["2.0", "0.5", "-1.0", "int3", "array0.5", "f32-4.0"])
@pytest.mark.parametrize("dt", FLOAT_DTYPES + COMPLEX_DTYPES, ids=dtype_id)
def test_premul_sum_factors(world, rank, size, dt, factor):
    inputs = reduce_inputs((9,), dt, "SUM", size)
    x = inputs[rank].copy()
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor))
    assert_same(x, reduce_ref(inputs, "PREMUL_SUM", factor=factor))


@pytest.mark.parametrize("dt", FLOAT_DTYPES + COMPLEX_DTYPES, ids=dtype_id)
def test_premul_sum_reduce_every_root(world, rank, size, dt):
    inputs = reduce_inputs((5,), dt, "SUM", size)
    check = Deferred()
    for root in range(size):
        x = inputs[rank].copy()
        dist.reduce(x, dst=root, op=dist._make_nccl_premul_sum(0.5))
        expected = reduce_ref(inputs, "PREMUL_SUM", factor=0.5) if rank == root else inputs[rank]
        check(f"root {root}", x, expected)
    check.verify()


@pytest.mark.parametrize("op", ["SUM", "MIN", "MAX", "BOR", "BXOR"])
def test_int64_beyond_float_precision(world, rank, size, op):
    # values above 2**53: any round trip through float64 would corrupt the low bits
    base = np.array([2**62 + 1, -(2**62) - 3, 2**53 + 1, -(2**60) + 7], dtype=np.int64)
    if op == "SUM":
        base = base // 8  # keep the sum over 4 ranks in range
    inputs = [base + r for r in range(size)]
    x = inputs[rank].copy()
    dist.all_reduce(x, op=make_op(op))
    assert_same(x, reduce_ref(inputs, op))


@pytest.mark.parametrize("op", ["SUM", "MIN", "MAX", "BAND", "BOR"])
def test_uint64_full_range(world, rank, size, op):
    top = np.iinfo(np.uint64).max
    base = np.array([top, top - 1, 2**63, 2**63 + 5, 2**53 + 1], dtype=np.uint64)
    if op == "SUM":
        inputs = [(base // np.uint64(8)) + np.uint64(r) for r in range(size)]
    else:
        inputs = [base - np.uint64(3 * r) for r in range(size)]
    x = inputs[rank].copy()
    dist.all_reduce(x, op=make_op(op))
    assert_same(x, reduce_ref(inputs, op))


@pytest.mark.parametrize("dt", INT_DTYPES, ids=dtype_id)
def test_int_sum_wraps_like_the_dtype(world, rank, size, dt):
    # the dtype's max on every rank: the sum wraps modulo 2**bits, as numpy integer math does
    inputs = [np.full(3, np.iinfo(dt).max, dtype=dt) for _ in range(size)]
    x = inputs[rank].copy()
    dist.all_reduce(x)
    assert_same(x, reduce_ref(inputs, "SUM"))


@pytest.mark.parametrize("op", ["SUM", "MAX", "BXOR"])
def test_reduce_op_instance_is_accepted(world, rank, size, op):
    """``ReduceOp(ReduceOp.X)`` instances work wherever the bare ``ReduceOp.X`` does."""
    inputs = reduce_inputs((6,), np.int32, op, size)
    x = inputs[rank].copy()
    dist.all_reduce(x, op=dist.ReduceOp(getattr(dist.ReduceOp, op)))
    assert_same(x, reduce_ref(inputs, op))


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=dtype_id)
def test_float_min_max_with_infinities(world, rank, size, dt):
    inputs = [np.array([np.inf if r == 0 else r, -np.inf if r == size - 1 else -r, 0.5 * r],
                       dtype=dt) for r in range(size)]
    check = Deferred()
    for op in ("MIN", "MAX"):
        x = inputs[rank].copy()
        dist.all_reduce(x, op=make_op(op))
        check(op, x, reduce_ref(inputs, op))
    check.verify()


# ---------------------------------------------------------------- data movement, every dtype

@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_id)
def test_broadcast_dtype(world, rank, size, dt):
    check = Deferred()
    for root in range(size):
        x = rank_data(SHAPE, dt, rank)
        dist.broadcast(x, src=root)
        check(f"root {root}", x, rank_data(SHAPE, dt, root))
    check.verify()


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_id)
def test_all_gather_dtype(world, rank, size, dt):
    outs = [empty_like_filled(SHAPE, dt) for _ in range(size)]
    dist.all_gather(outs, rank_data(SHAPE, dt, rank))
    for r in range(size):
        assert_same(outs[r], rank_data(SHAPE, dt, r))


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_id)
def test_all_gather_into_tensor_dtype(world, rank, size, dt):
    out = empty_like_filled((size * SHAPE[0],) + SHAPE[1:], dt)
    dist.all_gather_into_tensor(out, rank_data(SHAPE, dt, rank))
    assert_same(out, np.concatenate([rank_data(SHAPE, dt, r) for r in range(size)]))


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_id)
def test_gather_scatter_dtype(world, rank, size, dt):
    check = Deferred()
    for root in range(size):
        glist = [empty_like_filled(SHAPE, dt) for _ in range(size)] if rank == root else None
        dist.gather(rank_data(SHAPE, dt, rank), gather_list=glist, dst=root)
        if rank == root:
            for r in range(size):
                check(f"gather root {root} from {r}", glist[r], rank_data(SHAPE, dt, r))
        out = empty_like_filled(SHAPE, dt)
        slist = [rank_data(SHAPE, dt, root + 10 * k) for k in range(size)] if rank == root else None
        dist.scatter(out, scatter_list=slist, src=root)
        check(f"scatter root {root}", out, rank_data(SHAPE, dt, root + 10 * rank))
    check.verify()


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_id)
def test_all_to_all_single_dtype(world, rank, size, dt):
    inp = np.concatenate([rank_data((2, 3), dt, rank * size + p) for p in range(size)])
    out = empty_like_filled((2 * size, 3), dt)
    dist.all_to_all_single(out, inp)
    expected = np.concatenate([rank_data((2, 3), dt, p * size + rank) for p in range(size)])
    assert_same(out, expected)
