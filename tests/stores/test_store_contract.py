"""The c10d Store contract, one suite run against every store type.

Store kinds (the ``kind`` parameter):

  hash           HashStore()
  file           FileStore(tmp_path/..., 1)
  prefix_hash    PrefixStore("pfx", HashStore())
  prefix_python  PrefixStore("pfx", DictStore()): DictStore is a Python subclass of Store that
                 implements only the core methods on a dict, so append/multi_get/multi_set come
                 from the base class and queues/list_keys are not available
  mpi            MPIStore(MPI.COMM_SELF, capacity=1 MiB, max_keys=256)   (mpi-marked)
  prefix_mpi     PrefixStore("p", MPIStore(...))                          (mpi-marked)

The MPIStore kinds are built over COMM_SELF, so every rank has a store of its own and the tests
run unchanged at every mpiexec size. Expected results are torch 2.13's (HashStore/FileStore).
"""
import operator
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest

import hpc_c10d as dist
from support.launch import ROOT, fresh_env


SHORT = timedelta(milliseconds=200)  # for the tests that wait for a timeout on purpose
SAFE = timedelta(seconds=10)  # default in these tests: a hang fails fast instead of after 300 s

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# A user's own store: a Python subclass with only the core methods.
# --------------------------------------------------------------------------------------------
_STOLL = re.compile(rb"\s*([+-]?\d+)")


def _to_bytes(value):
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    raise TypeError(f"value must be str or bytes, got {type(value).__name__}")


class DictStore(dist.Store):
    """Implements set, get, add, compare_set, wait, check, delete_key, num_keys; nothing else."""

    def __init__(self):
        super().__init__()
        self.data = {}
        self.lock = threading.Lock()

    def _wait_for(self, keys, timeout):
        if not isinstance(timeout, timedelta):
            raise TypeError("timeout must be a timedelta")
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            with self.lock:
                missing = [k for k in keys if k not in self.data]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"wait timeout; keys not set: {missing}")
            time.sleep(0.002)

    def set(self, key, value):
        value = _to_bytes(value)
        with self.lock:
            self.data[key] = value

    def get(self, key):
        self._wait_for([key], self.timeout)
        with self.lock:
            return self.data[key]

    def add(self, key, amount):
        amount = operator.index(amount)
        with self.lock:
            old = self.data.get(key, b"")
            if old:
                match = _STOLL.match(old)
                if match is None:
                    raise ValueError(f"{old!r} is not an integer")
                amount += int(match.group(1))
            total = (amount - INT64_MIN) % (1 << 64) + INT64_MIN
            self.data[key] = str(total).encode()
            return total

    def compare_set(self, key, expected_value, desired_value):
        expected, desired = _to_bytes(expected_value), _to_bytes(desired_value)
        with self.lock:
            if key not in self.data:
                if expected == b"":
                    self.data[key] = desired
                    return desired
                return expected
            if self.data[key] == expected:
                self.data[key] = desired
                return desired
            return self.data[key]

    def wait(self, keys, timeout=None):
        self._wait_for(list(keys), self.timeout if timeout is None else timeout)

    def check(self, keys):
        with self.lock:
            return all(k in self.data for k in keys)

    def delete_key(self, key):
        with self.lock:
            return self.data.pop(key, None) is not None

    def num_keys(self):
        with self.lock:
            return len(self.data)


# --------------------------------------------------------------------------------------------
# Building stores
# --------------------------------------------------------------------------------------------
SERIAL_KINDS = ["hash", "file", "prefix_hash", "prefix_python"]
MPI_KINDS = ["mpi", "prefix_mpi"]
KINDS = [pytest.param(k, id=k) for k in SERIAL_KINDS] + \
        [pytest.param(k, id=k, marks=pytest.mark.mpi) for k in MPI_KINDS]
BASE_KINDS = [pytest.param(k, id=k) for k in ("hash", "file", "python")] + \
             [pytest.param("mpi", id="mpi", marks=pytest.mark.mpi)]
PREFIXES = {"prefix_hash": "pfx", "prefix_python": "pfx", "prefix_mpi": "p"}


class Stores:
    """Makes stores of any kind and closes the ones that need it when the test ends."""

    def __init__(self, request, tmp_path):
        self._request, self._tmp, self._files, self.to_close = request, tmp_path, 0, []

    def base(self, kind, capacity=1 << 20, max_keys=256):
        if kind == "hash":
            return dist.HashStore()
        if kind == "python":
            return DictStore()
        if kind == "file":
            self._files += 1
            store = dist.FileStore(str(self._tmp / f"store{self._files}"), 1)
        elif kind == "mpi":
            self._request.getfixturevalue("world")  # MPI is up, as everywhere in the suite
            from mpi4py import MPI

            store = dist.MPIStore(MPI.COMM_SELF, capacity=capacity, max_keys=max_keys)
        else:
            raise AssertionError(kind)
        self.to_close.append(store)
        return store

    def make(self, kind, **settings):
        if kind.startswith("prefix_"):
            return dist.PrefixStore(PREFIXES[kind], self.base(kind[len("prefix_"):], **settings))
        return self.base(kind, **settings)

    def close(self):
        while self.to_close:
            self.to_close.pop().close()


