"""One rank refuses its arguments, the others do not: every rank ends the call with an error.

At the default debug level a rank that refuses a collective's arguments tells the group's other
members (mpi/notices.py): a member waiting for that collective (``Work.wait``) raises
``DistBackendError`` naming the rank, the operation, its sequence number and the refusal, and the
group is unusable on every rank afterwards. (A rank inside MPI's blocking call is ended by its
watchdog instead: tests/diagnostics/test_faults.py.) Each case runs on a group of its own whose
timeout (120 s) is far beyond the test's time limit (60 s): without the notice the others would
wait for the timeout and the time limit would fail the test. Where every rank can see the
argument is wrong, every rank raises the same error and the group stays usable. A receive that
refuses its buffer drops the message that came for it.
"""
import time
from datetime import timedelta

import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d.mpi.notices import SWITCH, mode
from support.reference import assert_in_sync

TIMEOUT = timedelta(seconds=120)

pytestmark = [pytest.mark.mpi, pytest.mark.world_size(2, 3), pytest.mark.time_limit(60),
              pytest.mark.skipif(mode() == "off", reason=f"{SWITCH}=off: no refusal notices")]


@pytest.fixture(autouse=True)
def _nobody_left_behind(world):
    """After each test, every rank must still reach the same all_reduce on the world."""
    yield
    assert_in_sync()


@pytest.fixture
def group(world):
    """A group of every rank with a long timeout, destroyed after the test whatever its state."""
    made = dist.new_group(list(range(dist.get_world_size())), timeout=TIMEOUT)
    yield made
    dist.destroy_process_group(made)


def _outcome(call):
    """The exception ``call`` raised, started or waiting for its Work, or None."""
    try:
        work = call()
        if work is not None:
            work.wait()
    except Exception as exc:  # noqa: B902 - the caller judges it
        return exc
    return None


def _refused_by_one(group, refusing, call, op, error=ValueError, sent_eagerly=False):
    """``call`` refused by rank ``refusing`` (``error``) while the others took part: they raise
    DistBackendError naming it (``sent_eagerly``: or return, their part done before the notice
    came); afterwards the group is unusable on every rank."""
    exc = _outcome(call)
    rank = dist.get_rank()
    if rank == refusing:
        assert type(exc) is error, exc
    elif not (sent_eagerly and exc is None):
        assert isinstance(exc, dist.DistBackendError), exc
        text = str(exc)
        assert f"rank {refusing} refused its arguments" in text and f"{op} #" in text, text
        assert error.__name__ in text, text
    later = np.ones(2)
    exc = _outcome(lambda: dist.all_reduce(later, group=group, async_op=True))
    assert isinstance(exc, dist.DistBackendError) and "unusable" in str(exc), exc


def test_all_to_all_refused_by_one_rank(group, rank, size):
    """The first rank's own block (sent to itself) is a size off; the others' lists are fine."""
    outs = [np.zeros(3 if rank == 0 and i == 0 else 2) for i in range(size)]
    ins = [np.zeros((2, 2))[:, 0] for _ in range(size)]  # non-contiguous blocks: copied, taken
    _refused_by_one(group, 0, lambda: dist.all_to_all(outs, ins, group=group, async_op=True), "all_to_all")


def test_gather_with_an_empty_list_on_the_destination(group, rank):
    """The destination refuses ``gather_list=[]``; the others are sending 8 MB each (MPICH waits
    for the destination to take them; Intel MPI 2021.19 lets the senders' part finish without it)."""
    x = np.ones(1_000_000)
    _refused_by_one(group, 0, lambda: dist.gather(x, gather_list=[], dst=np.int64(0), group=group, async_op=True),
                    "gather", sent_eagerly=True)


def test_gather_to_dst_true_without_a_list(group, rank):
    """``dst=True`` is rank 1 (as in torch), which has no list: only it can see that. The others'
    32 bytes may leave before the notice comes: their gather returns, their next call raises."""
    x = np.ones(4)
    _refused_by_one(group, 1, lambda: dist.gather(x, gather_list=None, dst=True, group=group, async_op=True), "gather",
                    sent_eagerly=True)


def test_scatter_refused_by_the_source_only(group, rank, size):
    """The source's list holds a block of the wrong size (others have no list to check)."""
    out = np.zeros(4)
    blocks = [np.zeros(4) for _ in range(size - 1)] + [np.zeros(5)] if rank == 0 else None
    _refused_by_one(group, 0, lambda: dist.scatter(out, blocks, src=0, group=group, async_op=True), "scatter")


@pytest.mark.parametrize("call", ["scatter with a generator", "gather of a str"])
def test_the_same_refusal_everywhere_leaves_the_group_usable(group, rank, size, call):
    """Arguments every rank can judge: the same TypeError on every rank, nothing sent, no notice
    that breaks the group."""
    if call == "scatter with a generator":
        run = lambda: dist.scatter(np.zeros(2), (np.zeros(2) for _ in range(size)), src=0, group=group)  # noqa: E731
    else:
        run = lambda: dist.gather("text", [np.zeros(2)] * size if rank == 0 else None, dst=0, group=group)  # noqa: E731
    exc = _outcome(run)
    assert type(exc) is TypeError, exc
    x = np.full(2, rank + 1.0)
    dist.all_reduce(x, group=group)
    np.testing.assert_array_equal(x, np.full(2, size * (size + 1) / 2))


@pytest.mark.parametrize("buffer", ["read-only", "broadcast (stride 0)"])
def test_a_refused_receive_drops_its_message(group, rank, size, buffer):
    """Rank 1 refuses its receive buffer after rank 0's message came: the message is dropped, so
    the next receive gets the next message, not the stale one."""
    if rank == 0:
        dist.send(np.full(8, 1.0), dst=1, group=group, tag=5)
        dist.send(np.full(8, 2.0), dst=1, group=group, tag=5)
    elif rank == 1:
        bad = np.zeros(8)
        if buffer == "read-only":
            bad.flags.writeable = False
        else:
            bad = np.broadcast_to(np.zeros(1), (8,))
        while not group.comm.Iprobe(0, 5):  # the sender's send returned, its message is here
            time.sleep(1e-3)
        exc = _outcome(lambda: dist.recv(bad, src=0, group=group, tag=5))
        assert type(exc) is ValueError, exc
        good = np.zeros(8)
        dist.recv(good, src=0, group=group, tag=5)
        np.testing.assert_array_equal(good, np.full(8, 2.0))
    x = np.ones(1)
    dist.all_reduce(x, group=group)  # the group is usable: the refusal concerned no collective
    assert x[0] == size
