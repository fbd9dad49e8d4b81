"""Collective fingerprints at debug level DETAIL, on a group created while DETAIL is set.

The last rank deviates in one field; every rank must raise DistError naming that field and the
ranks on each side, and the group must still compute right afterwards (nothing was mixed).
Every collective is also run on a checked group with matching arguments against numpy.
"""
import numpy as np
import pytest

import hpc_c10d as dist
from support.reference import assert_in_sync

pytestmark = pytest.mark.mpi


@pytest.fixture
def checked(world):
    """A group over every rank whose collectives are fingerprint-checked."""
    before = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        group = dist.new_group(list(range(dist.get_world_size())))
    finally:
        dist.set_debug_level(before)
    yield group
    assert_in_sync()
    dist.destroy_process_group(group)


def _sides(size, first, last):
    others = "rank 0" if size == 2 else f"ranks 0-{size - 2}"
    return f"{others}: {first}; rank {size - 1}: {last}"


# field -> (what the others run, what the last rank runs, how the field reads on each side)
DEVIATIONS = {
    "shape": (lambda g: dist.all_reduce(np.ones(4, np.float32), group=g),
              lambda g: dist.all_reduce(np.ones(5, np.float32), group=g), ("(4,)", "(5,)")),
    "dtype": (lambda g: dist.all_reduce(np.ones(4, np.float32), group=g),
              lambda g: dist.all_reduce(np.ones(4, np.float64), group=g), ("float32", "float64")),
    "op": (lambda g: dist.all_reduce(np.ones(4), group=g),
           lambda g: dist.broadcast(np.ones(4), 0, group=g), ("all_reduce", "broadcast")),
    "root": (lambda g: dist.broadcast(np.ones(4), 0, group=g),
             lambda g: dist.broadcast(np.ones(4), 1, group=g), ("0", "1")),
    "reduce_op": (lambda g: dist.all_reduce(np.ones(4), dist.ReduceOp.SUM, group=g),
                  lambda g: dist.all_reduce(np.ones(4), dist.ReduceOp.MAX, group=g),
                  ("RedOpType.SUM", "RedOpType.MAX")),
}