@pytest.fixture
def stores(request, tmp_path):
    made = Stores(request, tmp_path)
    yield made
    made.close()


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


@pytest.fixture
def store(kind, stores):
    s = stores.make(kind)
    s.set_timeout(SAFE)
    return s


def extended(kind):
    """Queues and list_keys: every kind but the plain Python subclass."""
    return kind != "prefix_python"


def _times_out(call, timeout):
    """Run ``call``, which must raise DistStoreError after about ``timeout``; return the error."""
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError) as info:
        call()
    elapsed = time.monotonic() - start
    assert isinstance(info.value, RuntimeError)
    assert timeout.total_seconds() * 0.9 <= elapsed < timeout.total_seconds() + 5, elapsed
    return info.value


# --------------------------------------------------------------------------------------------
# set / get
# --------------------------------------------------------------------------------------------
def test_set_get_str_and_bytes(store):
    store.set("s", "hello")
    store.set("b", b"world")
    store.set("u", "h\u00e9llo \u2603")
    assert store.get("s") == b"hello"
    assert store.get("b") == b"world"
    assert store.get("u") == "h\u00e9llo \u2603".encode()
    assert all(type(store.get(k)) is bytes for k in ("s", "b", "u"))
    store.set("s", "again")
    assert store.get("s") == b"again"


def test_binary_values_round_trip(store):
    every_byte = bytes(range(256))
    store.set("bin", every_byte)
    store.set("nul", b"\x00")
    store.set("mixed", b"a\x00b\xffc\x00")
    assert store.get("bin") == every_byte
    assert store.get("nul") == b"\x00"
    assert store.get("mixed") == b"a\x00b\xffc\x00"


def test_empty_key_and_empty_value(store):
    store.set("", "for the empty key")
    store.set("empty", "")
    store.set("empty_bytes", b"")
    assert store.get("") == b"for the empty key"
    assert store.get("empty") == b""
    assert store.get("empty_bytes") == b""
    assert store.check(["", "empty", "empty_bytes"])
    assert store.num_keys() == 3


@pytest.mark.parametrize("text", ["007", "-0", "+5", "12 ", "0", "-17", "1e3", str(1 << 50), str(INT64_MIN)])
def test_numeric_looking_values_are_returned_verbatim(store, text):
    store.set("n", text)
    assert store.get("n") == text.encode()


# --------------------------------------------------------------------------------------------
# add
# --------------------------------------------------------------------------------------------
def test_add_creates_counter_and_returns_total(store):
    assert not store.check(["c"])
    assert store.add("c", 3) == 3
    assert store.get("c") == b"3"
    assert store.add("c", 3) == 6
    assert store.get("c") == b"6"
    assert store.add("c", 0) == 6
    assert store.num_keys() == 1


def test_add_negative_amounts(store):
    assert store.add("neg", -5) == -5
    assert store.get("neg") == b"-5"
    assert store.add("neg", -5) == -10
    assert store.add("neg", 15) == 5
    assert store.add("neg", -5) == 0
    assert store.get("neg") == b"0"


def test_add_on_a_set_value(store):
    store.set("n", "5")
    assert store.add("n", 1) == 6
    assert store.get("n") == b"6"
    store.set("n", b"41")
    assert store.add("n", 1) == 42


@pytest.mark.parametrize("text,expected", [
    (" 5x", 6), ("+7", 8), (" -3abc", -2), ("\t\n12 ", 13), ("007", 8), ("0x10", 1), ("-0", 1),
])
def test_add_parses_like_stoll(store, text, expected):
    store.set("n", text)
    assert store.add("n", 1) == expected
    assert store.get("n") == str(expected).encode()


def test_add_on_an_empty_value_counts_from_zero(store):
    # torch's HashStore and FileStore treat an empty value as a missing counter
    store.set("e", "")
    assert store.add("e", 4) == 4
    assert store.get("e") == b"4"


@pytest.mark.parametrize("text", ["abc", " ", "-", "x5", "+", b"\xff\x00"])
def test_add_on_non_numeric_value_raises_value_error(store, text):
    store.set("bad", text)
    with pytest.raises(ValueError):
        store.add("bad", 1)
    expected = text if isinstance(text, bytes) else text.encode()
    assert store.get("bad") == expected
    assert store.num_keys() == 1


def test_add_wraps_at_int64(store):
    assert store.add("w", 1 << 62) == 1 << 62
    assert store.add("w", 1 << 62) == INT64_MIN
    assert store.get("w") == str(INT64_MIN).encode()
    assert store.add("w", 1 << 62) == -(1 << 62)
    store.set("m", str(INT64_MAX))
    assert store.add("m", 1) == INT64_MIN
    assert store.add("m", -1) == INT64_MAX
    assert store.get("m") == str(INT64_MAX).encode()


