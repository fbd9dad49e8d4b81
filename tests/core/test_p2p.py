"""Point-to-point: send/recv, isend/irecv, tags, any-source, batch_isend_irecv, P2POp.

Pairs are (2k, 2k+1); at odd world sizes the last rank sits the pair tests out. Rings
(isend/irecv, batch_isend_irecv) need 2 ranks; sending to oneself is tested on its own
(torch allows it for isend/irecv, not for send/recv).
"""
import ml_dtypes
import numpy as np
import pytest

import hpc_c10d as dist

try:
    import torch
except ImportError:  # torch is optional: its tests skip
    torch = None

pytestmark = pytest.mark.mpi
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

N = 7

NUMPY_DTYPES = [np.int8, np.int64, np.float16, ml_dtypes.bfloat16, np.float64, np.complex128, np.bool_]
TORCH_DTYPES = ["int32", "float32", "bfloat16", "complex64", "bool"]  # names: torch may be absent


def _payload(dtype, sender, n=N):
    """Data a rank sends: distinct per sender, exactly representable in every dtype above."""
    base = np.arange(n) + 10 * sender + 1
    if dtype == np.bool_:
        return base % 3 == 0
    if np.dtype(dtype).kind == "c":
        return (0.5 * base - 1j * base).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        return base.astype(dtype)
    return (0.5 * base).astype(dtype)


def _torch_payload(dtype, sender, n=N):
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    base = torch.arange(n, dtype=torch.float64) + 10 * sender + 1
    if dtype == torch.bool:
        return (base % 3 == 0)
    if dtype.is_complex:
        return torch.complex(0.5 * base, -base).to(dtype)
    if dtype.is_floating_point:
        return (0.5 * base).to(dtype)
    return base.to(dtype)


def _empty_like_payload(dtype, n=N):
    return np.zeros(n, dtype=dtype)


def _partner(rank, size):
    p = rank ^ 1
    return p if p < size else None


def _assert_same(got, expected):
    if torch is not None and isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected), (got, expected)
    else:
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- blocking send / recv


def _exchange(rank, partner, payload_of, empty):
    """Even rank sends then receives, odd rank receives then sends. Returns (got, recv's return)."""
    buf = empty()
    if rank % 2 == 0:
        dist.send(payload_of(rank), dst=partner)
        src = dist.recv(buf, src=partner)
    else:
        src = dist.recv(buf, src=partner)
        dist.send(payload_of(rank), dst=partner)
    return buf, src


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_send_recv_numpy_dtypes(rank, size, dtype):
    partner = _partner(rank, size)
    if partner is None:
        return
    got, src = _exchange(rank, partner, lambda r: _payload(dtype, r), lambda: _empty_like_payload(dtype))
    assert src == partner
    _assert_same(got, _payload(dtype, partner))


@needs_torch
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_send_recv_torch_dtypes(rank, size, dtype):
    partner = _partner(rank, size)
    if partner is None:
        return
    got, src = _exchange(
        rank, partner, lambda r: _torch_payload(dtype, r), lambda: torch.zeros(N, dtype=getattr(torch, dtype))
    )
    assert src == partner
    _assert_same(got, _torch_payload(dtype, partner))


@pytest.mark.mpi(min_size=2)
def test_send_recv_multidimensional(rank, size):
    partner = _partner(rank, size)
    if partner is None:
        return

    def payload(r):
        return np.arange(24, dtype=np.float32).reshape(2, 3, 4) + r

    got, _ = _exchange(rank, partner, payload, lambda: np.zeros((2, 3, 4), np.float32))
    _assert_same(got, payload(partner))


@pytest.mark.mpi(min_size=2)
def test_tags_received_in_swapped_order(rank, size):
    partner = _partner(rank, size)
    if partner is None:
        return
    if rank % 2 == 0:
        works = [
            dist.isend(_payload(np.int64, 100 + rank), dst=partner, tag=11),
            dist.isend(_payload(np.int64, 200 + rank), dst=partner, tag=22),
        ]
        for w in works:
            w.wait()
    else:
        second, first = np.zeros(N, np.int64), np.zeros(N, np.int64)
        sources = [dist.recv(second, src=partner, tag=22), dist.recv(first, src=partner, tag=11)]
        assert sources == [partner, partner]
        _assert_same(second, _payload(np.int64, 200 + partner))
        _assert_same(first, _payload(np.int64, 100 + partner))


@pytest.fixture
def fenced(world):
    """End the test with a barrier, so that no rank runs ahead into the next test's sends
    while an any-source receive of this test is still open."""
    yield
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_recv_any_source_returns_sender(rank, size, fenced):
    """Every rank but 0 sends to rank 0, which receives with src=None."""
    if rank != 0:
        dist.send(_payload(np.int64, rank), dst=0)
        return
    got = []
    for _ in range(size - 1):
        buf = np.zeros(N, np.int64)
        got.append((dist.recv(buf), buf))
    for src, buf in got:
        _assert_same(buf, _payload(np.int64, src))
    assert sorted(src for src, _ in got) == list(range(1, size))


