"""MPIStore across ranks: the default store, contention, blocking, big values, many keys, errors,
subgroups, and progress while the owner of a key computes without calling MPI.

Every test is collective over the world and works at any size (tests that need a second rank
skip at size 1). Store creation and ``close()`` are collective, so a failure on one rank must
never leave the others waiting: each step runs through ``_agree``, which allgathers every
rank's outcome and makes every rank raise when any rank failed; stores are closed in
``finally`` blocks that every rank then reaches together.

Keys are placed on a chosen owner by trying candidate names with ``store.owner(name)`` (the
placement is a hash, the same on every rank).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from datetime import timedelta

import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d import DistStoreError, MPIStore

pytestmark = pytest.mark.mpi

CAP = 1 << 20  # bytes per rank of the small stores used by most tests
NOLOCAL = os.environ.get("MPIR_CVAR_NOLOCAL", "") not in ("", "0")


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def comm(world):
    """mpi4py's COMM_WORLD (imported only once the session fixture has started MPI)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _agree(comm, fn=None, *args, **kwargs):
    """Run ``fn`` on this rank, then allgather the outcome: every rank raises if any rank failed.

    Doubles as a barrier, so the steps of a test stay in lockstep and no rank is left inside a
    collective (a barrier, ``close()``) while another has already failed.
    """
    result, error = None, None
    try:
        if fn is not None:
            result = fn(*args, **kwargs)
    except Exception as exc:  # AssertionError included
        error = exc
    report = comm.allgather(None if error is None else f"{type(error).__name__}: {error}"[:2000])
    if error is not None:
        raise error
    failed = {rank: text for rank, text in enumerate(report) if text is not None}
    assert not failed, f"failed on other ranks: {failed}"
    return result


@contextlib.contextmanager
def _store(group=None, **kwargs):
    """A fresh MPIStore (small unless asked otherwise), closed collectively at the end."""
    kwargs.setdefault("capacity", CAP)
    store = MPIStore(group, **kwargs)
    try:
        yield store
    finally:
        store.close()


def _owned_by(store, owner, prefix, count=1, skip=()):
    """The first ``count`` names ``prefix + str(i)`` whose owner is ``owner`` (same on every rank)."""
    names, i = [], 0
    while len(names) < count:
        name = f"{prefix}{i}"
        if store.owner(name) == owner and name not in skip:
            names.append(name)
        i += 1
        assert i < 100_000, "no key found for that owner"
    return names if count > 1 else names[0]


def assert_equal(got, expected):
    assert got == expected, (got, expected)


def _digest(data):
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- 1. default store


def test_default_store_is_a_shared_mpistore(comm, rank, size):
    store = dist._get_default_store()
    assert isinstance(store, MPIStore)
    assert dist.MPIStore is MPIStore and "MPIStore" in dist.__all__
    assert dist.distributed_c10d._get_default_store() is store
    key = "test_mpi_store/default/greeting"

    def setup():
        assert store.comm.Get_size() == size
        assert 0 <= store.owner(key) < size
        if rank == 0:
            store.set(key, b"from rank 0")

    _agree(comm, setup)
    _agree(comm, lambda: assert_equal(store.get(key), b"from rank 0"))
    _agree(comm, lambda: assert_equal(store.delete_key(key), True) if rank == 0 else None)
    _agree(comm, lambda: assert_equal(store.check([key]), False))


def test_collectives_tell_the_progress_thread_to_back_off(comm, rank, size):
    """Every collective and point-to-point operation moves ``progress.activity()`` (the groups'
    sequence numbers): the progress thread sleeps longer while it moves, so it stays out of the
    way of the rank's own MPI calls."""
    import numpy as np

    from hpc_c10d.mpi.progress import progress

    buf = np.ones(4, np.float32)
    before = progress.activity()
    dist.all_reduce(buf)
    dist.broadcast(buf, src=0)
    dist.barrier()
    if size > 1:
        peer = (rank + 1) % size
        work = dist.irecv(np.empty(4, np.float32), src=(rank - 1) % size)
        dist.send(buf, dst=peer)
        work.wait()
    assert progress.activity() - before == (5 if size > 1 else 3)
    np.testing.assert_array_equal(buf, np.full(4, size, np.float32))


def test_the_progress_thread_stays_out_of_a_rank_that_keeps_calling_mpi(comm):
    """While the operation count keeps moving (here every 10 ms, as a rank in a run of
    all-reduces of several MiB across nodes) the thread does not probe: the rank's own calls
    drive MPI, and probing beside them cost 15-20% of an 8 MiB all-reduce. Once the count
    stops, it probes again."""
    import time

    from mpi4py import MPI

    from hpc_c10d.mpi.progress import ProgressThread

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("MPI did not grant MPI_THREAD_MULTIPLE: no progress thread")
    own, started = ProgressThread(), [0]
    own.activity = lambda: started[0]
    own.join(MPI, MPI.COMM_SELF, 0.002)
    try:
        time.sleep(0.1)
        assert own.probes > 0  # idle rank: the thread ticks
        started[0] += 1
        time.sleep(0.01)  # the thread sees the count move
        before = own.probes
        for _ in range(30):
            started[0] += 1
            time.sleep(0.01)
        # a sleep stretched past 64 ms on a loaded machine may let a probe through
        assert own.probes - before <= 5
        quiet = own.probes
        time.sleep(0.3)
        assert own.probes > quiet  # the count stopped: the thread drives MPI again
    finally:
        own.leave()