@pytest.mark.parametrize("amount", [1.5, 1.0, "1", None, b"1"])
def test_add_with_a_non_int_amount_raises_type_error(store, amount):
    store.set("t", "10")
    with pytest.raises(TypeError):
        store.add("t", amount)
    with pytest.raises(TypeError):
        store.add("fresh", amount)
    assert store.get("t") == b"10"
    assert not store.check(["fresh"])


@pytest.mark.parametrize("amount", [INT64_MAX + 1, INT64_MIN - 1, 1 << 70], ids=["2**63", "-2**63-1", "2**70"])
def test_add_with_an_amount_past_int64_raises_type_error(store, amount):
    """torch's stores take an int64 amount and refuse the rest; wrapping 2**70 to 0 was silent."""
    store.set("t", "10")
    with pytest.raises(TypeError, match="within int64"):
        store.add("t", amount)
    with pytest.raises(TypeError, match="within int64"):
        store.add("fresh", amount)
    assert store.get("t") == b"10"
    assert not store.check(["fresh"])


def test_add_large_amounts_are_exact(store):
    total = 0
    for _ in range(12):  # crosses +-2**43 (the MPIStore's small-counter range) on the way up
        total += 1 << 40
        assert store.add("big", 1 << 40) == total
        assert store.get("big") == str(total).encode()
    for _ in range(24):  # ... back down and on below -2**43
        total -= 1 << 40
        assert store.add("big", -(1 << 40)) == total
        assert store.get("big") == str(total).encode()
    assert total == -12 * (1 << 40)


def test_add_across_the_2_pow_43_boundary_both_ways(store):
    edge = 1 << 43
    total = store.add("k", edge - 2)
    assert total == edge - 2
    for _ in range(4):  # up across the edge, then further up
        total += 5
        assert store.add("k", 5) == total
        assert store.get("k") == str(total).encode()
    for _ in range(8):  # back down across it, then further down
        total -= 5
        assert store.add("k", -5) == total
        assert store.get("k") == str(total).encode()
    assert total == edge - 22
    # the same at the negative edge (-2**43 itself still fits a 44-bit counter)
    assert store.add("n", -edge) == -edge
    assert store.add("n", -1) == -edge - 1
    assert store.add("n", 1) == -edge
    assert store.add("n", 1) == -edge + 1
    assert store.add("n", -2) == -edge - 1
    assert store.get("n") == str(-edge - 1).encode()
    # one jump from far below to far above and back
    assert store.add("n", 2 * edge + 1) == edge
    assert store.add("n", -2 * edge) == -edge
    assert store.get("n") == str(-edge).encode()


def test_set_large_decimal_then_add(store):
    store.set("d", "99999999999999999")
    assert store.add("d", 1) == 100000000000000000
    assert store.get("d") == b"100000000000000000"
    assert store.add("d", -100000000000000000) == 0
    assert store.add("d", 7) == 7
    assert store.get("d") == b"7"


def test_text_replaces_a_counter_and_back(store):
    assert store.add("c", 5) == 5
    store.set("c", "not a number")
    assert store.get("c") == b"not a number"
    with pytest.raises(ValueError):
        store.add("c", 1)
    assert store.get("c") == b"not a number"
    store.set("c", "20")
    assert store.add("c", 1) == 21
    assert store.delete_key("c")
    assert store.add("c", 1) == 1  # a deleted counter starts again at 0
    assert store.get("c") == b"1"


# --------------------------------------------------------------------------------------------
# compare_set
# --------------------------------------------------------------------------------------------
def test_compare_set_missing_key_with_empty_expected_sets(store):
    assert store.compare_set("k", "", "desired") == b"desired"
    assert store.get("k") == b"desired"


def test_compare_set_missing_key_with_other_expected_does_not_create(store):
    assert store.compare_set("k", "expected", "desired") == b"expected"
    assert not store.check(["k"])
    assert store.num_keys() == 0


def test_compare_set_match_sets_desired(store):
    store.set("k", "old")
    assert store.compare_set("k", "old", "new") == b"new"
    assert store.get("k") == b"new"
    assert store.compare_set("k", b"new", b"\x00\xff") == b"\x00\xff"
    assert store.get("k") == b"\x00\xff"


def test_compare_set_mismatch_returns_current(store):
    store.set("k", "current")
    assert store.compare_set("k", "other", "new") == b"current"
    assert store.get("k") == b"current"


def test_compare_set_existing_key_with_empty_expected_keeps_it(store):
    store.set("k", "current")
    assert store.compare_set("k", "", "new") == b"current"
    assert store.get("k") == b"current"
    store.set("e", "")  # an empty value does match an empty expected value
    assert store.compare_set("e", "", "filled") == b"filled"
    assert store.get("e") == b"filled"


def test_compare_set_on_a_counter(store):
    assert store.add("c", 3) == 3
    assert store.compare_set("c", "2", "99") == b"3"
    assert store.compare_set("c", "3", "10") == b"10"
    assert store.get("c") == b"10"
    assert store.add("c", 1) == 11
    assert store.compare_set("c", "11", "text") == b"text"
    assert store.get("c") == b"text"
    with pytest.raises(ValueError):
        store.add("c", 1)


