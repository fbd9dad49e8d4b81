"""What the NCCL transport would pass to NCCL at 1-4 ranks, recorded by a stand-in: not GPU tests.

Each rank runs ``NCCLBackend`` with real MPI against ``support.recording_nccl`` (a recording stand-in,
not NCCL: it checks our multi-rank agreement and layout logic; it never moves data and is never
reported as a GPU test). The tests gather every rank's recorded calls over MPI and check the
per-rank (pointer, bytes, peer) layout of uneven all_to_all, gather, scatter and list reduce_scatter
against numpy, that every send has its receive, that one operation is one NCCL group, and how the
group's communicator is created (unique ID, ``ncclCommInitRank``, the members' check before it).
Run: ``mpiexec -n N python -m pytest --with-mpi -m mpi tests/gpu/test_nccl_layout.py`` (N = 1-4).
"""

from __future__ import annotations

import ctypes
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

from hpc_c10d.errors import DistBackendError
from hpc_c10d.nccl.library import _OPTIONAL, _PROTOTYPES, SPLIT_NOCOLOR, DataType, RedOp, UniqueId
from hpc_c10d.reduce_op import RedOpType
from support.recording_nccl import ARGUMENTS, ENQUEUED, Call, RecordingNccl, fake_buffer, install

F32 = 4  # bytes of a float32 element
IN, OUT = 0x1000_0000, 0x2000_0000  # fake device addresses of the inputs and the outputs
STRIDE = 0x10_0000  # between the separate arrays of a list operation (none overlaps the next)
DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice


@pytest.fixture
def mpi_world(world):
    """mpi4py's COMM_WORLD, once the session's process group exists."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def open_backend(monkeypatch, mpi_world):
    """``open_backend()``: an ``NCCLBackend`` over a duplicate of COMM_WORLD; all are closed
    (communicators destroyed on the stand-in) before the stand-in is taken away."""
    from hpc_c10d.nccl.backend import NCCLBackend

    opened = []

    def open_one() -> NCCLBackend:
        comm = mpi_world.Dup()
        opened.append((NCCLBackend(comm, None), comm))
        return opened[-1][0]

    yield open_one
    for backend, comm in opened:
        backend.close()
        comm.Free()


@pytest.fixture
def recorder(monkeypatch, mpi_world):
    return install(monkeypatch)


@pytest.fixture
def backend(recorder, open_backend):
    return open_backend()


def on_every_rank(comm: Any, operation: Callable[[], Any]) -> Any:
    """``operation()``; if it raised on any rank, raise on every rank (its error where it failed), so no
    rank waits in a later collective for one that left."""
    try:
        result, error = operation(), None
    except Exception as exc:
        result, error = None, exc
    failures = comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if any(failures):
        pytest.fail(f"the operation failed on other ranks: {failures}")
    return result


# ---- the expected layout, from the counts ---------------------------------------------------------
def counts_matrix(n: int) -> np.ndarray:
    """``M[a, b]``: elements rank ``a`` sends rank ``b``; uneven, different on every rank, some zero."""
    a, b = np.indices((n, n))
    return (2 * a + 3 * b + 1) % 5


def offsets(counts: np.ndarray) -> np.ndarray:
    """Where each block of ``counts`` elements starts when they lie back to back."""
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int)


@dataclass
class Layout:
    """One rank's part of one operation: (pointer, bytes, peer) sent and received, (dst, src, bytes) copied."""

    sends: list[tuple[int, int, int]] = field(default_factory=list)
    recvs: list[tuple[int, int, int]] = field(default_factory=list)
    copies: list[tuple[int, int, int]] = field(default_factory=list)


def all_to_all_layout(rank: int, m: np.ndarray, send_at: Callable[[int], int],
                      recv_at: Callable[[int], int]) -> Layout:
    """Rank ``rank``'s all_to_all: block p of ``m[rank, p]`` elements at ``send_at(p)`` goes to p, block p
    of ``m[p, rank]`` at ``recv_at(p)`` comes from p; its own block is copied."""
    peers = [p for p in range(len(m)) if p != rank]
    return Layout(sends=[(send_at(p), int(m[rank, p]) * F32, p) for p in peers],
                  recvs=[(recv_at(p), int(m[p, rank]) * F32, p) for p in peers],
                  copies=[(recv_at(rank), send_at(rank), int(m[rank, rank]) * F32)])


