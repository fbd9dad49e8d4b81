"""The NCCL transport's multi-rank agreement, under real MPI at 1-4 ranks, against the recording
stand-in of the NCCL binding (tests/support/recording_nccl.py): which calls each rank makes, in
which groups and order, and that the ranks agree. No GPU and no NCCL: nothing here shows that
NCCL moves data; these are tests of our own logic, never reported as GPU tests."""

from datetime import timedelta

import pytest
from mpi4py import MPI

import hpc_c10d as dist
from hpc_c10d.errors import DistBackendError
from hpc_c10d.nccl.backend import NCCLBackend
from hpc_c10d.nccl.comm import Communicator
from hpc_c10d.reduce_op import RedOpType
from support.recording_nccl import fake_buffer, install

pytestmark = pytest.mark.mpi


@pytest.fixture
def recorder(world, monkeypatch):
    return install(monkeypatch)


@pytest.fixture
def transport(recorder):
    """An NCCL transport over a duplicate of the world's communicator (the stand-in's library)."""
    comm = dist.group.WORLD.comm.Dup()
    backend = NCCLBackend(comm, timedelta(seconds=30))
    yield backend
    backend.close(wait_s=0)
    comm.Free()


@pytest.fixture
def bound_parent(recorder):
    """A group of every rank with cuda:0 bound (its communicator made through the stand-in)."""
    parent = dist.new_group(list(range(dist.get_world_size())))
    parent._bind_device(0)
    yield parent
    parent.bound_device_id = None
    dist.destroy_process_group(parent)


def _gathered(value):
    return dist.group.WORLD.comm.allgather(value)


def _units(recorder, *names):
    """The launched units (ncclGroupStart..End blocks, or lone calls) holding a call of ``names``."""
    return [[c.name for c in unit] for unit in recorder.groups() if any(c.name in names for c in unit)]


def test_batch_p2p_in_a_ring_is_one_nccl_group_on_the_groups_communicator(transport, recorder, rank, size):
    after, before = (rank + 1) % size, (rank - 1) % size
    ops = [(True, fake_buffer(0x1000, 8), after, None), (False, fake_buffer(0x2000, 8), before, None)]
    works = transport.batch_p2p(ops)
    assert len(works) == 2 and works[0] is works[1]
    assert _units(recorder, "ncclSend", "ncclRecv") == [["ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"]]
    (init,) = recorder.named("ncclCommInitRank")  # the group's communicator: no two-rank one in a ring
    assert (init["rank"], init["size"]) == (rank, size)
    sends = _gathered([(peer, nbytes) for call, _, nbytes, peer, _ in recorder.p2p_layout() if call == "ncclSend"])
    receives = _gathered([(peer, nbytes) for call, _, nbytes, peer, _ in recorder.p2p_layout() if call == "ncclRecv"])
    assert all((r, 32) in receives[peer] for r in range(size) for peer, _ in sends[r])  # each send has its receive


def test_a_lone_send_or_receive_to_self_is_refused_before_any_communicator_is_made(transport, recorder, rank):
    for start in (transport.send, transport.recv):
        with pytest.raises(ValueError, match="batch_isend_irecv"):
            start(fake_buffer(0x1000, 4), rank, 0, True, None)
    assert recorder.calls == [c for c in recorder.calls if c.name == "ncclGetVersion"]


def test_communicators_are_destroyed_in_one_order_on_every_rank(transport, recorder, rank, size):
    """Pairs made in an order that differs between ranks: every rank destroys the group's
    communicator first, then its pairs by (lower rank, higher rank)."""
    pairs = sorted(((lo, hi) for lo in range(size) for hi in range(lo + 1, size)), key=lambda p: (-p[1], p[0]))
    for lo, hi in pairs:  # the same sequence everywhere (no pair waits on another), most recent rank first
        if rank in (lo, hi):
            transport._pair(0, hi if rank == lo else lo)
    group = transport._connect(0).handle
    peers = {comm.handle: peer for (_, peer), comm in transport._pairs.items()}
    transport.close(wait_s=0)
    order = [("group",) if c["comm"] == group else tuple(sorted((rank, peers[c["comm"]])))
             for c in recorder.named("ncclCommDestroy")]
    assert order == [("group",), *(p for p in sorted(pairs) if rank in p)]