# --------------------------------------------------------------------------------------------
# wait, timeouts
# --------------------------------------------------------------------------------------------
def test_wait_returns_for_keys_already_set(store):
    store.set("a", "1")
    store.set("b", "2")
    store.wait(["a", "b"])
    store.wait(["a"], timedelta(seconds=5))
    store.wait([])


def test_wait_returns_when_another_thread_sets(store):
    def setter():
        time.sleep(0.05)
        store.set("late1", "v")
        time.sleep(0.05)
        store.add("late2", 1)

    thread = threading.Thread(target=setter)
    start = time.monotonic()
    thread.start()
    try:
        store.wait(["late1", "late2"], timedelta(seconds=5))
    finally:
        thread.join()
    assert time.monotonic() - start < 5
    assert store.get("late1") == b"v"
    assert store.get("late2") == b"1"


def test_wait_times_out_naming_the_missing_keys(store):
    store.set("present", "1")
    err = _times_out(lambda: store.wait(["present", "missing_one", "missing_two"], SHORT), SHORT)
    assert "missing_one" in str(err) and "missing_two" in str(err)


def test_wait_uses_the_store_timeout(store):
    store.set_timeout(SHORT)
    err = _times_out(lambda: store.wait(["never_set_key"]), SHORT)
    assert "never_set_key" in str(err)


def test_get_of_a_missing_key_times_out_naming_it(store):
    store.set_timeout(SHORT)
    err = _times_out(lambda: store.get("no_such_key_xyz"), SHORT)
    assert "no_such_key_xyz" in str(err)
    assert not store.check(["no_such_key_xyz"])


def test_timeout_property(store, kind, stores):
    fresh = stores.make(kind)
    assert fresh.timeout == timedelta(seconds=300)  # torch's default
    assert isinstance(store.timeout, timedelta)
    assert store.timeout == SAFE
    store.set_timeout(timedelta(milliseconds=1234))
    assert store.timeout == timedelta(milliseconds=1234)


@pytest.mark.parametrize("bad", [5, 0.5, None, "10s"])
def test_set_timeout_needs_a_timedelta(store, bad):
    with pytest.raises(TypeError):
        store.set_timeout(bad)
    assert store.timeout == SAFE


# --------------------------------------------------------------------------------------------
# check, delete_key, num_keys, list_keys
# --------------------------------------------------------------------------------------------
def test_check(store):
    assert store.check([])
    assert not store.check(["a"])
    store.set("a", "1")
    assert store.check(["a"])
    assert not store.check(["a", "b"])
    store.add("b", 1)
    assert store.check(["a", "b"])
    assert store.check(["b", "a", "a"])


def test_delete_key(store):
    store.set("k", "v")
    store.set("other", "w")
    assert store.num_keys() == 2
    assert store.delete_key("k") is True
    assert not store.check(["k"])
    assert store.num_keys() == 1
    assert store.delete_key("k") is False
    assert store.delete_key("never") is False
    assert store.num_keys() == 1
    assert store.get("other") == b"w"
    store.set_timeout(SHORT)
    _times_out(lambda: store.get("k"), SHORT)
    store.set("k", "back")
    assert store.get("k") == b"back"


def test_num_keys_counts_keys(store):
    assert store.num_keys() == 0
    store.set("a", "1")
    assert store.num_keys() == 1
    store.set("a", "2")  # overwriting is not a new key
    assert store.num_keys() == 1
    store.add("b", 1)
    store.append("c", "x")
    store.compare_set("d", "", "y")
    store.compare_set("e", "not there", "y")  # creates nothing
    assert store.num_keys() == 4


def test_list_keys(store, kind):
    if not extended(kind):
        with pytest.raises(NotImplementedError):
            store.list_keys()
        return
    assert store.list_keys() == []
    for key in ("a", "b/c", "", "\u00e9"):
        store.set(key, "v")
    store.add("n", 1)
    keys = store.list_keys()
    assert all(type(k) is str for k in keys)
    assert sorted(keys) == sorted(["a", "b/c", "", "\u00e9", "n"])
    store.delete_key("a")
    assert sorted(store.list_keys()) == sorted(["b/c", "", "\u00e9", "n"])


# --------------------------------------------------------------------------------------------
# append, multi_get, multi_set, has_extended_api
# --------------------------------------------------------------------------------------------
def test_append(store):
    store.append("ap", "po")
    assert store.get("ap") == b"po"
    store.append("ap", b"tato")
    assert store.get("ap") == b"potato"
    store.append("ap", "")
    assert store.get("ap") == b"potato"
    store.append("bin", b"\x00")
    store.append("bin", b"\xff")
    assert store.get("bin") == b"\x00\xff"
    store.add("cnt", 12)
    store.append("cnt", "3")
    assert store.get("cnt") == b"123"
    assert store.add("cnt", 1) == 124


