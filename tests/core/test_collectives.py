"""Semantics of every blocking collective on numpy arrays: shapes (0-d, empty, 1-d, 3-d, large),
every root, in-place outputs, non-contiguous inputs, rejected outputs, uneven all_to_all splits,
and the deprecated aliases.  Dtype/op coverage lives in test_dtypes_ops.py."""
import warnings

import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d.arrays import bfloat16_dtype
from support.reference import (ALL_DTYPES, SHAPES, Deferred, a2a_chunk, assert_same, dtype_id, empty_like_filled,
                               raises_everywhere, rank_data, reduce_inputs, reduce_ref, split_count)

pytestmark = pytest.mark.mpi

LARGE = (300, 257)  # ~77k elements: bigger than any eager-protocol threshold
ALL_SHAPES = SHAPES + [LARGE]
DTYPES = [np.dtype(np.float64), np.dtype(np.int32)]
ROOT_STYLES = ["global", "group_rank", "global_with_world_group"]


def _shape_id(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


def _root_kwargs(style, name, root):
    """src=/dst= root spelled three ways; for WORLD, global and group ranks coincide."""
    if style == "global":
        return {name: root}
    if style == "group_rank":
        return {"group_" + name: root, "group": dist.group.WORLD}
    return {name: root, "group": dist.group.WORLD}


def _readonly(a):
    a.flags.writeable = False
    return a


shapes = pytest.mark.parametrize("shape", ALL_SHAPES, ids=_shape_id)
dtypes = pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
root_styles = pytest.mark.parametrize("style", ROOT_STYLES)


# ------------------------------------------------------------------------------ broadcast

@root_styles
@shapes
@dtypes
def test_broadcast_every_root(world, rank, size, shape, dt, style):
    check, returned = Deferred(), []
    for root in range(size):
        x = rank_data(shape, dt, rank)
        returned.append(dist.broadcast(x, **_root_kwargs(style, "src", root)))
        check(f"root {root}", x, rank_data(shape, dt, root))
    check.verify()
    assert returned == [None] * size


def test_broadcast_writes_through_a_view(world, rank, size):
    check = Deferred()
    for root in range(size):
        base = np.full(12, -1.0)
        view = base[3:9]
        view[:] = rank_data((6,), np.float64, rank)
        dist.broadcast(view, src=root)
        expected = np.full(12, -1.0)
        expected[3:9] = rank_data((6,), np.float64, root)
        check(f"root {root}", base, expected)
    check.verify()


# ------------------------------------------------------------------------------ all_reduce

@pytest.mark.parametrize("op", ["SUM", "MAX"])
@shapes
@dtypes
def test_all_reduce_shapes(world, rank, size, shape, dt, op):
    inputs = reduce_inputs(shape, dt, op, size)
    x = inputs[rank].copy()
    assert dist.all_reduce(x, op=getattr(dist.ReduceOp, op)) is None
    assert_same(x, reduce_ref(inputs, op))


def test_all_reduce_default_op_is_sum_and_explicit_world_group(world, rank, size):
    inputs = reduce_inputs((5,), np.int64, "SUM", size)
    x, y = inputs[rank].copy(), inputs[rank].copy()
    dist.all_reduce(x)
    dist.all_reduce(y, dist.ReduceOp.SUM, dist.group.WORLD)
    assert_same(x, reduce_ref(inputs, "SUM"))
    assert_same(y, reduce_ref(inputs, "SUM"))


def test_all_reduce_writes_through_a_view(world, rank, size):
    base = np.zeros((4, 6), dtype=np.int64)
    base[1:3] = rank + 1
    dist.all_reduce(base[1:3])
    expected = np.zeros((4, 6), dtype=np.int64)
    expected[1:3] = size * (size + 1) // 2
    assert_same(base, expected)


def test_all_reduce_repeated_on_same_buffer(world, rank, size):
    x = np.array([rank + 1, 1], dtype=np.int64)
    for _ in range(3):
        dist.all_reduce(x)
    s = size * (size + 1) // 2
    assert_same(x, np.array([s * size**2, size**3], dtype=np.int64))


@pytest.mark.parametrize("make", [lambda: np.arange(10.0)[::2],
                                  lambda: np.arange(12.0).reshape(3, 4).T,
                                  lambda: np.arange(24.0).reshape(2, 3, 4)[:, 1:, :]],
                         ids=["strided", "transposed", "sliced-3d"])
def test_all_reduce_noncontiguous_raises(world, rank, size, make):
    x = make()
    before = x.copy()
    raises_everywhere(lambda: dist.all_reduce(x))
    assert_same(x, before)


def test_all_reduce_readonly_raises(world, rank, size):
    x = _readonly(np.arange(4.0))
    raises_everywhere(lambda: dist.all_reduce(x))
    assert_same(x, np.arange(4.0))


# ------------------------------------------------------------------------------ reduce

@root_styles
@shapes
@dtypes
def test_reduce_every_root(world, rank, size, shape, dt, style):
    inputs = reduce_inputs(shape, dt, "SUM", size)
    check, returned = Deferred(), []
    for root in range(size):
        x = inputs[rank].copy()
        returned.append(dist.reduce(x, op=dist.ReduceOp.SUM, **_root_kwargs(style, "dst", root)))
        check(f"root {root}", x, reduce_ref(inputs, "SUM") if rank == root else inputs[rank])
    check.verify()
    assert returned == [None] * size


def test_reduce_default_op_is_sum(world, rank, size):
    check = Deferred()
    t = size * (size - 1) // 2
    for root in range(size):
        x = np.array([rank, 2 * rank], dtype=np.int64)
        dist.reduce(x, root)
        check(f"root {root}", x, np.array([t, 2 * t]) if rank == root else np.array([rank, 2 * rank]))
    check.verify()


# ------------------------------------------------------------------------------ all_gather

@shapes
@dtypes
def test_all_gather(world, rank, size, shape, dt):
    outs = [empty_like_filled(shape, dt) for _ in range(size)]
    ids = [id(o) for o in outs]
    assert dist.all_gather(outs, rank_data(shape, dt, rank)) is None
    assert [id(o) for o in outs] == ids  # results written into the caller's arrays
    for r in range(size):
        assert_same(outs[r], rank_data(shape, dt, r))


def test_all_gather_noncontiguous_input(world, rank, size):
    src = rank_data((6, 8), np.float32, rank)
    outs = [np.zeros((3, 4), np.float32) for _ in range(size)]
    dist.all_gather(outs, src[::2, 1::2])
    for r in range(size):
        assert_same(outs[r], rank_data((6, 8), np.float32, r)[::2, 1::2])


def test_all_gather_noncontiguous_output_raises(world, rank, size):
    outs = [np.zeros(8)[::2] for _ in range(size)]
    raises_everywhere(lambda: dist.all_gather(outs, np.ones(4)))


def test_all_gather_readonly_output_raises(world, rank, size):
    outs = [_readonly(np.zeros(4)) for _ in range(size)]
    raises_everywhere(lambda: dist.all_gather(outs, np.ones(4)))


# ------------------------------------------------------------------------------ all_gather_into_tensor

def _gathered_shapes(shape, size):
    """Output layouts accepted for gathering ``shape`` from ``size`` ranks."""
    numel = int(np.prod(shape, dtype=np.int64))
    layouts = {"stacked": (size,) + shape, "flat": (size * numel,)}
    if shape:
        layouts["concat"] = (size * shape[0],) + shape[1:]
    return layouts


@pytest.mark.parametrize("layout", ["concat", "stacked", "flat"])
@shapes
@dtypes
def test_all_gather_into_tensor(world, rank, size, shape, dt, layout):
    out_shape = _gathered_shapes(shape, size).get(layout)
    if out_shape is None:
        pytest.skip("a 0-d input has no dim 0 to concatenate along")
    out = empty_like_filled(out_shape, dt)
    assert dist.all_gather_into_tensor(out, rank_data(shape, dt, rank)) is None
    expected = np.stack([rank_data(shape, dt, r) for r in range(size)]).reshape(out_shape)
    assert_same(out, expected)


def test_all_gather_into_tensor_noncontiguous_input(world, rank, size):
    src = rank_data((4, 10), np.int32, rank)
    out = np.zeros((4 * size, 5), np.int32)
    dist.all_gather_into_tensor(out, src[:, ::2])
    assert_same(out, np.concatenate([rank_data((4, 10), np.int32, r)[:, ::2]
                                     for r in range(size)]))


@pytest.mark.parametrize("bad", ["noncontiguous", "readonly"])
def test_all_gather_into_tensor_bad_output_raises(world, rank, size, bad):
    out = np.zeros(4 * size)[::2] if bad == "noncontiguous" else _readonly(np.zeros(2 * size))
    raises_everywhere(lambda: dist.all_gather_into_tensor(out, np.ones(2)))


# ------------------------------------------------------------------------------ gather

@root_styles
@shapes
@dtypes
def test_gather_every_root(world, rank, size, shape, dt, style):
    check, returned = Deferred(), []
    for root in range(size):
        glist = [empty_like_filled(shape, dt) for _ in range(size)] if rank == root else None
        ids = [id(g) for g in glist] if glist else None
        returned.append(dist.gather(rank_data(shape, dt, rank), gather_list=glist,
                                    **_root_kwargs(style, "dst", root)))
        if rank == root:
            returned.append([id(g) for g in glist] == ids or "gather_list rebound")
            for r in range(size):
                check(f"root {root} from {r}", glist[r], rank_data(shape, dt, r))
    check.verify()
    assert all(v in (None, True) for v in returned), returned


def test_gather_default_dst_is_rank_0(world, rank, size):
    glist = [np.zeros(3) for _ in range(size)] if rank == 0 else None
    dist.gather(np.full(3, float(rank)), glist)
    if rank == 0:
        for r in range(size):
            assert_same(glist[r], np.full(3, float(r)))


def test_gather_noncontiguous_input(world, rank, size):
    check = Deferred()
    for root in range(size):
        src = rank_data((5, 4), np.float64, rank)
        glist = [np.zeros(5) for _ in range(size)] if rank == root else None
        dist.gather(src[:, 2], glist, dst=root)
        if rank == root:
            for r in range(size):
                check(f"root {root} from {r}", glist[r], rank_data((5, 4), np.float64, r)[:, 2])
    check.verify()


@pytest.mark.parametrize("layout", ["flat", "stacked"])
@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dtype_id)
def test_gather_single_every_root(world, rank, size, dt, layout):
    """torch 2.14's gather_single: every rank's tensor, in rank order, into one array on the root
    (its element count is what must match: flat or stacked)."""
    check = Deferred()
    for root in range(size):
        shape = (size * 6,) if layout == "flat" else (size, 2, 3)
        out = empty_like_filled(shape, dt) if rank == root else None
        assert dist.gather_single(rank_data((2, 3), dt, rank), out, dst=root) is None
        if rank == root:
            check(f"root {root}", out.reshape(size, 2, 3), np.stack([rank_data((2, 3), dt, r) for r in range(size)]))
    check.verify()


