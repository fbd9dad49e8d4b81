"""Process groups: new_group, subgroups, split_group, rank translation and non-members.

Every test here is collective over WORLD: all ranks create the same groups in the same
order. Rank lists depend on the world size (even ranks, odd ranks, the last rank alone,
first and last) so that group ranks differ from global ranks from 3 ranks on.
"""
import datetime
import socket

import numpy as np
import pytest

import hpc_c10d as dist
from support.reference import assert_in_sync

pytestmark = pytest.mark.mpi

N = 5  # elements per rank in the payloads


def _data(global_rank, dtype=np.int64):
    """The payload of one rank: distinct per rank, exact in every dtype used here."""
    return np.arange(N, dtype=dtype) + 100 * global_rank


def _sum_of(ranks):
    return sum(_data(r) for r in ranks)


def _evens(size):
    return list(range(0, size, 2))


def _odds(size):
    return list(range(1, size, 2))


@pytest.fixture(autouse=True)
def _in_step(world):
    """After every test (also a failed one) all ranks must meet in one WORLD all_reduce.

    Tests run their collectives first and assert afterwards, so a wrong answer on one rank
    fails the test instead of leaving the other ranks waiting in a collective.
    """
    yield
    assert_in_sync()


@pytest.fixture(scope="module")
def parity(world):
    """This rank's group of equal parity (evens / odds) and that group's global ranks."""
    size, rank = dist.get_world_size(), dist.get_rank()
    lists = [_evens(size)] + ([_odds(size)] if size > 1 else [])
    groups = [dist.new_group(ranks) for ranks in lists]
    return groups[rank % 2], lists[rank % 2]


# ---------------------------------------------------------------- WORLD and queries


def test_world_is_the_default_group(rank, size):
    world = dist.group.WORLD
    explicit, implicit = _data(rank), _data(rank)
    dist.all_reduce(explicit, group=world)
    dist.all_reduce(implicit)
    np.testing.assert_array_equal(explicit, _sum_of(range(size)))
    np.testing.assert_array_equal(implicit, explicit)
    assert world is not None
    assert dist.GroupMember.WORLD is world
    assert dist.is_initialized()
    assert dist.get_rank(world) == rank
    assert dist.get_world_size(world) == size
    assert dist.get_process_group_ranks(world) == list(range(size))
    assert dist.get_process_group_ranks(None) == list(range(size))
    for r in range(size):
        assert dist.get_group_rank(world, r) == r
        assert dist.get_global_rank(world, r) == r


def test_get_backend_of_world_and_subgroup(rank, size):
    g = dist.new_group(list(range(size)))
    backend = dist.get_backend()
    assert isinstance(backend, str) and backend
    assert backend == backend.lower()
    assert dist.get_backend(dist.group.WORLD) == backend
    assert dist.get_backend(g) == backend


def test_get_backend_of_non_member_raises(rank, size):
    g = dist.new_group([size - 1])
    if rank != size - 1:
        with pytest.raises(ValueError):
            dist.get_backend(g)
    else:
        assert dist.get_backend(g) == dist.get_backend()


def test_get_pg_count_grows_with_each_group(rank, size):
    before = dist.get_pg_count()
    dist.new_group(list(range(size)))
    after_one = dist.get_pg_count()
    dist.new_group([size - 1])  # non-members count it too
    after_two = dist.get_pg_count()
    assert before >= 1  # the default group counts
    assert (after_one, after_two) == (before + 1, before + 2)


def test_get_node_local_rank_is_position_among_same_host(rank, size):
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname())
    expected = hosts[:rank].count(hosts[rank])
    assert dist.get_node_local_rank() == expected
    if len(set(hosts)) == 1:
        assert dist.get_node_local_rank() == rank


# ---------------------------------------------------------------- new_group


GIVEN_RANKS = {
    "first_and_last_reversed": lambda size: sorted({0, size - 1}, reverse=True),
    "all_reversed": lambda size: list(range(size))[::-1],
    "odds_reversed_or_zero": lambda size: _odds(size)[::-1] or [0],
    "last_then_evens": lambda size: [size - 1] + [r for r in _evens(size) if r != size - 1],
}


@pytest.mark.parametrize("given", GIVEN_RANKS.values(), ids=GIVEN_RANKS.keys())
def test_new_group_sorts_ranks(rank, size, given):
    given = given(size)
    members = sorted(given)
    g = dist.new_group(given)
    if rank not in members:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
        return
    # the whole group gets the same view: gather everybody's group rank by group rank
    seen = [None] * len(members)
    dist.all_gather_object(seen, (rank, dist.get_rank(g)), group=g)
    x = _data(rank)
    dist.all_reduce(x, group=g)
    assert g != dist.GroupMember.NON_GROUP_MEMBER
    assert dist.get_process_group_ranks(g) == members
    assert dist.get_rank(g) == members.index(rank)
    assert dist.get_world_size(g) == len(members)
    assert seen == [(r, i) for i, r in enumerate(members)]
    np.testing.assert_array_equal(x, _sum_of(members))