# ---------------------------------------------------------------- isend / irecv


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16, np.complex128], ids=lambda d: np.dtype(d).name)
def test_isend_irecv_ring(rank, size, dtype):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    buf = _empty_like_payload(dtype)
    recv_work = dist.irecv(buf, src=prv)
    send_work = dist.isend(_payload(dtype, rank), dst=nxt)
    send_work.wait()
    recv_work.wait()
    assert send_work.is_completed() and recv_work.is_completed()
    _assert_same(buf, _payload(dtype, prv))


@needs_torch
@pytest.mark.mpi(min_size=2)
def test_isend_irecv_ring_torch(rank, size):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    buf = torch.zeros(N, dtype=torch.float32)
    send_work = dist.isend(_torch_payload(torch.float32, rank), dst=nxt)
    recv_work = dist.irecv(buf, src=prv)
    recv_work.wait()
    send_work.wait()
    _assert_same(buf, _torch_payload(torch.float32, prv))


@pytest.mark.mpi(min_size=2)
def test_irecv_any_source_reports_source_rank(rank, size, fenced):
    if rank != 0:
        dist.isend(_payload(np.int64, rank), dst=0).wait()
        return
    bufs = [np.zeros(N, np.int64) for _ in range(size - 1)]
    works = [dist.irecv(b) for b in bufs]
    for w in works:
        w.wait()
    sources = [w._source_rank() for w in works]
    for src, b in zip(sources, bufs):
        _assert_same(b, _payload(np.int64, src))
    assert sorted(sources) == list(range(1, size))


# ---------------------------------------------------------------- batch_isend_irecv


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("recv_first", [False, True], ids=["sends_first", "recvs_first"])
def test_batch_isend_irecv_ring(rank, size, recv_first):
    """Two messages per direction: same-peer same-direction messages match in list order."""
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got_a, got_b = np.zeros(N, np.float64), np.zeros(N, np.float64)
    sends = [
        dist.P2POp(dist.isend, _payload(np.float64, rank), nxt),
        dist.P2POp(dist.isend, _payload(np.float64, 50 + rank), nxt),
    ]
    recvs = [dist.P2POp(dist.irecv, got_a, prv), dist.P2POp(dist.irecv, got_b, prv)]
    works = dist.batch_isend_irecv(recvs + sends if recv_first else sends + recvs)
    assert isinstance(works, list) and works
    for w in works:
        w.wait()
    _assert_same(got_a, _payload(np.float64, prv))
    _assert_same(got_b, _payload(np.float64, 50 + prv))


@needs_torch
@pytest.mark.mpi(min_size=2)
def test_batch_isend_irecv_torch_with_tags(rank, size):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(N, dtype=torch.complex64)
    ops = [
        dist.P2POp(dist.irecv, got, prv, tag=7),
        dist.P2POp(dist.isend, _torch_payload(torch.complex64, rank), nxt, tag=7),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _assert_same(got, _torch_payload(torch.complex64, prv))


@pytest.mark.parametrize("op", [dist.send, dist.recv, dist.all_reduce, print], ids=lambda f: f.__name__)
def test_p2pop_rejects_other_ops(rank, size, op):
    with pytest.raises(ValueError, match="isend|irecv"):
        dist.P2POp(op, np.zeros(N), (rank + 1) % size)


def test_batch_isend_irecv_rejects_non_p2pop(rank, size):
    with pytest.raises(ValueError):
        dist.batch_isend_irecv([dist.P2POp(dist.isend, np.zeros(N), (rank + 1) % size), "not an op"])


def test_batch_isend_irecv_mixed_groups_raises(rank, size):
    other = dist.new_group(list(range(size)))
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    ops = [
        dist.P2POp(dist.isend, _payload(np.int64, rank), nxt),
        dist.P2POp(dist.irecv, np.zeros(N, np.int64), prv, group=other),
    ]
    with pytest.raises(ValueError, match="same group"):
        dist.batch_isend_irecv(ops)
    if size > 1:
        # nothing was posted: a stray int64 message would be matched by this ring's receives
        test_batch_isend_irecv_ring(rank, size, recv_first=False)


def test_isend_irecv_to_self_allowed(rank, size):
    """torch: 'Unlike send, which is blocking, isend allows src == dst rank'."""
    buf = np.zeros(N, np.float64)
    recv_work = dist.irecv(buf, src=rank, tag=3)
    send_work = dist.isend(_payload(np.float64, rank), dst=rank, tag=3)
    send_work.wait()
    recv_work.wait()
    _assert_same(buf, _payload(np.float64, rank))


def test_batch_isend_irecv_to_self_allowed(rank, size):
    buf = np.zeros(N, np.int64)
    ops = [dist.P2POp(dist.isend, _payload(np.int64, rank), rank),
           dist.P2POp(dist.irecv, buf, rank)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _assert_same(buf, _payload(np.int64, rank))


# ---------------------------------------------------------------- invalid peers

SELF_SEND = (
    r"Invalid destination rank: destination rank should not be the same as the rank "
    r"of the current process\."
)


def test_send_to_self_raises(rank, size):
    with pytest.raises(ValueError, match=SELF_SEND):
        dist.send(_payload(np.int64, rank), dst=rank)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, s: dist.send(x, dst=s),
        lambda x, s: dist.send(x, dst=-5),
        lambda x, s: dist.isend(x, dst=s),
        lambda x, s: dist.isend(x, dst=-5),
        lambda x, s: dist.recv(x, src=s),
        lambda x, s: dist.recv(x, src=-5),
        lambda x, s: dist.irecv(x, src=s + 3),
        lambda x, s: dist.irecv(x, src=-1),
    ],
    ids=["send_size", "send_neg", "isend_size", "isend_neg", "recv_size", "recv_neg", "irecv_big", "irecv_minus1"],
)
def test_out_of_range_peer_raises(rank, size, call):
    x = np.zeros(N, np.int64)
    with pytest.raises(ValueError):
        call(x, size)