def test_multi_set_and_multi_get(store):
    store.multi_set(["a", "b", "c"], ["1", b"\x00two", ""])
    assert store.multi_get(["a", "b", "c"]) == [b"1", b"\x00two", b""]
    assert store.multi_get(["c", "a"]) == [b"", b"1"]
    assert store.multi_get([]) == []
    assert store.get("b") == b"\x00two"
    assert store.num_keys() == 3
    store.multi_set(["a"], ["changed"])
    assert store.multi_get(["a", "b"]) == [b"changed", b"\x00two"]


@pytest.mark.parametrize("keys,values", [(["a", "b"], ["1"]), (["a"], ["1", "2"]), ([], ["1"]), (["a"], [])])
def test_multi_set_with_mismatched_lengths_raises_value_error(store, keys, values):
    with pytest.raises(ValueError):
        store.multi_set(keys, values)
    assert store.num_keys() == 0


def test_multi_get_of_a_missing_key_times_out(store):
    store.set("a", "1")
    store.set_timeout(SHORT)
    err = _times_out(lambda: store.multi_get(["a", "missing_multi"]), SHORT)
    assert "missing_multi" in str(err)


def test_has_extended_api(store, kind):
    assert store.has_extended_api() is extended(kind)


def test_plain_python_subclass_defaults():
    s = DictStore()
    assert s.has_extended_api() is False
    s.append("a", "po")
    s.append("a", "tato")
    assert s.get("a") == b"potato"
    s.multi_set(["x", "y"], ["1", b"2"])
    assert s.multi_get(["x", "y"]) == [b"1", b"2"]
    with pytest.raises(ValueError):
        s.multi_set(["x"], ["1", "2"])
    for call in (lambda: s.queue_push("q", "v"), lambda: s.queue_pop("q"), lambda: s.queue_len("q"),
                 lambda: s.list_keys()):
        with pytest.raises(NotImplementedError):
            call()
    assert s.num_keys() == 3


# --------------------------------------------------------------------------------------------
# queues
# --------------------------------------------------------------------------------------------
def test_queue_fifo(store, kind):
    if not extended(kind):
        with pytest.raises(NotImplementedError):
            store.queue_push("q", "v")
        with pytest.raises(NotImplementedError):
            store.queue_len("q")
        return
    assert store.queue_len("q") == 0
    store.queue_push("q", "first")
    store.queue_push("q", b"\x00second\xff")
    store.queue_push("q", "")
    store.queue_push("q", "x" * 5000)
    assert store.queue_len("q") == 4
    assert store.queue_pop("q") == b"first"
    assert store.queue_pop("q", block=False) == b"\x00second\xff"
    assert store.queue_len("q") == 2
    assert store.queue_pop("q") == b""
    assert store.queue_pop("q") == b"x" * 5000
    assert store.queue_len("q") == 0
    store.queue_push("q", "again")
    assert store.queue_pop("q") == b"again"


def test_queue_pop_on_empty(store, kind):
    if not extended(kind):
        pytest.skip("the plain Python subclass has no queues (checked in test_queue_fifo)")
    with pytest.raises(dist.QueueEmptyError) as info:
        store.queue_pop("empty", block=False)
    assert isinstance(info.value, dist.DistStoreError) and isinstance(info.value, RuntimeError)
    store.queue_push("drained", "1")
    assert store.queue_pop("drained", block=False) == b"1"
    with pytest.raises(dist.QueueEmptyError):
        store.queue_pop("drained", block=False)
    store.set_timeout(SHORT)
    _times_out(lambda: store.queue_pop("empty"), SHORT)
    assert store.queue_len("empty") == 0


def test_blocking_queue_pop_waits_for_a_push(store, kind):
    if not extended(kind):
        pytest.skip("the plain Python subclass has no queues (checked in test_queue_fifo)")

    def pusher():
        time.sleep(0.05)
        store.queue_push("q", "late")

    thread = threading.Thread(target=pusher)
    thread.start()
    try:
        assert store.queue_pop("q") == b"late"
    finally:
        thread.join()
    assert store.queue_len("q") == 0


def test_queues_are_not_keys(store, kind):
    if not extended(kind):
        pytest.skip("the plain Python subclass has no queues (checked in test_queue_fifo)")
    store.queue_push("qk", "item")
    assert store.num_keys() == 0
    assert store.list_keys() == []
    store.set_timeout(SHORT)
    _times_out(lambda: store.get("qk"), SHORT)
    # a key and a queue of the same name live side by side
    store.set("both", "value")
    store.queue_push("both", "queued")
    assert store.get("both") == b"value"
    assert store.queue_len("both") == 1
    assert store.num_keys() == 1
    assert store.list_keys() == ["both"]
    assert store.queue_pop("both") == b"queued"
    assert store.get("both") == b"value"
    assert store.delete_key("both")
    assert store.queue_len("qk") == 1


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------
BAD_CALLS = [
    ("set_int_key", lambda s: s.set(1, "v")),
    ("set_bytes_key", lambda s: s.set(b"k", "v")),
    ("set_none_key", lambda s: s.set(None, "v")),
    ("get_int_key", lambda s: s.get(1)),
    ("add_int_key", lambda s: s.add(1, 1)),
    ("compare_set_int_key", lambda s: s.compare_set(1, "", "v")),
    ("delete_key_none", lambda s: s.delete_key(None)),
    ("check_int_key", lambda s: s.check([1])),
    ("wait_int_key", lambda s: s.wait([1])),
    ("set_int_value", lambda s: s.set("k", 1)),
    ("set_none_value", lambda s: s.set("k", None)),
    ("set_float_value", lambda s: s.set("k", 1.5)),
    ("compare_set_int_expected", lambda s: s.compare_set("k", 1, "v")),
    ("compare_set_none_desired", lambda s: s.compare_set("k", "", None)),
    ("append_int_value", lambda s: s.append("k", 1)),
    ("multi_set_int_value", lambda s: s.multi_set(["k"], [1])),
    ("wait_bare_string", lambda s: s.wait("a")),
    ("wait_bare_string_with_timeout", lambda s: s.wait("a", timedelta(seconds=1))),
    ("wait_int_timeout", lambda s: s.wait(["k"], 5)),
    ("check_bare_string", lambda s: s.check("k")),
    ("multi_get_bare_string", lambda s: s.multi_get("k")),
    ("multi_set_bare_string_keys", lambda s: s.multi_set("k", ["v"])),
]