def test_different_nccl_releases_fail_every_rank_alike_before_ncclCommInitRank(world, monkeypatch, rank, size):
    if size < 2:
        pytest.skip("needs two ranks to differ")
    recorder = install(monkeypatch, version=(2, 21, 5) if rank == 0 else (2, 27, 3))
    with pytest.raises(DistBackendError, match="different NCCL releases") as caught:
        Communicator.from_mpi(recorder, dist.group.WORLD.comm, 0, "the test group")
    assert _gathered(str(caught.value)) == [str(caught.value)] * size
    assert not recorder.named("ncclCommInitRank")


def test_the_unique_id_is_broadcast_before_the_members_check(world, monkeypatch, rank, size):
    """A rank that cannot join still receives the ID first: every rank's broadcast completed
    before any could block in NCCL (the check's allgather follows it)."""
    recorder = install(monkeypatch, devices=0 if rank == size - 1 else 1)
    with pytest.raises(DistBackendError, match="no CUDA device is visible"):
        Communicator.from_mpi(recorder, dist.group.WORLD.comm, 0, "the test group")
    assert len(recorder.named("ncclGetUniqueId")) == (1 if rank == 0 else 0)
    assert not recorder.named("ncclCommInitRank")


def _split_calls(recorder, handle):
    return [(c["color"], c["key"]) for c in recorder.named("ncclCommSplit") if c["comm"] == handle]


def test_a_healthy_bound_parent_is_split_once_by_every_rank(bound_parent, recorder, rank, size):
    parent_handle = bound_parent._transports["cuda"]._comms[0].handle
    members = list(range(max(1, size - 1)))  # the last rank (of several) is in no new group
    child = dist.split_group(bound_parent, [members])
    colour, key = (0, members.index(rank)) if rank in members else (-1, 0)
    assert _split_calls(recorder, parent_handle) == [(colour, key)]
    assert len(recorder.named("ncclCommInitRank")) == 1  # the parent's only
    if child is not None:
        assert child._transports["cuda"]._comms[0].handle == recorder.named("ncclCommSplit")[0]["handle"]
        dist.destroy_process_group(child)


@pytest.mark.parametrize("trouble", ["async error", "aborted", "unbound"])
def test_one_ranks_trouble_sends_every_rank_the_same_way(bound_parent, recorder, rank, size, trouble):
    """One rank's parent communicator has an error pending, was aborted, or that rank has no
    device bound: no rank splits (one would fail or be missing while the others wait in
    ncclCommSplit); with every device bound the members make a fresh communicator, else none."""
    gpu = bound_parent._transports["cuda"]
    if rank == 0:
        if trouble == "async error":
            recorder.set_async_error(gpu._comms[0].handle, 6)  # ncclRemoteError
        elif trouble == "aborted":
            gpu._comms[0].abort()
        else:
            bound_parent.bound_device_id = None
    child = dist.split_group(bound_parent, [list(range(size))])
    assert not recorder.named("ncclCommSplit")
    recorder.set_async_error(gpu._comms[0].handle, 0)  # so the parent is destroyed, not aborted, after
    fresh = recorder.named("ncclCommInitRank")[1:]  # after the parent's own
    if trouble == "unbound":
        assert fresh == [] and not child._transports.get("cuda")
    else:
        assert [(c["rank"], c["size"]) for c in fresh] == [(rank, size)]
    dist.destroy_process_group(child)


def test_barrier_waits_for_the_groups_collectives_not_its_pairs_and_is_bounded(recorder, rank, size):
    """A pending send to a peer does not hold the barrier (the peer may post its receive after
    the barrier); a collective of the group that never finishes ends the wait at the timeout,
    with the communicator aborted."""
    comm = dist.group.WORLD.comm.Dup()
    gpu = NCCLBackend(comm, timedelta(seconds=0.5))
    try:
        if size > 1 and rank < 2:  # ranks 0 and 1 exchange over a two-rank communicator
            gpu.send(fake_buffer(0x1000, 4), 1 - rank, 0, True, None)
            recorder.cuda.events[-1].passed = False  # and the exchange never finishes
        gpu._finish_queued()  # returns: nothing of the group's is queued
        gpu.allreduce(fake_buffer(0x3000, 4), RedOpType.SUM, True, None)
        recorder.cuda.events[-1].passed = False
        with pytest.raises(DistBackendError, match="timed out"):
            gpu._finish_queued()
        assert len(recorder.named("ncclCommAbort")) == 1
    finally:
        gpu.close(wait_s=0)
        comm.Free()