def test_gather_into_tensor_is_gather_single_deprecated(world, rank, size):
    out = np.zeros(size * 2) if rank == 0 else None
    with pytest.warns(FutureWarning, match="gather_single"):
        dist.gather_into_tensor(np.full(2, float(rank)), out)
    if rank == 0:
        assert_same(out, np.repeat(np.arange(size, dtype=np.float64), 2))


@pytest.mark.parametrize("bad", ["too small", "missing", "noncontiguous"])
def test_gather_single_bad_output_raises_on_every_rank(world, rank, size, bad):
    """Every rank names itself the root, so each has the bad output and raises before sending."""
    out = {"too small": np.zeros(size * 2 - 1), "missing": None, "noncontiguous": np.zeros(size * 4)[::2]}[bad]
    raises_everywhere(lambda: dist.gather_single(np.ones(2), out, dst=rank))


# ------------------------------------------------------------------------------ scatter

@root_styles
@shapes
@dtypes
def test_scatter_every_root(world, rank, size, shape, dt, style):
    check, returned = Deferred(), []
    for root in range(size):
        slist = ([rank_data(shape, dt, 5 * root + k) for k in range(size)]
                 if rank == root else None)
        out = empty_like_filled(shape, dt)
        returned.append(dist.scatter(out, scatter_list=slist, **_root_kwargs(style, "src", root)))
        check(f"root {root}", out, rank_data(shape, dt, 5 * root + rank))
    check.verify()
    assert returned == [None] * size