@pytest.mark.parametrize("call", [pytest.param(c, id=i) for i, c in BAD_CALLS])
def test_bad_input_raises_type_error(store, call):
    store.set_timeout(timedelta(seconds=3))
    start = time.monotonic()
    with pytest.raises(TypeError):
        call(store)
    assert time.monotonic() - start < 2  # raised at once, not after a wait
    assert store.num_keys() == 0
    assert not store.check(["k"])


@pytest.mark.parametrize("call", [
    pytest.param(lambda s: s.queue_push(1, "v"), id="queue_push_int_key"),
    pytest.param(lambda s: s.queue_push("q", 1), id="queue_push_int_value"),
    pytest.param(lambda s: s.queue_pop(None), id="queue_pop_none_key"),
    pytest.param(lambda s: s.queue_len(b"q"), id="queue_len_bytes_key"),
])
def test_bad_queue_input_raises_type_error(store, kind, call):
    if not extended(kind):
        pytest.skip("the plain Python subclass has no queues")
    with pytest.raises(TypeError):
        call(store)
    assert store.queue_len("q") == 0


# --------------------------------------------------------------------------------------------
# large values, overwrites, many keys
# --------------------------------------------------------------------------------------------
def test_large_value_round_trips(kind, stores):
    store = stores.make(kind, capacity=16 << 20)
    store.set_timeout(SAFE)
    value = os.urandom(4 << 20)
    store.set("large", value)
    got = store.get("large")
    assert type(got) is bytes and len(got) == len(value) and got == value
    store.set("small", "s")
    assert store.get("small") == b"s"
    assert store.get("large") == value
    store.set("large", value[::-1])
    assert store.get("large") == value[::-1]
    assert store.delete_key("large")
    assert store.num_keys() == 1


def test_overwrite_with_longer_and_shorter_values(store):
    values = [b"0123456789", os.urandom(200), os.urandom(5000), b"abc", "12345", b"\x00" * 90,
              os.urandom(70), "", os.urandom(300)]
    for value in values:
        store.set("k", value)
        expected = value.encode() if isinstance(value, str) else value
        assert store.get("k") == expected
        store.set("neighbour", expected[::-1])
        assert store.get("k") == expected
    store.set("k", "12345")
    assert store.add("k", 1) == 12346
    store.set("k", os.urandom(5000))
    store.set("k", "7")
    assert store.add("k", 1) == 8
    assert store.num_keys() == 2


def test_many_keys(store):
    keys = [f"key/{i:03d}" for i in range(200)]
    for i, key in enumerate(keys):
        store.set(key, f"value {i}" * (1 + i % 7))
    assert store.num_keys() == 200
    assert store.check(keys)
    assert store.multi_get(keys) == [(f"value {i}" * (1 + i % 7)).encode() for i in range(200)]
    for key in keys[::2]:
        assert store.delete_key(key)
    assert store.num_keys() == 100
    assert not store.check(keys[:1])
    assert store.check(keys[1::2])
    for i, key in enumerate(keys[1::2]):
        assert store.get(key) == (f"value {2 * i + 1}" * (1 + (2 * i + 1) % 7)).encode()
    for key in keys[::2]:
        store.set(key, "re-set " + key)
    assert store.num_keys() == 200
    assert [store.get(k) for k in keys[::2]] == [("re-set " + k).encode() for k in keys[::2]]