# ---- what was recorded ----------------------------------------------------------------------------
def recorded(recorder: RecordingNccl) -> Layout:
    """This rank's recorded sends, receives and device copies."""
    layout = Layout(copies=[(c["dst"], c["src"], c["nbytes"]) for c in recorder.named("copy")])
    for name, ptr, nbytes, peer, _ in recorder.p2p_layout():
        (layout.sends if name == "ncclSend" else layout.recvs).append((ptr, nbytes, peer))
    return layout


def check_exchange(recorder: RecordingNccl, expected: Layout, rank: int, comm: Any) -> None:
    """One operation's record on every rank: the expected layout, one launched unit (a group when it
    has more than one call), copies device to device, no send to self, and every send matched by a
    receive of as many bytes on its peer."""
    mine = recorded(recorder)
    units = recorder.groups()
    handles = {c["comm"] for c in recorder.named("ncclSend", "ncclRecv")}
    every = comm.allgather((mine.sends, mine.recvs))  # before any assert: a rank failing alone hangs none
    assert sorted(mine.sends) == sorted(expected.sends)
    assert sorted(mine.recvs) == sorted(expected.recvs)
    assert mine.copies == expected.copies  # in order: a staging copy comes before the blocks read from it
    assert {c["kind"] for c in recorder.named("copy")} <= {DEVICE_TO_DEVICE}
    assert rank not in {peer for _, _, peer in mine.sends + mine.recvs}
    assert len(units) == 1, f"one operation, {len(units)} launched units: {units}"
    unit = [c.name for c in units[0]]
    if sum(name in ENQUEUED for name in unit) > 1:
        assert (unit[0], unit[-1]) == ("ncclGroupStart", "ncclGroupEnd")
    assert len(handles) <= 1  # every send and receive on the group's one communicator
    sent = Counter((a, peer, n) for a, (sends, _) in enumerate(every) for _, n, peer in sends)
    received = Counter((peer, b, n) for b, (_, recvs) in enumerate(every) for _, n, peer in recvs)
    assert sent == received


# ---- layouts ---------------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
def test_uneven_all_to_all_single_sends_each_block_to_its_rank(recorder, backend, mpi_world, rank, size, in_place):
    m = counts_matrix(size)
    in_base = OUT if in_place else IN
    inp, out = fake_buffer(in_base, m[rank].sum()), fake_buffer(OUT, m[:, rank].sum())
    on_every_rank(mpi_world, lambda: backend.alltoall(out, inp, list(m[:, rank]), list(m[rank]), False, None))
    staging = [ptr for ptr, _ in recorder.cuda.allocations]
    send_base = staging[0] if in_place and staging else IN  # an aliased input is staged first
    expected = all_to_all_layout(rank, m, lambda p: send_base + offsets(m[rank])[p] * F32,
                                 lambda p: OUT + offsets(m[:, rank])[p] * F32)
    if in_place:
        expected.copies.insert(0, (send_base, in_base, inp.nbytes))
    check_exchange(recorder, expected, rank, mpi_world)
    assert len(staging) == int(in_place)


@pytest.mark.mpi(min_size=1)
def test_list_all_to_all_sends_each_array_to_its_rank(recorder, backend, mpi_world, rank, size):
    m = counts_matrix(size)
    inps = [fake_buffer(IN + p * STRIDE, m[rank, p]) for p in range(size)]
    outs = [fake_buffer(OUT + p * STRIDE, m[p, rank]) for p in range(size)]
    on_every_rank(mpi_world, lambda: backend.alltoall_list(outs, inps, False, list(outs)))
    expected = all_to_all_layout(rank, m, lambda p: IN + p * STRIDE, lambda p: OUT + p * STRIDE)
    check_exchange(recorder, expected, rank, mpi_world)


def _root(which: str, size: int) -> int:
    return 0 if which == "first" else size - 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("which", ["first", "last"])
def test_gather_receives_every_ranks_block_on_the_root_only(recorder, backend, mpi_world, rank, size, which):
    root = _root(which, size)  # rank p gathers p + 1 elements: uneven
    outs = [fake_buffer(OUT + p * STRIDE, p + 1) for p in range(size)] if rank == root else None
    on_every_rank(mpi_world, lambda: backend.gather_list(outs, fake_buffer(IN, rank + 1), root, False, []))
    if rank == root:
        expected = Layout(recvs=[(OUT + p * STRIDE, (p + 1) * F32, p) for p in range(size) if p != root],
                          copies=[(OUT + root * STRIDE, IN, (root + 1) * F32)])
    else:
        expected = Layout(sends=[(IN, (rank + 1) * F32, root)])
    check_exchange(recorder, expected, rank, mpi_world)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("which", ["first", "last"])