def test_scatter_default_src_is_rank_0(world, rank, size):
    slist = [np.full(2, 10.0 + k) for k in range(size)] if rank == 0 else None
    out = np.zeros(2)
    dist.scatter(out, slist)
    assert_same(out, np.full(2, 10.0 + rank))


def test_scatter_noncontiguous_inputs(world, rank, size):
    check = Deferred()
    for root in range(size):
        big = rank_data((size, 8), np.int64, root)
        slist = [big[k, ::2] for k in range(size)] if rank == root else None
        out = np.zeros(4, np.int64)
        dist.scatter(out, slist, src=root)
        check(f"root {root}", out, rank_data((size, 8), np.int64, root)[rank, ::2])
    check.verify()


def test_scatter_readonly_output_raises(world, rank, size):
    slist = [np.ones(2) for _ in range(size)] if rank == 0 else None
    raises_everywhere(lambda: dist.scatter(_readonly(np.zeros(2)), slist, src=0))


# ------------------------------------------------------------------------------ reduce_scatter

@shapes
@dtypes
def test_reduce_scatter(world, rank, size, shape, dt):
    inputs = reduce_inputs((size,) + shape, dt, "SUM", size)
    out = empty_like_filled(shape, dt)
    assert dist.reduce_scatter(out, [inputs[rank][k] for k in range(size)]) is None
    assert_same(out, reduce_ref(inputs, "SUM")[rank])


def test_reduce_scatter_noncontiguous_inputs(world, rank, size):
    inputs = reduce_inputs((size, 6), np.float32, "SUM", size)
    wide = np.zeros((size, 12), np.float32)
    wide[:, ::2] = inputs[rank]
    out = np.zeros(6, np.float32)
    dist.reduce_scatter(out, [wide[k, ::2] for k in range(size)], op=dist.ReduceOp.SUM)
    assert_same(out, reduce_ref(inputs, "SUM")[rank])


@pytest.mark.parametrize("layout", ["concat", "stacked", "flat"])
@shapes
@dtypes
def test_reduce_scatter_tensor(world, rank, size, shape, dt, layout):
    in_shape = _gathered_shapes(shape, size).get(layout)
    if in_shape is None:
        pytest.skip("a 0-d output has no dim 0 to concatenate along")
    inputs = reduce_inputs((size,) + shape, dt, "MAX", size)
    out = empty_like_filled(shape, dt)
    inp = inputs[rank].reshape(in_shape)
    assert dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX) is None
    assert_same(out, reduce_ref(inputs, "MAX")[rank])


