"""async_op=True: the Work handle API, Future values, and many outstanding operations
completed in arbitrary (but rank-consistent) order."""
import gc
import random
import time

import numpy as np
import pytest

import hpc_c10d as dist
from support.reference import (BFLOAT16, Deferred, a2a_chunk, assert_same, empty_like_filled, make_op,
                               raises_everywhere, rank_data, reduce_inputs, reduce_ref, split_count)

pytestmark = pytest.mark.mpi

F32 = np.dtype(np.float32)


# Each case builds its buffers and returns (start, outputs, expected, future_outputs):
#   start()         launches the collective with async_op=True and returns the Work,
#   outputs         the arrays this rank's results land in, expected their reference values,
#   future_outputs  the arrays Work.get_future().wait() must hand back, or None where the
#                   structure of the future's value is not pinned down (list-of-list outputs).

def _all_reduce(rank, size):
    inputs = reduce_inputs((6,), F32, "SUM", size)
    x = inputs[rank].copy()
    return (lambda: dist.all_reduce(x, async_op=True)), [x], [reduce_ref(inputs, "SUM")], [x]


def _broadcast(rank, size):
    root = size - 1
    x = rank_data((5,), F32, rank)
    return (lambda: dist.broadcast(x, src=root, async_op=True)), [x], \
        [rank_data((5,), F32, root)], [x]


def _reduce(rank, size):
    root = size // 2
    inputs = reduce_inputs((4,), np.int64, "MAX", size)
    x = inputs[rank].copy()
    exp = reduce_ref(inputs, "MAX") if rank == root else inputs[rank]
    return (lambda: dist.reduce(x, dst=root, op=dist.ReduceOp.MAX, async_op=True)), [x], \
        [exp], [x]


def _all_gather(rank, size):
    outs = [np.zeros(3, F32) for _ in range(size)]
    return (lambda: dist.all_gather(outs, rank_data((3,), F32, rank), async_op=True)), outs, \
        [rank_data((3,), F32, r) for r in range(size)], None


def _all_gather_into_tensor(rank, size):
    out = np.zeros((size, 2, 2), np.int32)
    return (lambda: dist.all_gather_into_tensor(out, rank_data((2, 2), np.int32, rank),
                                                async_op=True)), [out], \
        [np.stack([rank_data((2, 2), np.int32, r) for r in range(size)])], [out]


def _gather(rank, size):
    root = 0
    glist = [np.zeros(3) for _ in range(size)] if rank == root else None
    expected = [rank_data((3,), np.float64, r) for r in range(size)] if rank == root else []
    return (lambda: dist.gather(rank_data((3,), np.float64, rank), glist, dst=root,
                                async_op=True)), (glist or []), expected, None


def _scatter(rank, size):
    root = size - 1
    slist = [rank_data((4,), np.int16, 3 * k) for k in range(size)] if rank == root else None
    out = np.zeros(4, np.int16)
    return (lambda: dist.scatter(out, slist, src=root, async_op=True)), [out], \
        [rank_data((4,), np.int16, 3 * rank)], [out]


def _reduce_scatter(rank, size):
    inputs = reduce_inputs((size, 3), np.float64, "SUM", size)
    out = np.zeros(3)
    return (lambda: dist.reduce_scatter(out, list(inputs[rank].copy()), async_op=True)), \
        [out], [reduce_ref(inputs, "SUM")[rank]], None


def _reduce_scatter_tensor(rank, size):
    inputs = reduce_inputs((size, 3), np.int32, "SUM", size)
    out = np.zeros(3, np.int32)
    return (lambda: dist.reduce_scatter_tensor(out, inputs[rank].copy(), async_op=True)), \
        [out], [reduce_ref(inputs, "SUM")[rank]], [out]


def _all_to_all(rank, size):
    inp = [a2a_chunk(rank, p, F32, split_count(rank, p)) for p in range(size)]
    out = [np.zeros(split_count(p, rank), F32) for p in range(size)]
    return (lambda: dist.all_to_all(out, inp, async_op=True)), out, \
        [a2a_chunk(p, rank, F32, split_count(p, rank)) for p in range(size)], None