# ---------------------------------------------------------------- subgroups: group_dst / group_src


@pytest.fixture(scope="module")
def ends(world):
    """Group of the first and last rank: at 3+ ranks group rank 1 is global rank size-1."""
    size = dist.get_world_size()
    members = sorted({0, size - 1})
    return dist.new_group(members), members


@pytest.mark.mpi(min_size=2)
def test_send_recv_group_dst_group_src(rank, size, ends):
    g, members = ends
    if rank not in members:
        return
    me, other = dist.get_rank(g), 1 - dist.get_rank(g)
    buf = np.zeros(N, np.int64)
    if me == 0:
        dist.send(_payload(np.int64, rank), group=g, group_dst=other)
        src = dist.recv(buf, group=g, group_src=other)
    else:
        src = dist.recv(buf, group=g, group_src=other)
        dist.send(_payload(np.int64, rank), group=g, group_dst=other)
    assert src == members[other]  # recv returns the sender's GLOBAL rank
    _assert_same(buf, _payload(np.int64, members[other]))


@pytest.mark.mpi(min_size=2)
def test_send_recv_global_ranks_on_subgroup(rank, size, ends):
    g, members = ends
    if rank not in members:
        return
    peer = members[1 - members.index(rank)]
    buf = np.zeros(N, np.int64)
    if rank == members[0]:
        dist.send(_payload(np.int64, rank), dst=peer, group=g)
        src = dist.recv(buf, src=peer, group=g)
    else:
        src = dist.recv(buf, src=peer, group=g)
        dist.send(_payload(np.int64, rank), dst=peer, group=g)
    assert src == peer
    _assert_same(buf, _payload(np.int64, peer))


@pytest.mark.mpi(min_size=2)
def test_recv_any_source_on_subgroup_returns_global_rank(rank, size, ends, fenced):
    g, members = ends
    if rank == members[1]:
        dist.send(_payload(np.int64, rank), group=g, group_dst=0)
    elif rank == members[0]:
        buf = np.zeros(N, np.int64)
        assert dist.recv(buf, group=g) == members[1]
        _assert_same(buf, _payload(np.int64, members[1]))


@pytest.mark.mpi(min_size=2)
def test_batch_isend_irecv_group_peer(rank, size, ends):
    g, members = ends
    if rank not in members:
        return
    other = 1 - dist.get_rank(g)
    buf = np.zeros(N, np.int64)
    ops = [
        dist.P2POp(dist.isend, _payload(np.int64, rank), group=g, group_peer=other),
        dist.P2POp(dist.irecv, buf, group=g, group_peer=other),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _assert_same(buf, _payload(np.int64, members[other]))


@pytest.mark.mpi(min_size=2)
def test_isend_irecv_group_peer_any_source(rank, size, ends, fenced):
    g, members = ends
    if rank == members[1]:
        dist.isend(_payload(np.int64, rank), group=g, group_dst=0).wait()
    elif rank == members[0]:
        buf = np.zeros(N, np.int64)
        w = dist.irecv(buf, group=g)
        w.wait()
        assert w._source_rank() == 1  # a GROUP rank
        _assert_same(buf, _payload(np.int64, members[1]))


def test_send_with_dst_and_group_dst_raises(rank, size, ends):
    g, members = ends
    if rank not in members:
        return
    with pytest.raises(ValueError):
        dist.send(np.zeros(N), dst=members[0], group=g, group_dst=0)
    with pytest.raises(ValueError):
        dist.recv(np.zeros(N), src=members[0], group=g, group_src=0)