@pytest.mark.parametrize("field", sorted(DEVIATIONS))
def test_a_mismatch_raises_on_every_rank_naming_field_and_ranks(checked, field, rank, size):
    if size < 2:
        pytest.skip("a mismatch needs two ranks")
    common, deviant, (first, last) = DEVIATIONS[field]
    with pytest.raises(dist.DistError) as caught:
        (deviant if rank == size - 1 else common)(checked)
    message = str(caught.value)
    assert "Detected mismatch between collectives" in message
    assert f"{field} differs: {_sides(size, first, last)}" in message, message

    x = np.full(3, rank + 1, np.int64)  # the group still works, with nothing mixed in
    dist.all_reduce(x, group=checked)
    np.testing.assert_array_equal(x, np.full(3, size * (size + 1) // 2))


def _readonly(n):
    x = np.zeros(n, np.float32)
    x.flags.writeable = False
    return x


# arguments that only some ranks' own checks refuse: (the call, do I refuse?, the refusal's phrase)
REFUSALS = {
    "all_to_all: own block on ranks > 0": (
        lambda g, r, s: dist.all_to_all([np.zeros(4 if i == 0 else 5, np.float32) for i in range(s)],
                                        [np.zeros(4, np.float32) for _ in range(s)], group=g),
        lambda r: r > 0, "the block a rank sends itself must match"),
    "gather: the root's list": (
        lambda g, r, s: dist.gather(np.zeros(3, np.float32), [np.zeros(3, np.float32)] if r == 0 else None,
                                    dst=0, group=g),
        lambda r: r == 0, "must hold one array per rank of the group"),
    "broadcast: read-only on non-roots": (
        lambda g, r, s: dist.broadcast(_readonly(3), 0, group=g), lambda r: r > 0, "is read-only"),
    "all_reduce: a strided view on the last rank": (
        lambda g, r, s: dist.all_reduce(np.zeros(8)[::2] if r == s - 1 else np.zeros(4), group=g),
        None, "must be C-contiguous"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refusal_on_some_ranks_raises_on_every_rank(checked, case, rank, size):
    """A rank whose own checks refuse its arguments joins the fingerprint exchange before raising,
    so the others raise too, naming it, instead of waiting for it in the collective (issue 39)."""
    if size < 2:
        pytest.skip("needs a rank that does not refuse")
    call, refuses, phrase = REFUSALS[case]
    refusing = [r for r in range(size) if (refuses(r) if refuses else r == size - 1)]
    if rank in refusing:
        with pytest.raises(ValueError, match=phrase):
            call(checked, rank, size)
    else:
        with pytest.raises(dist.DistError) as caught:
            call(checked, rank, size)
        message = str(caught.value)
        assert "was refused by the arguments of rank" in message and phrase in message, message
        assert all(f"rank {r}: ValueError: " in message for r in refusing), message

    x = np.full(3, rank + 1, np.int64)  # the group still works, its sequence numbers in step
    dist.all_reduce(x, group=checked)
    np.testing.assert_array_equal(x, np.full(3, size * (size + 1) // 2))


def test_every_collective_on_a_checked_group_is_exact(checked, rank, size):
    def block(r, n=3):
        return np.arange(n, dtype=np.float64) + 10 * r

    x = block(rank)
    dist.all_reduce(x, group=checked)
    np.testing.assert_array_equal(x, sum(block(r) for r in range(size)))

    x = block(rank)
    dist.broadcast(x, size - 1, group=checked)
    np.testing.assert_array_equal(x, block(size - 1))

    x = block(rank)
    dist.reduce(x, 0, dist.ReduceOp.MAX, group=checked)
    if rank == 0:
        np.testing.assert_array_equal(x, block(size - 1))

    out = np.empty(3 * size)
    dist.all_gather_into_tensor(out, block(rank), group=checked)
    np.testing.assert_array_equal(out, np.concatenate([block(r) for r in range(size)]))

    outs = [np.empty(3) for _ in range(size)]
    dist.all_gather(outs, block(rank), group=checked)
    for r in range(size):
        np.testing.assert_array_equal(outs[r], block(r))

    outs = [np.empty(3) for _ in range(size)] if rank == 0 else None
    dist.gather(block(rank), outs, dst=0, group=checked)
    for r in range(size if rank == 0 else 0):
        np.testing.assert_array_equal(outs[r], block(r))

    out = np.empty(3)
    dist.scatter(out, [block(r) for r in range(size)] if rank == 0 else None, src=0, group=checked)
    np.testing.assert_array_equal(out, block(rank))

    out = np.empty(3)
    dist.reduce_scatter_tensor(out, np.concatenate([block(r) for r in range(size)]), group=checked)
    np.testing.assert_array_equal(out, size * block(rank))

    out = np.empty(3)
    dist.reduce_scatter(out, [block(r) for r in range(size)], group=checked)
    np.testing.assert_array_equal(out, size * block(rank))

    # all-to-all blocks may differ in size by rank: rank r sends r + 1 elements to everyone
    mine = np.full((rank + 1) * size, float(rank))
    out = np.empty(sum(r + 1 for r in range(size)))
    dist.all_to_all_single(out, mine, [r + 1 for r in range(size)], [rank + 1] * size, group=checked)
    np.testing.assert_array_equal(out, np.concatenate([np.full(r + 1, float(r)) for r in range(size)]))

    outs = [np.empty(rank + 1) for _ in range(size)]
    dist.all_to_all(outs, [np.full(r + 1, float(rank)) for r in range(size)], group=checked)
    for r in range(size):
        np.testing.assert_array_equal(outs[r], np.full(rank + 1, float(r)))

    dist.barrier(group=checked)
    x = block(rank)
    dist.all_reduce(x, async_op=True, group=checked).wait()
    np.testing.assert_array_equal(x, sum(block(r) for r in range(size)))


def test_groups_made_below_detail_are_not_checked(world, rank, size):
    if size < 2:
        pytest.skip("a mismatch needs two ranks")
    group = dist.new_group(list(range(size)))
    try:
        x = np.ones(2, np.int64)
        dist.all_reduce(x, group=group)
        assert type(group._cpu).__name__ != "_Checked"
        np.testing.assert_array_equal(x, np.full(2, size))
    finally:
        dist.destroy_process_group(group)