# --------------------------------------------------------------------------------------------
# PrefixStore
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base_kind", BASE_KINDS)
def test_prefix_store_namespaces_keys(stores, base_kind):
    base = stores.base(base_kind)
    base.set_timeout(SAFE)
    a, b = dist.PrefixStore("a", base), dist.PrefixStore("b", base)
    a.set("k", "from a")
    assert base.get("a/k") == b"from a"
    assert not base.check(["k"])
    assert not b.check(["k"])
    b.set("k", "from b")
    assert a.get("k") == b"from a" and b.get("k") == b"from b"
    assert base.get("b/k") == b"from b"
    assert a.add("n", 2) == 2
    assert base.get("a/n") == b"2"
    assert not b.check(["n"])
    base.set("a/direct", "x")
    assert a.get("direct") == b"x"
    assert a.compare_set("direct", "x", "y") == b"y"
    assert base.get("a/direct") == b"y"
    a.multi_set(["m1", "m2"], ["1", "2"])
    assert base.multi_get(["a/m1", "a/m2"]) == [b"1", b"2"]
    a.append("ap", "po")
    a.append("ap", "tato")
    assert base.get("a/ap") == b"potato"
    assert a.delete_key("k")
    assert not base.check(["a/k"]) and base.check(["b/k"])
    assert base.num_keys() == 6
    if base_kind != "python":
        assert sorted(a.list_keys()) == ["ap", "direct", "m1", "m2", "n"]
        assert b.list_keys() == ["k"]
        a.queue_push("q", "v")
        assert b.queue_len("q") == 0 and base.queue_len("a/q") == 1
        assert a.queue_pop("q") == b"v"


@pytest.mark.parametrize("base_kind", BASE_KINDS)
def test_prefix_store_unwraps(stores, base_kind):
    base = stores.base(base_kind)
    base.set_timeout(SAFE)
    inner = dist.PrefixStore("a", base)
    outer = dist.PrefixStore("b", inner)
    assert isinstance(outer, dist.Store)
    assert inner.underlying_store is base
    assert outer.underlying_store is inner
    assert inner._underlying_non_prefix_store is base
    assert outer._underlying_non_prefix_store is base
    outer.set("k", "nested")
    assert base.get("a/b/k") == b"nested"
    assert inner.get("b/k") == b"nested"
    assert not inner.check(["k"])
    assert outer.has_extended_api() is (base_kind != "python")
    outer.set_timeout(timedelta(seconds=7))
    assert outer.timeout == timedelta(seconds=7) == base.timeout


def test_prefix_store_bad_arguments():
    with pytest.raises(TypeError):
        dist.PrefixStore(123, dist.HashStore())
    with pytest.raises(TypeError):
        dist.PrefixStore(None, dist.HashStore())
    with pytest.raises(TypeError):
        dist.PrefixStore("p", object())
    with pytest.raises(TypeError):
        dist.PrefixStore("p", {})


# --------------------------------------------------------------------------------------------
# HashStore threads
# --------------------------------------------------------------------------------------------
def test_hash_store_concurrent_adds():
    store = dist.HashStore()
    barrier = threading.Barrier(8)
    results = [[] for _ in range(8)]

    def worker(i):
        barrier.wait()
        for _ in range(500):
            results[i].append(store.add("counter", 1))
            store.append("log", "x")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("counter") == b"4000"
    assert len(store.get("log")) == 4000
    returned = sorted(r for part in results for r in part)
    assert returned == list(range(1, 4001))  # every add saw a distinct total


# --------------------------------------------------------------------------------------------
# FileStore across processes
# --------------------------------------------------------------------------------------------
def _python(code, *args):
    """Start a plain Python process (no MPI) running ``code``."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=fresh_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


ADDER = """
    import sys
    from datetime import timedelta
    import hpc_c10d as dist
    store = dist.FileStore(sys.argv[1], -1, timedelta(seconds=30))
    store.set("ready/" + sys.argv[2], "1")
    store.wait(["ready/0", "ready/1"])
    for _ in range(1000):
        store.add("shared", 1)
    store.close()