def _all_to_all_single(rank, size):
    ins = [split_count(rank, p) for p in range(size)]
    outs = [split_count(p, rank) for p in range(size)]
    inp = np.concatenate([a2a_chunk(rank, p, np.int64, ins[p], (2,)) for p in range(size)])
    out = np.zeros((sum(outs), 2), np.int64)
    exp = np.concatenate([a2a_chunk(p, rank, np.int64, outs[p], (2,)) for p in range(size)])
    return (lambda: dist.all_to_all_single(out, inp, outs, ins, async_op=True)), [out], \
        [exp], [out]


def _barrier(rank, size):
    return (lambda: dist.barrier(async_op=True)), [], [], None


CASES = {f.__name__.lstrip("_"): f for f in (
    _all_reduce, _broadcast, _reduce, _all_gather, _all_gather_into_tensor, _gather, _scatter,
    _reduce_scatter, _reduce_scatter_tensor, _all_to_all, _all_to_all_single, _barrier)}
FUTURE_CASES = [n for n in CASES if CASES[n](0, 1)[3] is not None]


def _check(outputs, expected):
    assert len(outputs) == len(expected)
    for o, e in zip(outputs, expected):
        assert_same(o, e)


@pytest.mark.parametrize("name", list(CASES))
def test_work_handle(world, rank, size, name):
    start, outputs, expected, _ = CASES[name](rank, size)
    work = start()
    assert work is not None
    work.wait()
    assert work.is_completed()
    assert work.is_success()
    assert work.exception() is None
    _check(outputs, expected)
    work.wait()  # waiting again is harmless
    _check(outputs, expected)


@pytest.mark.parametrize("name", FUTURE_CASES)
def test_future_value_is_the_output_arrays(world, rank, size, name):
    start, outputs, expected, fut_outputs = CASES[name](rank, size)
    work = start()
    value = work.get_future().wait()
    assert isinstance(value, list) and len(value) == len(fut_outputs)
    for v, o in zip(value, fut_outputs):
        assert isinstance(v, np.ndarray)
        assert np.shares_memory(v, o)  # the caller's buffer, not a copy
    _check(outputs, expected)
    result = work.result()
    assert len(result) == len(fut_outputs)
    for v, o in zip(result, fut_outputs):
        assert np.shares_memory(v, o)
        assert_same(v, o)


@pytest.mark.parametrize("name", list(CASES))
def test_poll_then_wait(world, rank, size, name):
    start, outputs, expected, _ = CASES[name](rank, size)
    work = start()
    seen = Deferred()
    if _poll(work):  # once is_completed() says so, the outputs are final, before any wait()
        for i, (o, e) in enumerate(zip(outputs, expected)):
            seen(f"output {i} when is_completed() first returned True", o, e)
    work.wait()
    assert work.is_completed()
    seen.verify()
    _check(outputs, expected)


def _poll(work, tries=20000):
    """Poll is_completed() a bounded number of times; True if it reported completion."""
    for _ in range(tries):
        if work.is_completed():
            return True
        time.sleep(0)
    return False


def _finish(work, style):
    """Complete ``work`` by wait(), by its future, or by polling is_completed() alone.
    Results must be visible at that point, including post-processing such as AVG's division."""
    if style == "wait":
        work.wait()
    elif style == "future":
        work.get_future().wait()
    elif not _poll(work):
        work.wait()  # polling alone did not get there: fall back, the results still count


REDUCTION_PAIRS = [(np.float32, "AVG"), (np.int16, "AVG"), (np.int64, "AVG"),
                   (np.complex64, "AVG"), (BFLOAT16, "SUM"), (np.float16, "PREMUL_SUM"),
                   (np.complex128, "PREMUL_SUM"), (np.bool_, "BXOR"), (np.bool_, "MIN"),
                   (BFLOAT16, "PRODUCT"), (np.uint8, "BAND")]


@pytest.mark.parametrize("style", ["wait", "future", "poll"])
@pytest.mark.parametrize("pair", REDUCTION_PAIRS,
                         ids=lambda p: f"{np.dtype(p[0]).name}-{p[1]}")