def test_new_group_none_means_all_ranks(rank, size):
    g = dist.new_group()
    x = _data(rank)
    dist.all_reduce(x, group=g)
    assert dist.get_process_group_ranks(g) == list(range(size))
    assert dist.get_rank(g) == rank
    np.testing.assert_array_equal(x, _sum_of(range(size)))


def test_group_rank_translation(rank, size, parity):
    g, members = parity
    for i, r in enumerate(members):
        assert dist.get_group_rank(g, r) == i
        assert dist.get_global_rank(g, i) == r
    assert dist.get_process_group_ranks(g) == members
    outsiders = [r for r in range(size) if r not in members] + [size, -1]
    for r in outsiders:
        with pytest.raises(ValueError):
            dist.get_group_rank(g, r)
    for i in (len(members), len(members) + 3, -1):
        with pytest.raises(ValueError):
            dist.get_global_rank(g, i)


def test_parity_group_all_reduce(rank, size, parity):
    g, members = parity
    x = _data(rank)
    dist.all_reduce(x, group=g)
    assert dist.get_world_size(g) == len(members)
    assert dist.get_rank(g) == members.index(rank)
    np.testing.assert_array_equal(x, _sum_of(members))


def _non_member_calls(size):
    """Collectives a non-member may call on a group it is not in; src/dst name member 0."""
    x = _data(-1)

    def out_list():
        return [np.empty(N, np.int64)]

    return {
        "all_reduce": lambda g: dist.all_reduce(x, group=g),
        "broadcast": lambda g: dist.broadcast(x, src=0, group=g),
        "broadcast_group_src": lambda g: dist.broadcast(x, group_src=0, group=g),
        "reduce": lambda g: dist.reduce(x, dst=0, group=g),
        "all_gather": lambda g: dist.all_gather(out_list(), x, group=g),
        "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(
            np.empty(N, np.int64), x, group=g
        ),
        "gather": lambda g: dist.gather(x, None, dst=0, group=g),
        "scatter": lambda g: dist.scatter(x, None, src=0, group=g),
        "reduce_scatter_tensor": lambda g: dist.reduce_scatter_tensor(x, x, group=g),
        "all_to_all_single": lambda g: dist.all_to_all_single(x, x, group=g),
        "barrier": lambda g: dist.barrier(group=g),
        "all_gather_object": lambda g: dist.all_gather_object([None], 1, group=g),
        "broadcast_object_list": lambda g: dist.broadcast_object_list([None], src=0, group=g),
    }, x


NON_MEMBER_OPS = list(_non_member_calls(1)[0])


@pytest.mark.parametrize("op", NON_MEMBER_OPS)
def test_non_member_gets_sentinel_and_collectives_return_none(rank, size, op):
    """Rank 0 alone forms a group; everyone else is a non-member and must not communicate."""
    g = dist.new_group([0])
    if rank == 0:
        assert dist.get_rank(g) == 0
        assert dist.get_world_size(g) == 1
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(g) == -1
        assert dist.get_world_size(g) == -1
        calls, x = _non_member_calls(size)
        with pytest.warns(UserWarning, match="does not belong"):
            result = calls[op](g)
        assert result is None
        np.testing.assert_array_equal(x, _data(-1))  # untouched


def test_non_member_p2p_returns_none_or_minus_one(rank, size):
    g = dist.new_group([0])
    if rank != 0:
        x = _data(rank)
        with pytest.warns(UserWarning, match="does not belong"):
            assert dist.isend(x, dst=0, group=g) is None
        with pytest.warns(UserWarning, match="does not belong"):
            assert dist.irecv(x, src=0, group=g) is None
        with pytest.warns(UserWarning, match="does not belong"):
            assert dist.recv(x, src=0, group=g) == -1
        np.testing.assert_array_equal(x, _data(rank))


def test_new_group_timeout_must_be_timedelta(rank, size):
    for bad in (5, 5.0, "30s"):
        with pytest.raises(TypeError, match="timedelta"):
            dist.new_group(list(range(size)), timeout=bad)
    g = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=60))
    x = _data(rank)
    dist.all_reduce(x, group=g)
    np.testing.assert_array_equal(x, _sum_of(range(size)))


