"""The roll call (hpc_c10d/diagnostics/roll_call.py): which ranks answer; the report that names the silent
ones with their hosts is tested in test_trace_report.py.

Serial: three RollCall parts of one made-up run live in this process, each on its own UDP socket
(ports the kernel picks, on loopback), with their cards in a temporary directory.
"""
import os
import threading

import pytest

from support.launch import outer_world_size
from hpc_c10d.diagnostics.roll_call import RollCall, _ipv4_addresses

pytestmark = pytest.mark.skipif(outer_world_size() > 1, reason="serial test")

SECRET = b"12345678"


def _parts(directory, hosts, secret=SECRET):
    return [RollCall(str(directory), "run1", rank, hosts, secret) for rank in range(len(hosts))]


def _answering(part, stop):
    """Keep ``part`` answering pings (what its watchdog thread does) until ``stop`` is set."""
    def loop():
        while not stop.is_set():
            part.wait(0.02)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("hosts", [["a", "a", "a"], ["a", "a", "b"]], ids=["one host", "two hosts"])
def test_every_rank_that_joins_is_heard_and_cards_go_away_on_close(hosts, tmp_path):
    if hosts[2] != hosts[0] and not _ipv4_addresses():
        pytest.skip("no IPv4 address up but loopback: a rank on another host has no address to be reached at")
    parts = _parts(tmp_path, hosts)
    try:
        for part in parts[1:]:
            assert part.open()
        stop = threading.Event()
        threads = [_answering(part, stop) for part in parts[1:]]
        outcome = parts[0].hold(2.0)
        stop.set()
        for thread in threads:
            thread.join()
        assert outcome["answered"] == [1, 2] and outcome["silent"] == []
        assert outcome["waited_s"] < 2.0
        assert parts[0].hold(2.0) is outcome  # held once
        assert sorted(os.listdir(tmp_path)) == [f"run1-rank{r}.card" for r in range(3)]
    finally:
        for part in parts:
            part.close()
    assert os.listdir(tmp_path) == []


def test_a_rank_with_no_card_or_no_answer_is_silent(tmp_path):
    parts = _parts(tmp_path, ["a", "a", "b"])
    try:
        assert parts[2].open()  # rank 2 leaves a card but never answers (stopped); rank 1 never joins (dead)
        outcome = parts[0].hold(0.5)
        assert outcome["answered"] == [] and outcome["silent"] == [1, 2]
        assert 0.5 <= outcome["waited_s"] < 1.5
    finally:
        for part in parts:
            part.close()


def test_datagrams_of_another_run_are_ignored(tmp_path):
    ours = _parts(tmp_path, ["a", "a"])
    theirs = RollCall(str(tmp_path), "run1", 1, ["a", "a"], b"87654321")  # same card name, other secret
    try:
        assert theirs.open()
        stop = threading.Event()
        thread = _answering(theirs, stop)
        outcome = ours[0].hold(0.5)
        stop.set()
        thread.join()
        assert outcome["silent"] == [1]
    finally:
        theirs.close()
        for part in ours:
            part.close()