def test_async_reductions(world, rank, size, pair, style):
    dt, op = pair
    inputs = reduce_inputs((3, 7), dt, op, size)
    expected = reduce_ref(inputs, op)
    root = size - 1
    x = inputs[rank].copy()
    y = inputs[rank].copy()
    rs_inputs = reduce_inputs((size, 7), dt, op, size)
    z = empty_like_filled((7,), dt)
    works = [dist.all_reduce(x, op=make_op(op), async_op=True),
             dist.reduce(y, dst=root, op=make_op(op), async_op=True),
             dist.reduce_scatter_tensor(z, rs_inputs[rank].copy(), op=make_op(op), async_op=True)]
    for w in reversed(works):
        _finish(w, style)
    assert_same(x, expected)
    assert_same(y, expected if rank == root else inputs[rank])
    assert_same(z, reduce_ref(rs_inputs, op)[rank])


def _launch_mixed(rank, size, elems, n=20):
    """n outstanding ops on distinct buffers: all_reduce / broadcast / all_gather_into_tensor."""
    works, outputs, expected = [], [], []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            inputs = [np.arange(elems, dtype=np.int64) * (r + 1) + i for r in range(size)]
            x = inputs[rank].copy()
            works.append(dist.all_reduce(x, async_op=True))
            outputs.append(x)
            expected.append(reduce_ref(inputs, "SUM"))
        elif kind == 1:
            root = i % size
            x = rank_data((elems,), np.float64, rank + i)
            works.append(dist.broadcast(x, src=root, async_op=True))
            outputs.append(x)
            expected.append(rank_data((elems,), np.float64, root + i))
        else:
            out = np.zeros((size, elems), np.float32)
            works.append(dist.all_gather_into_tensor(
                out, np.full(elems, 100 * i + rank, np.float32), async_op=True))
            outputs.append(out)
            expected.append(np.stack([np.full(elems, 100 * i + r, np.float32)
                                      for r in range(size)]))
    return works, outputs, expected


@pytest.mark.parametrize("elems", [9, 40000], ids=["small", "large"])
@pytest.mark.parametrize("order", ["forward", "reversed", "shuffled", "futures-shuffled"])
def test_many_outstanding_ops(world, rank, size, order, elems):
    works, outputs, expected = _launch_mixed(rank, size, elems)
    idx = list(range(len(works)))
    if order == "reversed":
        idx.reverse()
    elif order.endswith("shuffled"):
        random.Random(20240611).shuffle(idx)  # same seed, so the same order, on every rank
    for i in idx:
        if order.startswith("futures"):
            works[i].get_future().wait()
        else:
            works[i].wait()
    for i in range(len(works)):
        assert works[i].is_completed()
        assert_same(outputs[i], expected[i])


def test_every_root_outstanding_at_once(world, rank, size):
    """broadcast/reduce/scatter/gather from every root launched before any is waited."""
    pending = []
    for root in range(size):
        b = rank_data((4,), np.int32, rank)
        pending.append((dist.broadcast(b, src=root, async_op=True), b,
                        rank_data((4,), np.int32, root)))
        inputs = reduce_inputs((4,), np.int32, "SUM", size)
        r = inputs[rank].copy()
        pending.append((dist.reduce(r, dst=root, async_op=True), r,
                        reduce_ref(inputs, "SUM") if rank == root else inputs[rank]))
        s_out = np.zeros(4, np.int32)
        slist = [rank_data((4,), np.int32, 10 + k) for k in range(size)] if rank == root else None
        pending.append((dist.scatter(s_out, slist, src=root, async_op=True), s_out,
                        rank_data((4,), np.int32, 10 + rank)))
        glist = [np.zeros(4, np.int32) for _ in range(size)] if rank == root else None
        work = dist.gather(rank_data((4,), np.int32, rank), glist, dst=root, async_op=True)
        pending.append((work, glist, [rank_data((4,), np.int32, q) for q in range(size)]
                        if rank == root else None))
    for work, _, _ in reversed(pending):
        work.wait()
    for _, out, exp in pending:
        if isinstance(out, list):
            for o, e in zip(out, exp):
                assert_same(o, e)
        elif out is not None:
            assert_same(out, exp)