def test_scatter_sends_every_ranks_block_from_the_root_only(recorder, backend, mpi_world, rank, size, which):
    root = _root(which, size)  # rank p receives p + 2 elements: uneven
    inps = [fake_buffer(IN + p * STRIDE, p + 2) for p in range(size)] if rank == root else None
    on_every_rank(mpi_world, lambda: backend.scatter_list(fake_buffer(OUT, rank + 2), inps, root, False, None))
    if rank == root:
        expected = Layout(sends=[(IN + p * STRIDE, (p + 2) * F32, p) for p in range(size) if p != root],
                          copies=[(OUT, IN + root * STRIDE, (root + 2) * F32)])
    else:
        expected = Layout(recvs=[(OUT, (rank + 2) * F32, root)])
    check_exchange(recorder, expected, rank, mpi_world)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("arrays", ["chunks", "apart"])
def test_list_reduce_scatter_stages_scattered_inputs_then_makes_one_call(recorder, backend, mpi_world, rank, size,
                                                                          arrays):
    k = 3  # elements per rank (reduce_scatter's blocks are one size on every rank)
    spacing = k * F32 if arrays == "chunks" else STRIDE  # chunks lie back to back: no staging needed
    inps = [fake_buffer(IN + p * spacing, k) for p in range(size)]
    on_every_rank(mpi_world, lambda: backend.reduce_scatter_list(fake_buffer(OUT, k), inps, RedOpType.SUM, False,
                                                                 None))
    calls = recorder.named("ncclReduceScatter")
    every = mpi_world.allgather([(c["count"], c["datatype"], c["op"]) for c in calls])
    staged = arrays == "apart" and size > 1  # one array is back to back with itself
    assert len(recorder.cuda.allocations) == int(staged)
    send = recorder.cuda.allocations[0][0] if staged else IN  # the staging buffer, or the chunks themselves
    assert [(c["dst"], c["src"], c["nbytes"]) for c in recorder.named("copy")] == (
        [(send + p * k * F32, IN + p * STRIDE, k * F32) for p in range(size)] if staged else [])
    assert [(c["send"], c["recv"]) for c in calls] == [(send, OUT)]
    assert every == [[(k, DataType.FLOAT32, RedOp.SUM)]] * size  # the same call on every rank
    units = recorder.groups()
    assert [[c.name for c in unit] for unit in units] == (
        [["ncclGroupStart", *["copy"] * size, "ncclReduceScatter", "ncclGroupEnd"]] if staged
        else [["ncclReduceScatter"]])


# ---- the group's communicator ----------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_every_rank_joins_the_group_communicator_once_with_rank_zeros_id(recorder, backend, mpi_world, rank, size):
    comm = on_every_rank(mpi_world, lambda: backend._connect(0))
    again = backend._connect(0)
    inits = recorder.named("ncclCommInitRank")
    notes = mpi_world.allgather([(c["rank"], c["size"], c["uid"], c["device"]) for c in inits])
    made = recorder.named("ncclGetUniqueId")
    root_uid = mpi_world.bcast(made[0]["uid"] if rank == 0 and made else None)
    assert again is comm  # made once, then reused
    assert [c["handle"] for c in inits] == [comm.handle]
    assert notes == [[(r, size, root_uid, 0)] for r in range(size)]
    assert len(made) == (1 if rank == 0 else 0)


@pytest.mark.mpi(min_size=1)
def test_each_new_communicator_gets_a_fresh_unique_id(recorder, open_backend, mpi_world):
    for _ in range(2):
        on_every_rank(mpi_world, lambda: open_backend()._connect(0))
    uids = [c["uid"] for c in recorder.named("ncclCommInitRank")]
    every = mpi_world.allgather(uids)
    assert len(set(uids)) == 2
    assert every == [uids] * mpi_world.Get_size()


def _shared_gpu(rank: int, size: int) -> dict:
    """Ranks 0 and 1 report one PCI bus id."""
    return {"bus_id": lambda device: f"0000:{max(rank, 1):02x}:00.0"}