def test_an_async_error_ends_a_host_wait_and_is_what_the_watchdog_reads(transport, recorder):
    work = transport.allreduce(fake_buffer(0x1000, 4), RedOpType.SUM, True, None)
    assert transport._async_failure() is None
    recorder.cuda.events[-1].passed = False
    recorder.set_async_error(transport._comms[0].handle, 6)  # a peer died
    assert "remote process exited" in transport._async_failure()
    with pytest.raises(DistBackendError, match="remote process exited"):
        work.get_future().wait()  # a host wait, ended by NCCL's error rather than the group's timeout


@pytest.mark.mpi(min_size=3)
def test_groups_made_in_different_orders_are_destroyed_in_one_order(world, rank, size):
    """Locally synchronised groups exist in a different order on each rank; every rank destroys
    its groups by their ranks, so no two ranks wait on each other in ncclCommDestroy."""
    from hpc_c10d.lifecycle import _destroy_order
    from hpc_c10d.state import _world

    first, second = [0, 1], [1, 2]
    made = []
    for ranks in ((second, first) if rank == 1 else (first, second)):  # rank 1 makes them in the other order
        if rank in ranks:
            made.append(dist.new_group(ranks, use_local_synchronization=True))
    try:
        order = [list(pg._global_ranks) for pg in _destroy_order(_world.groups) if pg in made]
        assert order == [r for r in (first, second) if rank in r]
    finally:
        for pg in made:
            dist.destroy_process_group(pg)


def test_a_hung_abort_does_not_hold_shrink_group(transport, recorder, caplog):
    """From NCCL 2.16 an abort may wait for the node's other ranks; shrink_group gives it the
    group's timeout on a thread of its own and goes on."""
    import threading

    from hpc_c10d.shrink import _abort_within

    transport._connect(0)
    release = threading.Event()
    recorder.ncclCommAbort = lambda handle: release.wait() and 0  # never returns until released
    try:
        _abort_within(transport, 0.2)
        assert "had not returned after 0.2 s" in caplog.text
    finally:
        release.set()


@pytest.mark.parametrize("where", ["rank 0 has no GPU", "rank 0's node is crowded", "every rank has its own"])
def test_the_gpu_tests_skip_on_every_rank_or_on_none(world, monkeypatch, rank, size, where):
    """A rank-local choice would let some ranks skip a GPU test while the others wait in its
    collectives (nodes with different GPU counts)."""
    from support.gpu_plan import OWN, SHARED, gpu_plan

    crowded = dist.group.WORLD.comm.Split_type(MPI.COMM_TYPE_SHARED)
    on_my_node = crowded.Get_size()
    crowded.Free()
    if where == "rank 0's node is crowded" and on_my_node < 2:
        pytest.skip("needs two ranks on a node")
    devices = {"rank 0 has no GPU": 0 if rank == 0 else on_my_node,
               "rank 0's node is crowded": on_my_node - 1 if rank == 0 else on_my_node,
               "every rank has its own": on_my_node}[where]
    install(monkeypatch, devices=devices)
    plan = gpu_plan()
    assert _gathered(plan) == [plan] * size
    expected = {"rank 0 has no GPU": "rank 0: no CUDA GPU", "rank 0's node is crowded": SHARED,
                "every rank has its own": OWN}[where]
    assert expected in plan


@pytest.mark.mpi(min_size=2)
def test_an_abort_while_a_rank_waits_in_the_split_vote_is_not_held_up(bound_parent, recorder, rank, size):
    """The vote waits for the slowest rank. Neither the communicator's lock nor the GIL is held
    across it (a buffer allreduce: mpi4py's pickled ones keep the GIL while they block), so the
    watchdog's abort goes through while the vote still waits, not after it. The vote is entered
    directly here (every rank a non-member of no new group), so nothing else blocks first."""
    import threading
    import time

    from hpc_c10d.groups import _split_gpu_communicator

    gpu, aborted, start = bound_parent._transports["cuda"], [], time.monotonic()

    def abort_soon():
        time.sleep(0.5)  # rank 0 is in the vote by then; the last rank joins it at 3 s
        gpu._comms[0].abort()
        aborted.append(time.monotonic() - start)

    watchdog = threading.Thread(target=abort_soon)
    if rank == 0:
        watchdog.start()
    if rank == size - 1:
        time.sleep(3.0)
    try:
        _split_gpu_communicator(bound_parent, None, None, None)
    except DistBackendError as exc:  # rank 0 voted to split, then found its communicator aborted
        assert rank == 0 and "aborted" in str(exc)
    if rank == 0:
        watchdog.join()
        assert aborted and aborted[0] < 2.0, f"the abort went through {aborted} s in, after the vote"