def test_reduce_scatter_tensor_noncontiguous_input(world, rank, size):
    inputs = reduce_inputs((size, 3), np.int64, "SUM", size)
    wide = np.zeros((size, 3, 2), np.int64)
    wide[:, :, 1] = inputs[rank]
    out = np.zeros(3, np.int64)
    dist.reduce_scatter_tensor(out, wide[:, :, 1])
    assert_same(out, reduce_ref(inputs, "SUM")[rank])


@pytest.mark.parametrize("bad", ["noncontiguous", "readonly"])
def test_reduce_scatter_tensor_bad_output_raises(world, rank, size, bad):
    out = np.zeros(4)[::2] if bad == "noncontiguous" else _readonly(np.zeros(2))
    raises_everywhere(lambda: dist.reduce_scatter_tensor(out, np.ones(2 * size)))


# ------------------------------------------------------------------------------ all_to_all

@pytest.mark.parametrize("tail", [(), (3,), (2, 2)], ids=["1d", "2d", "3d"])
@dtypes
def test_all_to_all_uneven(world, rank, size, dt, tail):
    inp = [a2a_chunk(rank, p, dt, split_count(rank, p), tail) for p in range(size)]
    out = [empty_like_filled((split_count(p, rank),) + tail, dt) for p in range(size)]
    ids = [id(o) for o in out]
    assert dist.all_to_all(out, inp) is None
    assert [id(o) for o in out] == ids
    for p in range(size):
        assert_same(out[p], a2a_chunk(p, rank, dt, split_count(p, rank), tail))


def test_all_to_all_scalars_and_noncontiguous_inputs(world, rank, size):
    big = np.arange(4 * size, dtype=np.float64) + 100 * rank
    inp = [big[p * 4:(p + 1) * 4:2] for p in range(size)]  # strided views
    out = [np.zeros(2) for _ in range(size)]
    dist.all_to_all(out, inp)
    out0 = [np.array(0, np.int64) for _ in range(size)]
    dist.all_to_all(out0, [np.array(10 * rank + p, np.int64) for p in range(size)])
    for p in range(size):
        peer = np.arange(4 * size, dtype=np.float64) + 100 * p
        assert_same(out[p], peer[rank * 4:(rank + 1) * 4:2])
        assert_same(out0[p], np.array(10 * p + rank, np.int64))


def test_all_to_all_lists_that_share_memory(world, rank, size):
    """Blocks are read and written where they lie unless outputs overlap inputs or each other;
    then every input is read before any output is written, as if staged (the same list as input
    and output; outputs shifted half a block over the inputs' array)."""
    blocks = [np.full(3, 10 * rank + p, np.float64) for p in range(size)]
    dist.all_to_all(blocks, blocks)
    whole = np.arange(4 * size + 2, dtype=np.int64) + 100 * rank
    inps = [whole[4 * p:4 * p + 4] for p in range(size)]
    outs = [whole[4 * p + 2:4 * p + 6] for p in range(size)]
    dist.all_to_all(outs, inps)
    for p in range(size):
        assert_same(blocks[p], np.full(3, 10 * p + rank, np.float64))
        assert_same(outs[p], (np.arange(4 * size + 2, dtype=np.int64) + 100 * p)[4 * rank:4 * rank + 4])


def test_all_to_all_lists_where_ranks_take_different_ways(world, rank, size):
    """Rank 0 passes one list as input and output (staged), the others separate blocks (taken
    where they lie), 40 KB each: every rank still calls the same MPI collective."""
    blocks = [np.full(5000, 100.0 * rank + p) for p in range(size)]
    outs = blocks if rank == 0 else [np.zeros(5000) for _ in range(size)]
    dist.all_to_all(outs, blocks)
    for p in range(size):
        assert_same(outs[p], np.full(5000, 100.0 * p + rank))


def test_which_all_to_all_blocks_may_be_handed_to_mpi_as_they_lie():
    """A written block must overlap neither another written block nor a read one; read blocks may
    overlap each other; empty blocks never count."""
    from hpc_c10d.mpi.scattered import address, apart

    whole = np.zeros(16)

    def may(reads, writes):
        return apart(reads, [address(b) for b in reads], writes, [address(b) for b in writes])

    assert may([whole[0:4], whole[4:8]], [whole[8:12], whole[12:16]])
    assert may([whole[0:4], whole[2:6]], [whole[8:12]])
    assert not may([whole[0:4]], [whole[3:7]])
    assert not may([whole[3:7]], [whole[0:4]])
    assert not may([whole[8:12]], [whole[0:4], whole[2:6]])
    assert not may([whole[4:8]], [whole[0:16]])
    assert may([whole[4:4]], [whole[0:16]])


# ------------------------------------------------------------------------------ all_to_all_single