"""


def test_file_store_adds_from_two_processes(tmp_path):
    path = str(tmp_path / "shared_store")
    procs = [_python(ADDER, path, str(i)) for i in range(2)]
    for proc in procs:
        _finish(proc)
    store = dist.FileStore(path, -1)
    try:
        assert store.get("shared") == b"2000"
        assert store.add("shared", 1) == 2001
    finally:
        store.close()


def test_file_store_values_cross_processes(tmp_path):
    path = str(tmp_path / "xproc")
    store = dist.FileStore(path, -1)
    store.set_timeout(SAFE)
    try:
        store.set("from_parent", b"\x00parent\xff")
        child = _python("""
            import sys
            from datetime import timedelta
            import hpc_c10d as dist
            store = dist.FileStore(sys.argv[1], -1, timedelta(seconds=30))
            print(store.get("from_parent").hex())
            store.set("from_child", b"child\\x00")
            store.queue_push("q", "queued by child")
            store.add("counter", 5)
            store.close()
        """, path)
        out = _finish(child)
        assert bytes.fromhex(out.strip()) == b"\x00parent\xff"
        assert store.get("from_child") == b"child\x00"
        assert store.queue_pop("q", block=False) == b"queued by child"
        assert store.add("counter", 1) == 6
        assert store.path == path
        assert os.path.exists(path)
    finally:
        store.close()
    assert os.path.exists(path)  # world_size=-1: kept


def test_file_store_last_of_world_size_users_deletes_the_file(tmp_path):
    path = str(tmp_path / "ws2")
    first = dist.FileStore(path, 2)
    first.set("k", "v")
    child = _python("""
        import sys
        import hpc_c10d as dist
        store = dist.FileStore(sys.argv[1], 2)
        assert store.get("k") == b"v"
        store.close()
    """, path)
    _finish(child)
    assert os.path.exists(path)  # one of two users still there
    assert first.get("k") == b"v"
    first.close()
    assert not os.path.exists(path)


def test_file_store_world_size_two_in_one_process(tmp_path):
    path = str(tmp_path / "ws2_local")
    one, two = dist.FileStore(path, 2), dist.FileStore(path, 2)
    one.set("x", "1")
    assert two.get("x") == b"1"
    assert one.path == two.path == path
    one.close()
    assert os.path.exists(path)
    two.close()
    assert not os.path.exists(path)


def test_file_store_world_size_minus_one_keeps_the_file(tmp_path):
    path = str(tmp_path / "kept")
    one, two = dist.FileStore(path, -1), dist.FileStore(path, -1)
    one.set("x", "1")
    one.close()
    two.close()
    assert os.path.exists(path)
    again = dist.FileStore(path, -1)
    try:
        assert again.get("x") == b"1"
    finally:
        again.close()


# --------------------------------------------------------------------------------------------
# MPIStore limits
# --------------------------------------------------------------------------------------------
@pytest.mark.mpi
def test_mpi_store_capacity_exceeded_changes_nothing(stores):
    store = stores.base("mpi", capacity=64 << 10, max_keys=64)
    store.set_timeout(SAFE)
    before = {"inline": b"small", "heap": os.urandom(1000), "counter": b"7", "empty": b""}
    for key, value in before.items():
        store.set(key, value)
    store.add("counter", 1)
    before["counter"] = b"8"
    store.queue_push("q", "item")

    with pytest.raises(dist.DistStoreError) as info:
        store.set("huge", os.urandom(200 << 10))
    message = str(info.value)
    assert "full" in message and "HPC_C10D_STORE_CAPACITY" in message
    assert not store.check(["huge"])
    # overwriting an existing key with a value too large fails the same way and keeps the old one
    with pytest.raises(dist.DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
        store.set("heap", os.urandom(200 << 10))
    with pytest.raises(dist.DistStoreError, match="full"):
        store.append("inline", os.urandom(200 << 10))
    # fill the heap with 4 KiB values until it runs out
    filled = {}
    with pytest.raises(dist.DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
        for i in range(60):
            value = os.urandom(4096)
            store.set(f"fill{i}", value)
            filled[f"fill{i}"] = value
    assert 5 <= len(filled) < 60
    for key, value in {**before, **filled}.items():
        assert store.get(key) == value, key
    assert store.num_keys() == len(before) + len(filled)
    assert store.queue_pop("q", block=False) == b"item"
    assert store.add("counter", 1) == 9
    # freeing space lets a new value in
    for key in filled:
        assert store.delete_key(key)
    store.set("after", os.urandom(4096))
    assert store.check(["after"])


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["set", "append", "compare_set"])
def test_mpi_store_failed_overwrite_of_a_counter_keeps_it(stores, how):
    store = stores.base("mpi", capacity=64 << 10, max_keys=64)
    store.set_timeout(SAFE)
    assert store.add("counter", 7) == 7
    store.set("text", "unchanged")
    huge = os.urandom(200 << 10)
    with pytest.raises(dist.DistStoreError, match="HPC_C10D_STORE_CAPACITY"):
        if how == "set":
            store.set("counter", huge)
        elif how == "append":
            store.append("counter", huge)
        else:
            store.compare_set("counter", "7", huge)
    assert store.get("counter") == b"7"  # "nothing was changed"
    assert store.add("counter", 1) == 8
    assert store.get("text") == b"unchanged"
    assert store.num_keys() == 2


@pytest.mark.mpi
def test_mpi_store_max_keys_exceeded_changes_nothing(stores):
    store = stores.base("mpi", max_keys=4)
    store.set_timeout(SAFE)
    values = {"k0": b"zero", "k1": os.urandom(300), "k2": b"2"}
    for key, value in values.items():
        store.set(key, value)
    assert store.add("k3", 3) == 3
    values["k3"] = b"3"
    for call in (lambda: store.set("k4", "v"), lambda: store.add("k4", 1), lambda: store.append("k4", "v"),
                 lambda: store.compare_set("k4", "", "v")):
        with pytest.raises(dist.DistStoreError) as info:
            call()
        assert "full" in str(info.value) and "max_keys" in str(info.value)
    assert not store.check(["k4"])
    assert store.num_keys() == 4
    for key, value in values.items():
        assert store.get(key) == value
    store.set("k0", "overwrite is fine")  # not a new key
    assert store.add("k3", 1) == 4
    assert store.delete_key("k2")
    store.set("k4", "now it fits")
    assert store.get("k4") == b"now it fits"
    assert store.num_keys() == 4
    with pytest.raises(dist.DistStoreError, match="max_keys"):
        store.set("k5", "no room again")
    assert sorted(store.list_keys()) == ["k0", "k1", "k3", "k4"]