@pytest.mark.parametrize(
    "ranks", [lambda s: [0, 0], lambda s: [s], lambda s: [-1], lambda s: list(range(s + 1))],
    ids=["duplicate", "too_large", "negative", "more_than_world"],
)
def test_new_group_bad_ranks_raise_value_error(rank, size, ranks):
    with pytest.raises(ValueError):
        dist.new_group(ranks(size))


def test_new_group_local_synchronization_only_members_call(rank, size):
    """Each parity class builds its own group; the other class never enters new_group."""
    mine = _evens(size) if rank % 2 == 0 else _odds(size)
    g = dist.new_group(mine, use_local_synchronization=True)
    x = _data(rank)
    dist.all_reduce(x, group=g)
    assert g is not None and g != dist.GroupMember.NON_GROUP_MEMBER
    assert dist.get_process_group_ranks(g) == mine
    assert dist.get_rank(g) == mine.index(rank)
    np.testing.assert_array_equal(x, _sum_of(mine))


def test_new_group_local_synchronization_single_member(rank, size):
    """Only the last rank creates (and uses) a one-rank group."""
    if rank == size - 1:
        g = dist.new_group([size - 1], use_local_synchronization=True)
        x = _data(rank)
        dist.all_reduce(x, group=g)
        assert dist.get_world_size(g) == 1
        np.testing.assert_array_equal(x, _data(rank))


# ---------------------------------------------------------------- new_subgroups


def _divisors(size):
    return [d for d in range(1, size + 1) if size % d == 0]