@pytest.mark.parametrize("tail", [(), (3, 2)], ids=["1d", "3d"])
@dtypes
def test_all_to_all_single_even(world, rank, size, dt, tail):
    rows = 2
    inp = np.concatenate([a2a_chunk(rank, p, dt, rows, tail) for p in range(size)])
    out = empty_like_filled((rows * size,) + tail, dt)
    assert dist.all_to_all_single(out, inp) is None
    assert_same(out, np.concatenate([a2a_chunk(p, rank, dt, rows, tail) for p in range(size)]))


@pytest.mark.parametrize("tail", [(), (3,), (3, 2)], ids=["1d", "2d", "3d"])
@dtypes
def test_all_to_all_single_uneven(world, rank, size, dt, tail):
    in_splits = [split_count(rank, p) for p in range(size)]
    out_splits = [split_count(p, rank) for p in range(size)]
    inp = np.concatenate([a2a_chunk(rank, p, dt, in_splits[p], tail) for p in range(size)])
    out = empty_like_filled((sum(out_splits),) + tail, dt)
    assert dist.all_to_all_single(out, inp, out_splits, in_splits) is None
    expected = np.concatenate([a2a_chunk(p, rank, dt, out_splits[p], tail) for p in range(size)])
    assert_same(out, expected)


def test_all_to_all_single_uneven_keywords_and_large(world, rank, size):
    # thousands of rows per peer, passed by keyword
    def rows(src, dst):
        return 1000 * split_count(src, dst) + 7

    in_splits = [rows(rank, p) for p in range(size)]
    out_splits = [rows(p, rank) for p in range(size)]
    inp = np.concatenate([a2a_chunk(rank, p, np.int32, in_splits[p], (5,)) for p in range(size)])
    out = np.zeros((sum(out_splits), 5), np.int32)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits,
                           input_split_sizes=in_splits, group=dist.group.WORLD)
    expected = np.concatenate([a2a_chunk(p, rank, np.int32, out_splits[p], (5,))
                               for p in range(size)])
    assert_same(out, expected)


def test_all_to_all_single_noncontiguous_input(world, rank, size):
    inp_full = np.concatenate([a2a_chunk(rank, p, np.float64, 2, (6,)) for p in range(size)])
    out = np.zeros((2 * size, 3))
    dist.all_to_all_single(out, inp_full[:, ::2])
    assert_same(out, np.concatenate([a2a_chunk(p, rank, np.float64, 2, (6,))[:, ::2]
                                     for p in range(size)]))


@pytest.mark.parametrize("bad", ["noncontiguous", "readonly"])
def test_all_to_all_single_bad_output_raises(world, rank, size, bad):
    out = np.zeros(4 * size)[::2] if bad == "noncontiguous" else _readonly(np.zeros(2 * size))
    raises_everywhere(lambda: dist.all_to_all_single(out, np.ones(2 * size)))


# ------------------------------------------------------------------------------ buffer flavours

def test_readonly_and_reversed_inputs_are_fine(world, rank, size):
    """Arrays that are only read may be read-only or have negative strides."""
    def ro(a):
        return _readonly(np.ascontiguousarray(a))

    mine = rank_data((6,), np.int64, rank)
    outs = [np.zeros(6, np.int64) for _ in range(size)]
    dist.all_gather(outs, ro(mine))
    rev = [np.zeros(6, np.int64) for _ in range(size)]
    dist.all_gather(rev, mine[::-1])
    cat = np.zeros(6 * size, np.int64)
    dist.all_gather_into_tensor(cat, ro(mine))
    rs = np.zeros(2, np.int64)
    rs_inputs = reduce_inputs((2 * size,), np.int64, "SUM", size)
    dist.reduce_scatter_tensor(rs, ro(rs_inputs[rank]))
    a2a = np.zeros(2 * size, np.int64)
    dist.all_to_all_single(a2a, ro(np.concatenate([a2a_chunk(rank, p, np.int64, 2)
                                                   for p in range(size)])))
    sc = np.zeros(3, np.int64)
    dist.scatter(sc, [ro(rank_data((3,), np.int64, k)) for k in range(size)] if rank == 0
                 else None, src=0)
    for r in range(size):
        assert_same(outs[r], rank_data((6,), np.int64, r))
        assert_same(rev[r], rank_data((6,), np.int64, r)[::-1])
    assert_same(cat, np.concatenate([rank_data((6,), np.int64, r) for r in range(size)]))
    assert_same(rs, reduce_ref(rs_inputs, "SUM")[2 * rank:2 * rank + 2])
    assert_same(a2a, np.concatenate([a2a_chunk(p, rank, np.int64, 2) for p in range(size)]))
    assert_same(sc, rank_data((3,), np.int64, rank))


def test_all_gather_into_tensor_in_place(world, rank, size):
    """The input is this rank's own slice of the output (the FSDP/ZeRO in-place pattern,
    which torch's backends accept)."""
    out = np.zeros((size, 5), np.float32)
    out[rank] = rank_data((5,), np.float32, rank)
    dist.all_gather_into_tensor(out, out[rank])
    assert_same(out, np.stack([rank_data((5,), np.float32, r) for r in range(size)]))