def test_stopping_a_progress_thread_that_has_already_ended_is_clean(comm):
    """Stopping races with the thread seeing the stop flag and returning by itself: seen across
    nodes as BrokenPipeError from destroy_process_group, then MPI_Finalize failing on the
    communicator left behind (about 1 job in 8)."""
    from mpi4py import MPI

    from hpc_c10d.mpi.progress import ProgressThread

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("MPI did not grant MPI_THREAD_MULTIPLE: no progress thread")
    own = ProgressThread()
    own.join(MPI, MPI.COMM_SELF, 0.002)
    assert own.running
    thread = own._thread
    own._stop.set()  # the thread returns by itself before leave() writes to its pipe
    thread.join(timeout=30)
    assert not thread.is_alive()
    own.leave()
    assert not own.running and own._comm is None


def test_a_progress_thread_only_where_a_shard_is_reached_over_the_network(comm, size):
    """Where every shard is shared memory for every rank (one node) no progress thread runs; where
    some shard is reached through MPI calls (another node, MPIR_CVAR_NOLOCAL=1) one does."""
    from mpi4py import MPI

    from hpc_c10d.mpi.progress import interval_from_env, progress

    with _store() as store:
        over_network = store._table.over_network
        assert comm.allgather(over_network) == [over_network] * size
        wanted = (over_network and interval_from_env() > 0 and MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        assert progress.running == wanted
        if os.environ.get("MPIR_CVAR_NOLOCAL") == "1" and size > 1:
            assert over_network
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        several_nodes = comm.allreduce(node.Get_size() < size, op=MPI.LOR)
        node.Free()
        if several_nodes:  # another node's shard is always reached through MPI
            assert over_network


def test_event_descriptors_lists_this_process_epoll_sets():
    import select

    from hpc_c10d.mpi.progress import event_descriptors

    epoll = select.epoll()
    try:
        assert epoll.fileno() in event_descriptors()
        assert all(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]" for fd in event_descriptors())
    finally:
        epoll.close()


def test_switch_interval_is_lowered_while_requests_arrive_and_restored_after():
    import sys

    from hpc_c10d.mpi.progress import _Switch

    before = sys.getswitchinterval()
    switch = _Switch(1e-4)
    try:
        switch.lower()
        assert sys.getswitchinterval() == pytest.approx(1e-4)
        switch.lower()  # twice: the saved value is still the user's
        switch.restore()
        assert sys.getswitchinterval() == before
        switch.lower()
        sys.setswitchinterval(0.002)  # the program sets its own meanwhile: it is kept
        switch.restore()
        assert sys.getswitchinterval() == 0.002
        _Switch(0.0).lower()  # 0: Python's is left alone
        assert sys.getswitchinterval() == 0.002
    finally:
        sys.setswitchinterval(before)


# ----------------------------------------------------------------------------- 2. contended add

ADDS = 300
EXTRA = {50: (7, 1000), 150: (7, 1000), 250: (3, 5)}  # iteration -> further amounts added then
PER_RANK = ADDS + sum(sum(amounts) for amounts in EXTRA.values())


@pytest.mark.parametrize("where", ["first", "last"])
def test_contended_add_is_exact_and_linearizable(comm, rank, size, where):
    with _store() as store:
        owner = 0 if where == "first" else size - 1
        key = _owned_by(store, owner, f"ctr/{where}/")

        def hammer():
            results, amounts = [], []
            for i in range(ADDS):
                for amount in (1, *EXTRA.get(i, ())):
                    results.append(store.add(key, amount))
                    amounts.append(amount)
            assert all(b > a for a, b in zip(results, results[1:])), "this rank's add() results must increase"
            return results, amounts

        results, amounts = _agree(comm, hammer)
        total = size * PER_RANK
        everything = comm.allgather((results, amounts))

        def check():
            assert store.owner(key) == owner
            assert int(store.get(key)) == total
            assert store.add(key, 0) == total
            # every add() returned a distinct total, and in that order the steps are exactly the amounts
            returned = sorted(r for res, _ in everything for r in res)
            assert len(set(returned)) == len(returned) == size * (ADDS + sum(map(len, EXTRA.values())))
            steps = sorted(b - a for a, b in zip([0] + returned, returned))
            assert steps == sorted(a for _, am in everything for a in am)
            assert returned[-1] == total

        _agree(comm, check)


def test_contended_add_across_the_counter_word_limit(comm, rank, size):
    """Totals pass 2**43, where a counter leaves its compare-and-swap word for a text value, while
    every rank keeps adding (lock-free adds must fail over to the locked path, losing nothing)."""
    big, rounds = 1 << 40, 12
    with _store() as store:
        key = _owned_by(store, size - 1, "ctr/limit/")

        def hammer():
            results, amounts = [], []
            for _ in range(rounds):
                for amount in (big, 1, 1):
                    results.append(store.add(key, amount))
                    amounts.append(amount)
            assert all(b > a for a, b in zip(results, results[1:]))
            return results, amounts

        everything = comm.allgather(_agree(comm, hammer))
        total = size * rounds * (big + 2)
        assert total >= 1 << 43

        def check():
            assert store.get(key) == str(total).encode()
            returned = sorted(r for res, _ in everything for r in res)
            assert len(set(returned)) == len(returned) and returned[-1] == total
            steps = sorted(b - a for a, b in zip([0] + returned, returned))
            assert steps == sorted(a for _, am in everything for a in am)

        _agree(comm, check)
        _agree(comm, lambda: assert_equal(store.add(key, -total), 0) if rank == 0 else None)  # back below
        _agree(comm, lambda: assert_equal(store.get(key), b"0"))


def test_add_interleaved_with_compare_set_and_set(comm, rank, size):
    """Counter adds (lock-free path) mixed with locked updates of other keys and of the counter."""
    rounds, bump = 100, 10**6
    with _store() as store:
        ctr = _owned_by(store, 0, "mix/ctr/")
        cas = _owned_by(store, size - 1, "mix/cas/")

        _agree(comm, lambda: store.set(cas, "0:-1") if rank == 0 else None)

        def mix():
            totals, wins, bumps = [], 0, 0
            for i in range(rounds):
                totals.append(store.add(ctr, 1))
                store.set(f"mix/own/{rank}", f"{rank}:{i}")
                current = store.get(cas)
                desired = f"{int(current.split(b':')[0]) + 1}:{rank}".encode()
                if store.compare_set(cas, current, desired) == desired:  # only this rank writes ':rank'
                    wins += 1
                if i % 10 == 0:
                    assert int(store.get(ctr)) >= totals[-1]
                    assert store.get(f"mix/own/{rank}") == f"{rank}:{i}".encode()
                if rank == 0 and i % 20 == 5:  # a locked compare_set on the counter itself
                    now = store.get(ctr)
                    desired = str(int(now) + bump).encode()  # only rank 0 adds multiples of bump
                    if store.compare_set(ctr, now, desired) == desired:
                        bumps += 1
            assert all(b > a for a, b in zip(totals, totals[1:]))
            return wins, bumps

        wins, bumps = _agree(comm, mix)
        all_wins = comm.allgather(wins)
        all_bumps = sum(comm.allgather(bumps))

        def check():
            assert int(store.get(ctr)) == size * rounds + bump * all_bumps
            count, _ = store.get(cas).split(b":")
            assert int(count) == sum(all_wins)
            assert sum(all_wins) >= 1  # a compare_set only fails when another one has won
            if size == 1:
                assert all_wins == [rounds] and all_bumps == rounds // 20
            for r in range(size):
                assert store.get(f"mix/own/{r}") == f"{r}:{rounds - 1}".encode()

        _agree(comm, check)


# ----------------------------------------------------------------------------- 3. compare_set


def test_compare_set_has_a_single_winner(comm, rank, size):
    rounds = 20
    with _store() as store:
        returned = []
        for i in range(rounds):
            comm.Barrier()  # all ranks race for the same fresh key
            returned.append(store.compare_set(f"leader/{i}", "", f"r{rank}"))
        everyone = comm.allgather(returned)

        def check():
            for i in range(rounds):
                winners = {per_rank[i] for per_rank in everyone}
                assert len(winners) == 1, (i, winners)
                winner = winners.pop()
                assert winner in {f"r{r}".encode() for r in range(size)}
                assert store.get(f"leader/{i}") == winner
            assert store.num_keys() == rounds

        _agree(comm, check)


@pytest.mark.parametrize("form", ["text", "counter"])
def test_compare_set_increment_loop(comm, rank, size, form):
    """50 read/compare_set increments per rank; every rank's desired values are its own, so a win
    is recognised without ambiguity. "counter" values are canonical integers (the counter word),
    "text" values are "count:rank"."""
    per_rank = 50
    if form == "text":
        encode = lambda n: f"{n}:{rank}".encode()  # noqa: E731
        decode = lambda v: int(v.split(b":")[0])  # noqa: E731
    else:
        encode = lambda n: str(n * size + rank).encode()  # noqa: E731
        decode = lambda v: int(v) // size  # noqa: E731
    with _store() as store:
        key = _owned_by(store, size // 2, f"casloop/{form}/")
        _agree(comm, lambda: store.set(key, "0:0" if form == "text" else "0") if rank == 0 else None)

        def loop():
            attempts = 0
            for _ in range(per_rank):
                while True:
                    attempts += 1
                    current = store.get(key)
                    desired = encode(decode(current) + 1)
                    if store.compare_set(key, current, desired) == desired:
                        break
            return attempts

        attempts = _agree(comm, loop)
        comm.allgather(attempts)

        def check():
            assert decode(store.get(key)) == per_rank * size

        _agree(comm, check)


def test_concurrent_append_and_queue(comm, rank, size):
    """append and queue_push from every rank at once lose nothing and keep each rank's order;
    queue_pop hands every item to exactly one rank."""
    items = 40
    with _store() as store:
        def push():
            for i in range(items):
                store.append("log", f"<{rank}:{i}>")
                store.queue_push("q", f"{rank}:{i}")

        _agree(comm, push)

        def check_append():
            log = store.get("log").decode()
            entries = log[1:-1].split("><")
            assert len(entries) == size * items
            for r in range(size):
                assert [e for e in entries if e.startswith(f"{r}:")] == [f"{r}:{i}" for i in range(items)]
            assert store.queue_len("q") == size * items

        _agree(comm, check_append)

        def pop():
            return [store.queue_pop("q").decode() for _ in range(items)]

        popped = comm.allgather(_agree(comm, pop))

        def check_pop():
            assert sorted(p for per_rank in popped for p in per_rank) == \
                sorted(f"{r}:{i}" for r in range(size) for i in range(items))
            for mine in popped:  # the queue is FIFO: what one rank pops keeps each pusher's order
                for r in range(size):
                    seq = [int(p.split(":")[1]) for p in mine if p.startswith(f"{r}:")]
                    assert seq == sorted(seq)
            assert store.queue_len("q") == 0
            with pytest.raises(dist.QueueEmptyError):
                store.queue_pop("q", block=False)

        _agree(comm, check_pop)


# ----------------------------------------------------------------------------- 4. large values

BIG = 64 << 20


def test_large_values_round_trip_and_reuse_memory(comm, rank, size):
    with _store(capacity=96 << 20) as store:
        key = "big/value"
        owner = store.owner(key)
        other = _owned_by(store, owner, "big/other/")  # same owner: it cannot hold a second 64 MiB

        def put(seed):
            data = np.random.default_rng(seed).bytes(BIG)
            store.set(key, data)
            return _digest(data)

        def expect(digest):
            data = store.get(key)
            assert len(data) == BIG
            assert _digest(data) == digest

        digest = comm.bcast(_agree(comm, lambda: put(1) if rank == 0 else None), root=0)
        _agree(comm, expect, digest)

        _agree(comm, lambda: store.set(key, b"small now") if rank == 0 else None)
        _agree(comm, lambda: assert_equal(store.get(key), b"small now"))

        # a different 64 MiB value: only fits because the freed block is reused
        digest = comm.bcast(_agree(comm, lambda: put(2) if rank == 0 else None), root=0)
        _agree(comm, expect, digest)

        def second_big_value():
            with pytest.raises(DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
                store.set(other, bytes(BIG))
            assert not store.check([other])

        _agree(comm, second_big_value if rank == 0 else None)
        _agree(comm, expect, digest)

        digest = comm.bcast(_agree(comm, lambda: put(3) if rank == 0 else None), root=0)  # in place
        _agree(comm, expect, digest)
        _agree(comm, lambda: assert_equal(store.delete_key(key), True) if rank == 0 else None)
        _agree(comm, lambda: assert_equal(store.num_keys(), 0))


# ----------------------------------------------------------------------------- 5. many keys

MANY = 500


def _many_key(r, i):
    return f"k{r}/{i}" + ("/" + "L" * 110 if i % 9 == 0 else "")  # some keys over 100 bytes


def _many_value(r, i):
    return f"v{r}/{i}/".encode() + b"x" * (i % 130)  # 6 to ~140 bytes: inline and heap


def test_many_keys(comm, rank, size):
    with _store(max_keys=4096) as store:
        _agree(comm, lambda: [store.set(_many_key(rank, i), _many_value(rank, i)) for i in range(MANY)])
        expected = sorted(_many_key(r, i) for r in range(size) for i in range(MANY))

        def read_all():
            for r in range(size):
                for i in range(MANY):
                    assert store.get(_many_key(r, i)) == _many_value(r, i), (r, i)
            assert store.num_keys() == size * MANY
            assert sorted(store.list_keys()) == expected
            owners = {store.owner(k) for k in expected}
            assert owners == set(range(size))  # spread over the owners (at size 1 just rank 0)

        _agree(comm, read_all)
        _agree(comm, lambda: [assert_equal(store.delete_key(_many_key(rank, i)), True) for i in range(MANY)])

        def empty():
            assert store.num_keys() == 0
            assert store.list_keys() == []
            assert not any(store.check([_many_key(r, i)]) for r in range(size) for i in range(0, MANY, 17))

        _agree(comm, empty)


def test_stale_slot_hints_fall_back_to_a_full_lookup(comm, rank, size):
    """A get remembers the slot it found a value in; a key that moved, went or turned into a
    counter since must still read right (every rank reads every other rank's keys)."""
    with _store(max_keys=256) as store:
        table = store._table
        _agree(comm, lambda: [store.set(f"hint{rank}-{i}", f"v{i}") for i in range(8)])

        def read_all(expect):
            for r in range(size):
                for i in range(8):
                    assert store.get(f"hint{r}-{i}") == expect(r, i), (r, i)

        _agree(comm, read_all, lambda r, i: f"v{i}".encode())  # every key now has a hint
        own = [f"hint{rank}-{i}".encode() for i in range(8)]
        _agree(comm, lambda: [table._hints.__setitem__(key, table._hints[own[0]]) for key in own[1:]])  # wrong slots
        _agree(comm, read_all, lambda r, i: f"v{i}".encode())
        _agree(comm, lambda: [store.delete_key(f"hint{rank}-{i}") for i in range(0, 8, 2)])
        _agree(comm, lambda: [store.add(f"hint{rank}-{i}", 5) for i in range(0, 8, 2)])  # re-created as counters
        _agree(comm, lambda: [store.set(f"hint{rank}-{i}", "w" * 100) for i in range(1, 8, 2)])  # moved to the heap
        _agree(comm, read_all, lambda r, i: b"5" if i % 2 == 0 else b"w" * 100)


def test_readers_never_see_a_half_written_value(comm, rank, size):
    """Rank 0 rewrites one small key while the others read it lock-free (the checksum path):
    every value read must be one that was written whole, never a mix of two."""
    if size < 2:
        pytest.skip("needs a writer and a reader")
    with _store() as store:
        _agree(comm, lambda: store.set("torn", "0" * 64) if rank == 0 else None)
        rounds = 300

        def race():
            if rank == 0:
                for i in range(1, rounds + 1):
                    store.set("torn", f"{i:08d}" * 8 if i % 3 else f"{i:04d}" * 4)  # two lengths, same slot
                store.set("torn-done", "1")
                return
            seen = 0
            while not store.check(["torn-done"]) or seen == 0:
                value = store.get("torn").decode()
                width = 8 if len(value) == 64 else 4
                assert len(value) in (16, 64) and value == value[:width] * (len(value) // width), value
                seen += 1

        _agree(comm, race)


def test_one_node_shards_are_shared_memory(comm, rank, size):
    """Under MPICH on one node every shard is plain memory to every rank: reads and writes skip
    Get/Put and the lock and counters use the CPU's atomics. On the network path only a rank's
    own shard is, and MPI's atomics serve everyone. On several nodes a rank maps the shards of
    the ranks on its own node, and MPI's atomics serve everyone (they are all or nothing). Every
    path gives the same answers (the other tests run on all of them)."""
    from mpi4py import MPI

    if "MPICH" not in MPI.Get_library_version():
        pytest.skip("only MPICH is known to share Win.Allocate memory (Open MPI 5 and Intel MPI 2021.19, "
                    "though MPICH-derived, do not)")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # with NOLOCAL each rank is a node of its own
    node_of = comm.allgather(min(node.allgather(rank)))  # each rank's node, named by its lowest rank
    node.Free()
    one_node = len(set(node_of)) == 1
    with _store() as store:
        shared = [memory is not None for memory in store._table._shared]
        expected = [node_of[owner] == node_of[rank] for owner in range(size)]  # its own shard, always
        _agree(comm, lambda: assert_equal(shared, expected))
        kind = type(store._table._atomics).__name__
        _agree(comm, lambda: assert_equal(kind, "SharedAtomics" if one_node else "MPIAtomics"))

        # The CPU's atomics are all or nothing: one rank that cannot map a shard puts every rank on MPI's.
        from hpc_c10d.store import atomics

        table = store._table
        mine = [None if rank == size - 1 else window for window in table._shared]
        picked = type(atomics.pick(MPI, store.comm, table._win, mine)).__name__
        _agree(comm, lambda: assert_equal(picked, "MPIAtomics"))


# ----------------------------------------------------------------------------- 6. timeouts and blocking


def test_get_timeout_names_the_key(comm, rank, size):
    with _store(timeout=timedelta(seconds=60)) as store:
        store.set_timeout(timedelta(milliseconds=300))
        assert store.timeout == timedelta(milliseconds=300)

        def timeout():
            start = time.monotonic()
            with pytest.raises(DistStoreError) as info:
                store.get("never_set_key_qz")
            assert time.monotonic() - start >= 0.25
            assert "never_set_key_qz" in str(info.value)

        _agree(comm, timeout)


def test_wait_timeout_names_only_missing_keys(comm, rank, size):
    with _store(timeout=timedelta(seconds=60)) as store:
        _agree(comm, lambda: store.set("present_key_a", "yes") if rank == size - 1 else None)

        def timeout():
            with pytest.raises(DistStoreError) as info:
                store.wait(["present_key_a", "never_key_b"], timedelta(milliseconds=300))
            message = str(info.value)
            assert "never_key_b" in message
            assert "present_key_a" not in message
            store.wait(["present_key_a"], timedelta(milliseconds=300))  # no error

        _agree(comm, timeout)


def test_blocking_get_and_wait_across_ranks(comm, rank, size):
    if size < 2:
        pytest.skip("needs a second rank to set the key later")
    with _store(timeout=timedelta(seconds=30)) as store:
        _agree(comm)

        def run():
            start = time.monotonic()
            if rank == 1:
                time.sleep(0.2)
                store.set("late/wait", "w")
                time.sleep(0.1)
                store.set("late/get", "g")
                return None
            store.wait(["late/wait"])
            waited = time.monotonic() - start
            assert store.get("late/get") == b"g"  # started before the set
            got = time.monotonic() - start
            assert waited > 0.05 and got > waited, (waited, got)
            return waited, got

        _agree(comm, run)


# ----------------------------------------------------------------------------- 7. prefix isolation


def test_prefix_stores_do_not_collide(comm, rank, size):
    with _store() as store:
        job1, job2 = dist.PrefixStore("job1", store), dist.PrefixStore("job2", store)
        mine = job1 if rank % 2 == 0 else job2

        def write():
            if rank == 0:
                job1.set("x", "one")
            if rank == size - 1:
                job2.set("x", "two")
            mine.add("n", 1)

        _agree(comm, write)
        evens, odds = (size + 1) // 2, size // 2

        def read():
            assert job1.get("x") == b"one" and job2.get("x") == b"two"
            assert store.get("job1/x") == b"one" and store.get("job2/x") == b"two"
            assert not store.check(["x"]) and not store.check(["n"])
            assert int(store.get("job1/n")) == evens
            assert job2.check(["n"]) == (odds > 0)
            if odds:
                assert int(job2.get("n")) == odds
            assert sorted(job1.list_keys()) == ["n", "x"]
            assert {"job1/x", "job2/x", "job1/n"} <= set(store.list_keys())

        _agree(comm, read)
        _agree(comm, lambda: assert_equal(job1.delete_key("x"), True) if rank == size - 1 else None)

        def after():
            assert not job1.check(["x"]) and job2.get("x") == b"two"

        _agree(comm, after)


# ----------------------------------------------------------------------------- 8. busy owner


def _spin_until(path, seconds, chunk=0.02):
    """Pure-Python arithmetic, no MPI, until ``path`` exists or ``seconds`` pass.

    The flag file is looked at once per ``chunk`` seconds of arithmetic: a loop that drops and
    retakes the GIL every few hundred microseconds (a file check per millisecond, say) can starve
    every other Python thread under CPython's GIL, the progress thread included; see
    hpc_c10d/mpi/progress.py."""
    start = time.monotonic()
    deadline, x, spins = start + seconds, 1, 0
    while True:
        until = time.monotonic() + chunk  # time.monotonic keeps the GIL
        while time.monotonic() < until:
            for _ in range(200):
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            spins += 1
        if os.path.exists(path):
            return True, spins, time.monotonic() - start
        if time.monotonic() > deadline:
            return False, spins, time.monotonic() - start


def _busy_ops(store, kind, rank, size, keys):
    """What a non-owner does while rank 0 (the owner of every key here) computes; returns op count."""
    workers = list(range(1, size))
    ops = 0
    if kind == "mixed":
        own = keys[rank]
        store.set(own, f"val{rank}")
        assert store.get(own) == f"val{rank}".encode()
        for _ in range(5):
            store.add(keys[0], rank)
        assert store.compare_set(own, f"val{rank}", f"new{rank}") == f"new{rank}".encode()
        won = store.compare_set(keys[size], "", f"r{rank}")
        assert won in {f"r{w}".encode() for w in workers}
        assert store.get(keys[size]) == won
        peer = keys[workers[(rank) % len(workers)]]  # the next worker's key (itself at size 2)
        store.wait([peer])
        assert store.get(peer) in {f"val{workers[rank % len(workers)]}".encode(),
                                   f"new{workers[rank % len(workers)]}".encode()}
        assert store.check([own, peer])
        ops = 11
    elif kind == "counter":  # the counter was read before the busy phase: adds are compare-and-swaps
        results = [store.add(keys[0], 1) for _ in range(50)]
        assert all(b > a for a, b in zip(results, results[1:]))
        assert int(store.get(keys[0])) >= results[-1]
        ops = 51
    else:  # heap: values well over the 80 inline bytes
        initial, theirs = b"H" * 300, {(f"{w}".encode() * 400)[:400] for w in workers}
        assert store.get(keys[0]) in {initial} | theirs  # another worker may have swapped it already
        mine = (f"{rank}".encode() * 400)[:400]
        store.set(keys[rank], mine)
        assert store.get(keys[rank]) == mine
        won = store.compare_set(keys[0], initial, mine)
        assert won in theirs
        store.set(keys[rank], mine * 3)
        assert store.get(keys[rank]) == mine * 3
        ops = 6
    return ops


@pytest.mark.parametrize("kind", ["mixed", "counter", "heap"])
def test_busy_owner_still_serves_other_ranks(comm, rank, size, kind, capsys):
    """Rank 0 owns every key used and computes in pure Python without calling MPI; the other ranks'
    store operations must complete meanwhile (shared memory, or MPIStore's progress thread)."""
    if size < 2:
        pytest.skip("needs a busy owner and at least one other rank")
    from mpi4py import MPI

    deadline = 30.0
    with _store(timeout=timedelta(seconds=120)) as store:
        keys = _owned_by(store, 0, f"busy/{kind}/", count=size + 1)
        flagdir = comm.bcast(tempfile.mkdtemp(prefix="hpc_c10d_busy_") if rank == 0 else None, root=0)
        flag = os.path.join(flagdir, "done")
        workers = comm.Split(MPI.UNDEFINED if rank == 0 else 0, rank)
        try:
            def prepare():
                if kind == "counter" and rank == 0:
                    store.set(keys[0], "0")
                if kind == "heap" and rank == 0:
                    store.set(keys[0], b"H" * 300)

            _agree(comm, prepare)
            if kind == "counter":  # every rank learns the counter's slot: later adds take the lock-free path
                _agree(comm, lambda: assert_equal(store.get(keys[0]), b"0"))
            _agree(comm)

            if rank == 0:
                seen, spins, spun = _spin_until(flag, deadline)
                outcome = ("owner", seen, spins, spun, None)
            else:
                start, error, ops = time.monotonic(), None, 0
                try:
                    ops = _busy_ops(store, kind, rank, size, keys)
                except Exception as exc:  # reported below, after the owner stops spinning
                    error = f"{type(exc).__name__}: {exc}"
                took = time.monotonic() - start
                workers.Barrier()
                if rank == size - 1:
                    open(flag, "w").close()
                outcome = ("worker", ops, took, error)
            everyone = comm.allgather(outcome)
        finally:
            if workers != MPI.COMM_NULL:
                workers.Free()
            if rank == 0:
                shutil.rmtree(flagdir, ignore_errors=True)

        _, seen, spins, spun, _ = everyone[0]
        timings = ", ".join(f"rank {r}: {o[1]} ops in {o[2] * 1e3:.1f} ms" for r, o in enumerate(everyone) if r)
        if rank == 0:
            with capsys.disabled():
                print(f"\n[busy owner, {kind}] size={size} NOLOCAL={NOLOCAL}: owner spun {spun:.3f} s "
                      f"({spins} rounds); {timings}", flush=True)
        errors = {r: o[3] for r, o in enumerate(everyone) if r and o[3]}
        assert not errors, f"store operations failed while the owner was busy: {errors}"
        assert seen, (f"the owner computed for {deadline} s without the other ranks' store operations "
                      f"completing ({timings})")

        def check():
            if kind == "mixed":
                assert int(store.get(keys[0])) == 5 * sum(range(1, size))
                for w in range(1, size):
                    assert store.get(keys[w]) == f"new{w}".encode()
            elif kind == "counter":
                assert int(store.get(keys[0])) == 50 * (size - 1)
            else:
                assert store.get(keys[0]) in {(f"{w}".encode() * 400)[:400] for w in range(1, size)}

        _agree(comm, check)


# ----------------------------------------------------------------------------- 9. capacity, max_keys, settings


def _small_keys(r):
    return {f"cap/{r}/inline": f"small{r}".encode(), f"cap/{r}/heap": bytes([65 + r]) * 300}


def test_capacity_error_keeps_other_keys(comm, rank, size):
    with _store(capacity=CAP) as store:
        def fill():
            for key, value in _small_keys(rank).items():
                store.set(key, value)
            store.add(f"cap/{rank}/ctr", 5 + rank)

        _agree(comm, fill)

        def too_big():
            with pytest.raises(DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
                store.set(f"cap/{rank}/big", bytes(2 << 20))
            assert not store.check([f"cap/{rank}/big"])

        _agree(comm, too_big)

        def intact():
            for r in range(size):
                for key, value in _small_keys(r).items():
                    assert store.get(key) == value
                assert store.get(f"cap/{r}/ctr") == str(5 + r).encode()
            assert store.num_keys() == 3 * size

        _agree(comm, intact)
        _agree(comm, lambda: store.set(f"cap/{rank}/after", "still usable"))
        _agree(comm, lambda: assert_equal(store.get(f"cap/{(rank + 1) % size}/after"), b"still usable"))


def test_oversized_overwrite_changes_nothing(comm, rank, size):
    """Overwriting an existing key (inline text, heap text, counter) with a value that cannot fit
    raises DistStoreError and leaves the old value (MPIStore: "Running out ... changes nothing")."""
    with _store(capacity=CAP) as store:
        def fill():
            for key, value in _small_keys(rank).items():
                store.set(key, value)
            store.add(f"cap/{rank}/ctr", 5 + rank)
            store.set(f"cap/{rank}/ctr2", str(7 + rank))  # a counter too (canonical integer text)

        _agree(comm, fill)

        def overwrite():
            for key in (*_small_keys(rank), f"cap/{rank}/ctr"):
                with pytest.raises(DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
                    store.set(key, bytes(2 << 20))
            with pytest.raises(DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
                store.compare_set(f"cap/{rank}/ctr2", str(7 + rank), bytes(2 << 20))

        _agree(comm, overwrite)

        def intact():
            wrong = {}
            for r in range(size):
                expected = {**_small_keys(r), f"cap/{r}/ctr": str(5 + r).encode(),
                            f"cap/{r}/ctr2": str(7 + r).encode()}
                for key, value in expected.items():
                    got = store.get(key)
                    if got != value:
                        wrong[key] = (value, got[:20])
            assert not wrong, f"a failed oversized set changed these keys (expected, got): {wrong}"
            assert store.num_keys() == 4 * size

        _agree(comm, intact)


def test_max_keys_error_across_ranks(comm, rank, size):
    with _store(max_keys=8) as store:
        key = _owned_by(store, 0, f"full/{rank}/", count=1)

        def fill():  # rank 0 fills its own shard up to max_keys
            if rank == 0:
                for name in _owned_by(store, 0, "full/", count=8):
                    store.set(name, "v")

        _agree(comm, fill)

        def one_more():
            with pytest.raises(DistStoreError, match="HPC_C10D_STORE_MAX_KEYS"):
                store.set(key, "v")
            assert store.num_keys() == 8

        _agree(comm, one_more)


def _try_create(comm, **kwargs):
    """Create a store expecting an error; return the error (closing the store if every rank got one)."""
    try:
        store = MPIStore(**kwargs)
    except Exception as exc:
        store, error = None, exc
    else:
        error = None
    created = comm.allgather(store is not None)
    if all(created):
        store.close()
    return error


def test_mismatched_or_bad_settings_raise_on_every_rank(comm, rank, size):
    if size > 1:
        error = _try_create(comm, capacity=CAP + 4096 * rank)
        _agree(comm, lambda: assert_equal(type(error), ValueError))
        assert "capacity" in str(error)
        error = _try_create(comm, capacity=CAP, max_keys=64 + rank)
        _agree(comm, lambda: assert_equal(type(error), ValueError))

    bad = size - 1
    error = _try_create(comm, capacity="big" if rank == bad else CAP)
    _agree(comm, lambda: assert_equal(type(error), TypeError))
    assert f"rank {bad}" in str(error) and "capacity" in str(error)

    error = _try_create(comm, capacity=CAP, max_keys=0 if rank == bad else 64)
    _agree(comm, lambda: assert_equal(type(error), ValueError))
    assert f"rank {bad}" in str(error) and "max_keys" in str(error)

    # the world still works: a good store can be made and used
    with _store() as store:
        _agree(comm, lambda: store.add("ok", 1))
        _agree(comm, lambda: assert_equal(int(store.get("ok")), size))


def test_capacity_from_environment(comm, rank, size):
    from hpc_c10d.store.mpi_store import CAPACITY_ENV, MAX_KEYS_ENV

    saved = {name: os.environ.get(name) for name in (CAPACITY_ENV, MAX_KEYS_ENV)}
    os.environ[CAPACITY_ENV], os.environ[MAX_KEYS_ENV] = "2M", "100"
    try:
        store = MPIStore()
        explicit = MPIStore(capacity=CAP)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        _agree(comm, lambda: assert_equal((store.capacity, store.max_keys), (2 << 20, 100)))
        _agree(comm, lambda: assert_equal((explicit.capacity, explicit.max_keys), (CAP, 100)))
        _agree(comm, lambda: store.set(f"env/{rank}", "x"))
        _agree(comm, lambda: assert_equal(store.num_keys(), size))
        assert "capacity=2097152" in repr(store) and "max_keys=100" in repr(store)
    finally:
        explicit.close()
        store.close()


def test_a_closed_store_raises_instead_of_touching_freed_memory(comm, rank, size):
    """After close() the windows are gone (shared-memory ones included): every operation raises
    DistStoreError, on every path a value can take (cached slot, cached counter, fresh key)."""
    with _store() as store:
        _agree(comm, lambda: (store.set(f"text{rank}", "v"), store.add(f"count{rank}", 1)))
        _agree(comm, lambda: (store.get(f"text{rank}"), store.get(f"count{rank}")))  # slots cached
    for operation in (lambda: store.get(f"text{rank}"), lambda: store.get(f"count{rank}"),
                      lambda: store.add(f"count{rank}", 1), lambda: store.set("new", "v"),
                      lambda: store.check(["new"]), store.num_keys, store.list_keys):
        with pytest.raises(DistStoreError, match="closed"):
            operation()
    assert store.capacity == CAP and "MPIStore" in repr(store)
    store.close()  # a second close is harmless


# ----------------------------------------------------------------------------- 10. subgroup


def test_store_over_a_subgroup(comm, rank, size):
    if size < 2:
        pytest.skip("needs a two-rank subgroup")
    group = dist.new_group(ranks=[0, 1])  # collective over the world

    def members():
        if rank not in (0, 1):
            assert group == dist.GroupMember.NON_GROUP_MEMBER
            return
        try:
            with _store(group) as store:
                inner = store.comm
                assert inner.Get_size() == 2 and inner.Get_rank() == rank
                names = [_owned_by(store, owner, "sub/") for owner in (0, 1)]
                _agree(inner, lambda: [store.set(f"sub/{rank}", f"member{rank}"), store.add("sub/ctr", rank + 1)])

                def check():
                    assert store.get(f"sub/{1 - rank}") == f"member{1 - rank}".encode()
                    assert int(store.get("sub/ctr")) == 3
                    assert store.num_keys() == 3
                    assert {store.owner(n) for n in names} == {0, 1}

                _agree(inner, check)
        finally:
            dist.destroy_process_group(group)

    _agree(comm, members)


# ----------------------------------------------------------------------------- 11. delete while polled


def test_delete_while_others_poll(comm, rank, size):
    """Rank 0 rewrites a key (inline and heap values in turn) while the other ranks read it in a
    loop, then deletes it. Readers see one of the two values, never a torn one, until check()
    turns False. A reader whose get() started just before the deletion blocks; rank 0 releases it
    after a pause with a sentinel value (so no reader sits out a store timeout)."""
    if size < 2:
        pytest.skip("needs readers besides the deleting rank")
    inline, heap, sentinel = b"A" * 40, bytes(range(256)) * 3, b"released after deletion"
    with _store(timeout=timedelta(seconds=30)) as store:
        key = _owned_by(store, size - 1, "poll/")
        ready = [f"poll/ready/{r}" for r in range(1, size)]
        _agree(comm, lambda: store.set(key, inline) if rank == 0 else None)

        def run():
            if rank == 0:
                rewrites, stop = 0, time.monotonic() + 20
                while rewrites < 100 or (not store.check(ready) and time.monotonic() < stop):
                    store.set(key, heap if rewrites % 2 == 0 else inline)
                    rewrites += 1
                assert store.check(ready), "readers never reported"
                assert store.delete_key(key) is True
                time.sleep(0.2)
                store.set(key, sentinel)
                return rewrites
            reads, bad, saw_deleted = 0, [], False
            while True:
                if not store.check([key]):
                    saw_deleted = True
                    break
                value = store.get(key)
                if value == sentinel:
                    break
                reads += 1
                if value not in (inline, heap):
                    bad.append(value[:32])
                if reads == 5:
                    store.set(f"poll/ready/{rank}", "1")
            assert not bad, f"read garbage: {bad[:3]}"
            assert reads >= 5
            return saw_deleted

        _agree(comm, run)
        _agree(comm, lambda: assert_equal(store.delete_key(key), True) if rank == 0 else None)
        _agree(comm, lambda: assert_equal(store.check([key]), False))
