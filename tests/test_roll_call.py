"""The roll call (hpc_c10d/roll_call.py) and how the report names lost ranks with their hosts.

Serial: three RollCall parts of one made-up run live in this process, each on its own UDP socket
(ports the kernel picks, on loopback), with their cards in a temporary directory.
"""
import os
import threading

import pytest

from _launch import outer_world_size
from hpc_c10d.roll_call import RollCall, _ipv4_addresses
from hpc_c10d.trace_report import summarize

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


def test_the_report_names_silent_and_missing_ranks_with_their_hosts():
    hosts = ["node1", "node1", "node2", "node2"]
    group = [{"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3], "seq": 7, "p2p_seq": 0, "timeout_s": 3}]
    dumps = [{"run": "r", "rank": rank, "world_size": 4, "hosts": hosts, "reason": "timeout", "groups": group,
              "in_flight": [], "roll_call": {"answered": [1 - rank], "silent": [2, 3], "waited_s": 2.0}}
             for rank in (0, 1)]
    report = summarize(dumps)
    assert "dumps from 2 of 4 ranks" in report
    assert "no dump from ranks 2-3 on node2" in report
    assert "no answer from ranks 2-3 on node2 to ranks 0-1 on node1 within 2.0 s" in report