def test_positional_arguments_follow_torch_signatures(world, rank, size):
    """Every argument passed positionally, in torch.distributed's order."""
    w = dist.group.WORLD
    root = size - 1
    inputs = reduce_inputs((4,), np.int64, "MAX", size)
    ar = inputs[rank].copy()
    dist.all_reduce(ar, dist.ReduceOp.MAX, w, False)
    bc = rank_data((4,), np.int64, rank)
    dist.broadcast(bc, root, w, False)
    rd = inputs[rank].copy()
    dist.reduce(rd, root, dist.ReduceOp.MAX, w, False)
    ag = [np.zeros(4, np.int64) for _ in range(size)]
    dist.all_gather(ag, rank_data((4,), np.int64, rank), w, False)
    gl = [np.zeros(4, np.int64) for _ in range(size)] if rank == root else None
    dist.gather(rank_data((4,), np.int64, rank), gl, root, w, False)
    sc = np.zeros(4, np.int64)
    dist.scatter(sc, [rank_data((4,), np.int64, k) for k in range(size)] if rank == root
                 else None, root, w, False)
    rs = np.zeros(4, np.int64)
    rs_in = reduce_inputs((size, 4), np.int64, "SUM", size)
    dist.reduce_scatter(rs, list(rs_in[rank]), dist.ReduceOp.SUM, w, False)
    ins = [split_count(rank, p) for p in range(size)]
    outs = [split_count(p, rank) for p in range(size)]
    a2a = np.zeros(sum(outs), np.int64)
    dist.all_to_all_single(a2a, np.concatenate([a2a_chunk(rank, p, np.int64, ins[p])
                                                for p in range(size)]), outs, ins, w, False)
    work = dist.all_reduce(np.zeros(1), dist.ReduceOp.SUM, w, True)  # async_op positionally
    work.wait()
    assert_same(ar, reduce_ref(inputs, "MAX"))
    assert_same(bc, rank_data((4,), np.int64, root))
    assert_same(rd, reduce_ref(inputs, "MAX") if rank == root else inputs[rank])
    for r in range(size):
        assert_same(ag[r], rank_data((4,), np.int64, r))
        if rank == root:
            assert_same(gl[r], rank_data((4,), np.int64, r))
    assert_same(sc, rank_data((4,), np.int64, rank))
    assert_same(rs, reduce_ref(rs_in, "SUM")[rank])
    assert_same(a2a, np.concatenate([a2a_chunk(p, rank, np.int64, outs[p]) for p in range(size)]))


def test_reduce_scatter_tensor_output_aliases_input(world, rank, size):
    """The output is this rank's own chunk of the input."""
    inputs = reduce_inputs((size, 5), np.float64, "SUM", size)
    buf = inputs[rank].copy()
    dist.reduce_scatter_tensor(buf[rank], buf)
    assert_same(buf[rank], reduce_ref(inputs, "SUM")[rank])


# ------------------------------------------------------------------------------ barrier

def test_barrier(world, rank, size):
    assert dist.barrier() is None
    assert dist.barrier(group=dist.group.WORLD) is None
    x = np.array([float(rank)])
    dist.all_reduce(x)
    assert dist.barrier() is None
    assert_same(x, np.array([size * (size - 1) / 2]))


# ------------------------------------------------------------------------------ deprecated aliases

def _deprecation_warned():
    return pytest.warns((FutureWarning, DeprecationWarning))


def test_all_reduce_coalesced(world, rank, size):
    a_in = reduce_inputs((5,), np.float32, "SUM", size)
    b_in = reduce_inputs((2, 3), np.float32, "SUM", size)
    a, b = a_in[rank].copy(), b_in[rank].copy()
    with _deprecation_warned():
        dist.all_reduce_coalesced([a, b], op=dist.ReduceOp.SUM)
    assert_same(a, reduce_ref(a_in, "SUM"))
    assert_same(b, reduce_ref(b_in, "SUM"))


def test_all_gather_coalesced(world, rank, size):
    shapes_ = [(3,), (2, 2), ()]
    inputs = [rank_data(s, np.int64, rank) for s in shapes_]
    outputs = [[np.zeros(s, np.int64) for s in shapes_] for _ in range(size)]
    with _deprecation_warned():
        dist.all_gather_coalesced(outputs, inputs)
    for r in range(size):
        for j, s in enumerate(shapes_):
            assert_same(outputs[r][j], rank_data(s, np.int64, r))