def test_async_interleaved_with_blocking(world, rank, size):
    inputs = reduce_inputs((5,), np.float64, "SUM", size)
    a = inputs[rank].copy()
    work = dist.all_reduce(a, async_op=True)
    b = rank_data((3,), np.int64, rank)
    dist.broadcast(b, src=0)
    c = np.array([rank], dtype=np.int64)
    dist.all_reduce(c, op=dist.ReduceOp.MAX)
    work.wait()
    assert_same(a, reduce_ref(inputs, "SUM"))
    assert_same(b, rank_data((3,), np.int64, 0))
    assert_same(c, np.array([size - 1], dtype=np.int64))


def test_async_output_untouched_by_later_ops_on_other_buffers(world, rank, size):
    """Two async all_reduces on different buffers, waited in reverse, do not mix results."""
    x = np.full(1000, float(rank + 1))
    y = np.full(1000, float(10 * (rank + 1)))
    wx = dist.all_reduce(x, async_op=True)
    wy = dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True)
    wy.wait()
    wx.wait()
    assert_same(x, np.full(1000, size * (size + 1) / 2))
    assert_same(y, np.full(1000, 10.0 * size))


def test_inputs_need_no_caller_reference(world, rank, size):
    """Inputs passed as temporaries (incl. non-contiguous views the library must copy) are
    kept alive by the library until the op completes; freed memory is recycled meanwhile."""
    ag = [np.zeros(3000) for _ in range(size)]
    w1 = dist.all_gather(ag, rank_data((2, 3000), np.float64, rank)[1], async_op=True)
    agt = np.zeros((size, 3000), np.int32)
    w2 = dist.all_gather_into_tensor(agt, rank_data((3000, 2), np.int32, rank)[:, 1],
                                     async_op=True)
    a2a = np.zeros((2 * size, 500))
    w3 = dist.all_to_all_single(a2a, np.concatenate([a2a_chunk(rank, p, np.float64, 2, (1000,))
                                                     for p in range(size)])[:, ::2],
                                async_op=True)
    sc = np.zeros(2000, np.int64)
    w4 = dist.scatter(sc, [rank_data((4000,), np.int64, k)[::2] for k in range(size)]
                      if rank == 0 else None, src=0, async_op=True)
    gc.collect()
    junk = [np.full(6000, -7.0) for _ in range(50)]  # likely to reuse any freed buffers
    for w in (w4, w3, w2, w1):
        w.wait()
    del junk
    for r in range(size):
        assert_same(ag[r], rank_data((2, 3000), np.float64, r)[1])
        assert_same(agt[r], rank_data((3000, 2), np.int32, r)[:, 1])
    assert_same(a2a, np.concatenate([a2a_chunk(p, rank, np.float64, 2, (1000,))[:, ::2]
                                     for p in range(size)]))
    assert_same(sc, rank_data((4000,), np.int64, rank)[::2])


def test_async_barrier_then_collectives(world, rank, size):
    wb = dist.barrier(async_op=True)
    x = np.array([rank], np.int64)
    wx = dist.all_reduce(x, async_op=True)
    wx.wait()
    wb.wait()
    assert wb.is_completed() and wx.is_completed()
    assert_same(x, np.array([size * (size - 1) // 2], np.int64))


def test_async_invalid_op_raises_at_call(world, rank, size):
    x = np.ones(3, np.complex64)
    raises_everywhere(lambda: dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True))
    assert_same(x, np.ones(3, np.complex64))


def test_works_of_mixed_kinds_combine_by_waiting_on_each(world, rank, size):
    """combine_works pools MPI requests; a Work that is not made of them (a GPU one) makes it wait
    on each Work instead. Exercised here with Works that take the per-Work path on CPU."""
    from hpc_c10d.work import Work, combine_works

    class Unpooled(Work):  # completes through its own wait, as CUDAWork does
        __slots__ = ()
        _mpi_requests = False

    x, y = np.full(4, rank + 1.0), np.full(2, rank + 1.0)
    works = [dist.all_reduce(x, async_op=True), Unpooled(dist.all_reduce(y, async_op=True)._requests, [y])]
    combined = combine_works(works, [x, y])
    assert type(combined).__name__ == "_WorkList"
    assert combined.get_future().wait() == [x, y]
    assert combined.is_completed() and all(w.is_completed() for w in works)
    expected = size * (size + 1) / 2
    assert (x == expected).all() and (y == expected).all()