@pytest.mark.parametrize("which", ["one", "smallest_nontrivial", "world"])
def test_new_subgroups(rank, size, which):
    divisors = _divisors(size)
    group_size = {"one": 1, "smallest_nontrivial": divisors[min(1, len(divisors) - 1)],
                  "world": size}[which]
    cur, subgroups = dist.new_subgroups(group_size)
    x = _data(rank)
    dist.all_reduce(x, group=cur)
    assert isinstance(subgroups, list)
    assert len(subgroups) == size // group_size
    start = rank // group_size * group_size
    members = list(range(start, start + group_size))
    assert dist.get_process_group_ranks(cur) == members
    assert dist.get_rank(cur) == rank - start
    assert dist.get_world_size(cur) == group_size
    assert subgroups[rank // group_size] is cur
    np.testing.assert_array_equal(x, _sum_of(members))


def test_new_subgroups_requires_divisible_world(rank, size):
    bad = [g for g in range(2, size) if size % g]
    if not bad:
        pytest.skip(f"every group size 2..{size - 1} divides world size {size}")
    with pytest.raises(ValueError):
        dist.new_subgroups(bad[0])


@pytest.mark.parametrize("group_size", [lambda s: 0, lambda s: -1, lambda s: s + 1],
                         ids=["zero", "negative", "larger_than_world"])
def test_new_subgroups_bad_size(rank, size, group_size):
    with pytest.raises(ValueError):
        dist.new_subgroups(group_size(size))


def test_new_subgroups_by_enumeration(rank, size):
    lists = [_evens(size)] + ([_odds(size)] if size > 1 else [])
    cur, subgroups = dist.new_subgroups_by_enumeration(lists)
    x = _data(rank)
    dist.all_reduce(x, group=cur)
    assert len(subgroups) == len(lists)
    mine = lists[rank % 2]
    assert subgroups[rank % 2] is cur
    assert dist.get_process_group_ranks(cur) == mine
    assert dist.get_rank(cur) == mine.index(rank)
    np.testing.assert_array_equal(x, _sum_of(mine))


def test_new_subgroups_by_enumeration_rank_in_no_list(rank, size):
    cur, subgroups = dist.new_subgroups_by_enumeration([[size - 1]])
    assert len(subgroups) == 1
    if rank == size - 1:
        assert cur is subgroups[0]
        assert dist.get_process_group_ranks(cur) == [size - 1]
    else:
        assert cur is None
        assert subgroups[0] == dist.GroupMember.NON_GROUP_MEMBER


@pytest.mark.parametrize(
    "lists", [lambda s: [[0], [0]], lambda s: [list(range(s)), [s - 1]]],
    ids=["same_rank_twice", "last_rank_in_two_lists"],
)
def test_new_subgroups_by_enumeration_overlap_raises(rank, size, lists):
    with pytest.raises(ValueError):
        dist.new_subgroups_by_enumeration(lists(size))


def test_new_subgroups_by_enumeration_empty_raises(rank, size):
    with pytest.raises(ValueError):
        dist.new_subgroups_by_enumeration([])


# ---------------------------------------------------------------- split_group


def test_split_group_parity(rank, size):
    splits = [_evens(size)] + ([_odds(size)] if size > 1 else [])
    g = dist.split_group(split_ranks=splits)
    x = _data(rank)
    dist.all_reduce(x, group=g)
    assert g is not None
    mine = splits[rank % 2]
    assert dist.get_process_group_ranks(g) == mine
    assert dist.get_rank(g) == mine.index(rank)
    np.testing.assert_array_equal(x, _sum_of(mine))


def test_split_group_rank_in_no_split_gets_none(rank, size):
    g = dist.split_group(split_ranks=[[size - 1]])
    if rank == size - 1:
        assert g is not None
        assert dist.get_process_group_ranks(g) == [size - 1]
    else:
        assert g is None


def test_split_group_of_subgroup_uses_group_ranks(rank, size, parity):
    """split_ranks name ranks of the parent group: [[last group rank]] of each parity group."""
    parent, members = parity
    g = dist.split_group(parent_pg=parent, split_ranks=[[len(members) - 1]])
    if rank == members[-1]:
        assert dist.get_process_group_ranks(g) == [members[-1]]
        assert dist.get_world_size(g) == 1
    else:
        assert g is None


def test_split_group_empty_raises(rank, size):
    with pytest.raises(ValueError):
        dist.split_group(split_ranks=[])


# ---------------------------------------------------------------- rooted collectives on subgroups


def _root_kwargs(style, name, members):
    """src/dst of the group's LAST member, as a global rank or as a group rank."""
    if style == "global":
        return {name: members[-1]}
    return {f"group_{name}": len(members) - 1}


@pytest.mark.parametrize("style", ["global", "group"])
def test_subgroup_broadcast_root(rank, size, parity, style):
    g, members = parity
    x = _data(rank)
    dist.broadcast(x, group=g, **_root_kwargs(style, "src", members))
    np.testing.assert_array_equal(x, _data(members[-1]))


@pytest.mark.parametrize("style", ["global", "group"])
def test_subgroup_reduce_root(rank, size, parity, style):
    g, members = parity
    x = _data(rank)
    dist.reduce(x, group=g, **_root_kwargs(style, "dst", members))
    if rank == members[-1]:
        np.testing.assert_array_equal(x, _sum_of(members))


@pytest.mark.parametrize("style", ["global", "group"])
def test_subgroup_gather_root(rank, size, parity, style):
    g, members = parity
    out = [np.full(N, -1, np.int64) for _ in members] if rank == members[-1] else None
    dist.gather(_data(rank), out, group=g, **_root_kwargs(style, "dst", members))
    if out is not None:
        for got, r in zip(out, members):
            np.testing.assert_array_equal(got, _data(r))


@pytest.mark.parametrize("style", ["global", "group"])
def test_subgroup_scatter_root(rank, size, parity, style):
    g, members = parity
    chunks = [_data(1000 + r) for r in members] if rank == members[-1] else None
    out = np.full(N, -1, np.int64)
    dist.scatter(out, chunks, group=g, **_root_kwargs(style, "src", members))
    np.testing.assert_array_equal(out, _data(1000 + rank))


@pytest.mark.parametrize("style", ["global", "group"])
def test_subgroup_broadcast_object_root(rank, size, parity, style):
    g, members = parity
    objs = [{"from": rank}, "payload"] if rank == members[-1] else [None, None]
    dist.broadcast_object_list(objs, group=g, **_root_kwargs(style, "src", members))
    assert objs == [{"from": members[-1]}, "payload"]


@pytest.mark.parametrize(
    "call",
    [
        lambda g, m, x: dist.broadcast(x, src=m[0], group_src=0, group=g),
        lambda g, m, x: dist.reduce(x, dst=m[0], group_dst=0, group=g),
        lambda g, m, x: dist.gather(x, None, dst=m[0], group_dst=0, group=g),
        lambda g, m, x: dist.scatter(x, None, src=m[0], group_src=0, group=g),
        lambda g, m, x: dist.broadcast_object_list([None], src=m[0], group_src=0, group=g),
    ],
    ids=["broadcast", "reduce", "gather", "scatter", "broadcast_object_list"],
)
def test_subgroup_src_and_group_src_both_given_raises(rank, size, parity, call):
    g, members = parity
    x = _data(rank)
    with pytest.raises(ValueError):
        call(g, members, x)
    np.testing.assert_array_equal(x, _data(rank))


def test_subgroup_root_not_in_group_raises(rank, size, parity):
    """A global src that is not a member of the group is an error (odd/even: other parity)."""
    if size < 2:
        pytest.skip("needs 2 ranks so that some rank is outside the parity group")
    g, members = parity
    outsider = next(r for r in range(size) if r not in members)
    x = _data(rank)
    with pytest.raises(ValueError):
        dist.broadcast(x, src=outsider, group=g)