def test_process_group_allgather_coalesced_takes_one_list_per_rank(world, rank, size):
    """The torch-style method on a group: output_lists[rank][tensor], and a clear error for
    lists of another shape, before anything is sent."""
    inputs = [np.full(2, 10 * j + rank, np.int64) for j in range(size)]
    outputs = [[np.zeros(2, np.int64) for _ in inputs] for _ in range(size)]
    world.allgather_coalesced(outputs, inputs).wait()
    for r in range(size):
        for j in range(size):
            assert_same(outputs[r][j], np.full(2, 10 * j + r, np.int64))
    with pytest.raises(ValueError, match="one list per rank"):
        world.allgather_coalesced(outputs[:1] + outputs, inputs)
    with pytest.raises(ValueError, match="one tensor per input"):
        world.allgather_coalesced([outs + outs for outs in outputs], inputs)


def test_all_gather_base(world, rank, size):
    out = np.zeros((2 * size, 3))
    with _deprecation_warned():
        dist._all_gather_base(out, rank_data((2, 3), np.float64, rank))
    assert_same(out, np.concatenate([rank_data((2, 3), np.float64, r) for r in range(size)]))


def test_reduce_scatter_base(world, rank, size):
    inputs = reduce_inputs((2 * size, 3), np.int16, "SUM", size)
    out = np.zeros((2, 3), np.int16)
    with _deprecation_warned():
        dist._reduce_scatter_base(out, inputs[rank].copy(), op=dist.ReduceOp.SUM)
    assert_same(out, reduce_ref(inputs, "SUM")[2 * rank:2 * rank + 2])


def test_deprecated_aliases_without_warning_checks(world, rank, size):
    """The aliases keep working when the warnings are filtered away entirely."""
    x = np.array([rank + 1.0])
    out = np.zeros(size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced([x])
        dist._all_gather_base(out, np.array([float(rank)]))
    assert_same(x, np.array([size * (size + 1) / 2]))
    assert_same(out, np.arange(size, dtype=np.float64))


def test_broadcast_source_may_be_read_only(world, rank, size):
    """The source only reads its array, so a read-only one must work (not raise on one rank)."""
    for src in range(size):
        x = rank_data((5,), np.float64, src) if rank == src else np.zeros(5)
        if rank == src:
            x = _readonly(x)
        dist.broadcast(x, src=src)
        assert_same(x, rank_data((5,), np.float64, src))


# ------------------------------------------------------------------------------ lists that are views of one buffer

SPAN = 40_000  # float64 elements per block: above the size where the transport writes blocks in place


@pytest.mark.parametrize("async_op", [False, True])
def test_list_collectives_on_back_to_back_views(world, rank, size, async_op):
    """``list(buffer.reshape(size, -1))`` blocks are received into and sent from in place; the results
    are those of separate arrays, blocking or not, and no other memory is touched."""
    def blocks():
        whole = np.full((size + 2) * SPAN, -7.0)  # a guard block before and after the views
        return whole, list(whole[SPAN:-SPAN].reshape(size, SPAN))

    def done(work):
        return work.wait() if async_op else None

    mine = rank_data((SPAN,), np.float64, rank)
    every = [rank_data((SPAN,), np.float64, r) for r in range(size)]
    whole, outs = blocks()
    done(dist.all_gather(outs, mine, async_op=async_op))
    for r in range(size):
        assert_same(outs[r], every[r])
    whole_g, gathered = blocks()
    done(dist.gather(mine, gathered if rank == 0 else None, dst=0, async_op=async_op))
    source_whole, source = blocks()
    for r in range(size):
        source[r][...] = every[r] + 1
    out = np.zeros(SPAN)
    done(dist.scatter(out, source if rank == 0 else None, src=0, async_op=async_op))
    assert_same(out, every[rank] + 1)
    a2a_whole, a2a_out = blocks()
    done(dist.all_to_all(a2a_out, [every[rank] + 10 * p for p in range(size)], async_op=async_op))
    for p in range(size):
        assert_same(a2a_out[p], every[p] + 10 * rank)
    rs_whole, rs_in = blocks()
    for p in range(size):
        rs_in[p][...] = every[rank] * (p + 1)
    rs_out = np.zeros(SPAN)
    done(dist.reduce_scatter(rs_out, rs_in, async_op=async_op))
    assert_same(rs_out, sum(every) * (rank + 1))
    if rank == 0:
        for r in range(size):
            assert_same(gathered[r], every[r])
    guards = [w[:SPAN] for w in (whole, whole_g, source_whole, a2a_whole, rs_whole)]
    guards += [w[-SPAN:] for w in (whole, whole_g, source_whole, a2a_whole, rs_whole)]
    assert all((g == -7.0).all() for g in guards)


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_from_separately_allocated_large_blocks(world, rank, size, async_op):
    """Blocks allocated one by one, 40 KB each: copied into a kept buffer (the second call reuses
    it), reduced, and for AVG divided afterwards."""
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.SUM):
        inputs = [np.full(5000, float((rank + 1) * (p + 1))) for p in range(size)]
        out = np.zeros(5000)
        work = dist.reduce_scatter(out, inputs, op=op, async_op=async_op)
        if async_op:
            work.wait()
        total = (rank + 1) * size * (size + 1) / 2
        assert_same(out, np.full(5000, total / size if op == dist.ReduceOp.AVG else total))