def _last_without_gpu(rank: int, size: int) -> dict:
    """The last rank sees no GPU."""
    return {"devices": 0 if rank == size - 1 else 1}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("members,reason", [
    (_shared_gpu, r"ranks \[0, 1\] share GPU 0000:01:00\.0"),
    (_last_without_gpu, r"rank {last} on \S+: no CUDA device is visible"),
], ids=["shared_gpu", "rank_without_gpu"])
def test_members_that_cannot_join_fail_every_rank_alike_before_nccl(monkeypatch, open_backend, mpi_world, rank,
                                                                    size, members, reason):
    recorder = install(monkeypatch, **members(rank, size))
    backend = open_backend()
    try:
        backend._connect(0)
        error: Exception | None = None
    except Exception as exc:
        error = exc
    messages = mpi_world.allgather(repr(error))
    joined = mpi_world.allgather(len(recorder.named("ncclCommInitRank")))
    assert isinstance(error, DistBackendError)
    assert messages == [messages[0]] * size
    assert re.search(reason.format(last=size - 1), str(error))
    assert joined == [0] * size
    assert backend._comms == {}


# ---- the stand-in itself (serial) ---------------------------------------------------------------
def test_the_stand_in_takes_every_entry_point_of_the_binding():
    bound = {**_PROTOTYPES, **_OPTIONAL}
    assert set(ARGUMENTS) == set(bound)
    assert {name: len(ARGUMENTS[name]) for name in bound} == {name: len(types) for name, types in bound.items()}
    assert not hasattr(RecordingNccl(has_split=False), "ncclCommSplit")
    assert RecordingNccl(version=(2, 18, 5)).version == (2, 18, 5)


def test_the_stand_in_writes_handles_and_fails_as_asked():
    nccl = RecordingNccl()
    first, second, child, none = (ctypes.c_void_p() for _ in range(4))
    uid = UniqueId.from_buffer_copy(nccl.unique_id())
    assert nccl.ncclCommInitRank(ctypes.byref(first), 2, uid, 1) == 0
    assert nccl.ncclCommInitRank(ctypes.byref(second), 2, uid, 0) == 0
    assert first.value and second.value and first.value != second.value
    assert nccl.ncclCommSplit(first.value, 4, 0, ctypes.byref(child), None) == 0
    assert nccl.ncclCommSplit(first.value, SPLIT_NOCOLOR, 0, ctypes.byref(none), None) == 0
    assert child.value not in (None, first.value, second.value) and none.value is None
    nccl.set_async_error(child.value, 6)
    error = ctypes.c_int()
    assert nccl.ncclCommGetAsyncError(child.value, ctypes.byref(error)) == 0 and error.value == 6
    nccl.fail("ncclCommInitRank", 5)
    failed = ctypes.c_void_p()
    assert nccl.ncclCommInitRank(ctypes.byref(failed), 2, uid, 1) == 5 and failed.value is None
    with pytest.raises(DistBackendError, match="NCCL error in ncclCommInitRank: invalid usage"):
        nccl.check(5, "ncclCommInitRank")
    inits = nccl.named("ncclCommInitRank")
    assert [(c["rank"], c["size"], c["uid"], c.result) for c in inits] == [
        (1, 2, nccl.named("ncclGetUniqueId")[0]["uid"], 0), (0, 2, inits[0]["uid"], 0), (1, 2, inits[0]["uid"], 5)]
    assert nccl.unique_id() != nccl.unique_id()


def test_the_stand_in_cuts_calls_into_launched_units():
    nccl = RecordingNccl()
    f32, u8 = DataType.FLOAT32, DataType.UINT8
    nccl.ncclGroupStart()
    nccl.ncclSend(0x100, 4, f32, 1, 0xC0, 0x50)
    nccl.ncclGroupStart()  # NCCL nests groups: the outer one is the unit
    nccl.ncclRecv(0x200, 8, u8, 1, 0xC0, 0x50)
    nccl.ncclGroupEnd()
    nccl.ncclGroupEnd()
    nccl.ncclCommGetAsyncError(0xC0, ctypes.byref(ctypes.c_int()))  # a query: in no unit
    nccl.ncclAllReduce(0x100, 0x100, 4, f32, RedOp.SUM, 0xC0, 0x50)
    nccl.record("copy", dst=0x300, src=0x100, nbytes=16, kind=3, stream=0x50)
    assert [[c.name for c in unit] for unit in nccl.groups()] == [
        ["ncclGroupStart", "ncclSend", "ncclGroupStart", "ncclRecv", "ncclGroupEnd", "ncclGroupEnd"],
        ["ncclAllReduce"], ["copy"]]
    assert nccl.p2p_layout() == [("ncclSend", 0x100, 16, 1, 0xC0), ("ncclRecv", 0x200, 8, 1, 0xC0)]
    assert isinstance(nccl.calls[0], Call) and nccl.named("ncclSend")[0]["peer"] == 1