def test_all_gather_list_whose_input_is_one_of_its_blocks(world, rank, size):
    """In place (the input is this rank's own block): MPI forbids aliasing, so it is staged."""
    whole = np.zeros(size * SPAN)
    outs = list(whole.reshape(size, SPAN))
    outs[rank][...] = rank_data((SPAN,), np.float64, rank)
    dist.all_gather(outs, outs[rank])
    for r in range(size):
        assert_same(outs[r], rank_data((SPAN,), np.float64, r))


def test_gather_and_scatter_whose_root_block_is_its_own_array(world, rank, size):
    """The root's input (gather) or output (scatter) is its own block of the list: in place."""
    for root in range(size):
        whole = np.zeros(size * SPAN)
        blocks = list(whole.reshape(size, SPAN)) if rank == root else None
        mine = blocks[root] if rank == root else np.empty(SPAN)
        mine[...] = rank_data((SPAN,), np.float64, rank)
        dist.gather(mine, blocks, dst=root)
        if rank == root:
            for r in range(size):
                assert_same(blocks[r], rank_data((SPAN,), np.float64, r))
        sources = [rank_data((SPAN,), np.float64, 10 + r) for r in range(size)] if rank == root else None
        out = sources[root] if rank == root else np.zeros(SPAN)
        dist.scatter(out, sources, src=root)
        assert_same(out, rank_data((SPAN,), np.float64, 10 + rank))


def test_list_collectives_whose_array_overlaps_another_ranks_block(world, rank, size):
    """An input that straddles two blocks of the output list cannot be handed to MPI as it is: staged."""
    if size < 2:
        pytest.skip("needs two blocks")
    whole = np.zeros(size * SPAN)
    outs = list(whole.reshape(size, SPAN))
    straddling = whole[SPAN // 2:SPAN // 2 + SPAN]
    straddling[...] = rank_data((SPAN,), np.float64, rank)
    dist.all_gather(outs, straddling)  # what every rank's input held before any block was written
    for r in range(size):
        assert_same(outs[r], rank_data((SPAN,), np.float64, r))


@pytest.mark.parametrize("async_op", [False, True])
def test_list_collectives_into_separately_allocated_blocks(world, rank, size, async_op):
    """The torch tutorial's lists, blocks allocated one by one, every dtype's carrier included."""
    for dt in (np.float32, np.int64, bfloat16_dtype()):
        outs = [np.full(5, -1, dt) for _ in range(size)]
        work = dist.all_gather(outs, rank_data((5,), dt, rank), async_op=async_op)
        if async_op:
            work.wait()
        for r in range(size):
            assert_same(outs[r], rank_data((5,), dt, r))
        blocks = [np.full(5, -1, dt) for _ in range(size)] if rank == 0 else None
        work = dist.gather(rank_data((5,), dt, rank), blocks, dst=0, async_op=async_op)
        if async_op:
            work.wait()
        if rank == 0:
            for r in range(size):
                assert_same(blocks[r], rank_data((5,), dt, r))
        sources = [rank_data((5,), dt, 20 + r) for r in range(size)] if rank == 0 else None
        out = np.full(5, -1, dt)
        work = dist.scatter(out, sources, src=0, async_op=async_op)
        if async_op:
            work.wait()
        assert_same(out, rank_data((5,), dt, 20 + rank))


@pytest.mark.parametrize("async_op", [False, True])
def test_small_list_collectives_in_flight_together_into_blocks_of_other_shapes(world, rank, size, async_op):
    """Small list collectives go through kept staging buffers: several in flight at once each have
    their own, and a block may have another shape than the input and its neighbours (same size)."""
    shapes = [(16,), (4, 4), (2, 4, 2)]
    gathered = [[np.full(shapes[(r + k) % 3], -1.0) for r in range(size)] for k in range(3)]
    collected = [[np.full(shapes[(r + k + 1) % 3], -1.0) for r in range(size)] if rank == 0 else None
                 for k in range(3)]
    scattered = [np.full(shapes[k], -1.0) for k in range(3)]
    works = []
    for k in range(3):
        works.append(dist.all_gather(gathered[k], rank_data((16,), np.float64, rank + 4 * k), async_op=async_op))
        works.append(dist.gather(rank_data((4, 4), np.float64, rank + 4 * k), collected[k], dst=0,
                                 async_op=async_op))
        sources = [rank_data(shapes[(r + k) % 3], np.float64, r + 4 * k) for r in range(size)]
        works.append(dist.scatter(scattered[k], sources if rank == 0 else None, src=0, async_op=async_op))
    for work in reversed(works):
        if async_op:
            work.wait()
    for k in range(3):
        for r in range(size):
            assert_same(gathered[k][r].reshape(-1), rank_data((16,), np.float64, r + 4 * k))
            if rank == 0:
                assert_same(collected[k][r].reshape(-1), rank_data((16,), np.float64, r + 4 * k))
        assert_same(scattered[k].reshape(-1), rank_data((16,), np.float64, rank + 4 * k).reshape(-1))
