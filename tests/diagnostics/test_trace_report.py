"""``python -m hpc_c10d trace DIR``: the ranks' flight-recorder dumps merged into who is stuck where
and which ranks left no dump or gave no answer, with their hosts. Here the command without dumps
and a report from made-up dumps; reports of real jobs are checked in test_flight_recorder.py,
test_watchdog.py and tests/torch_backend/test_torch_backend_hangs.py.
"""
import pytest

from hpc_c10d.diagnostics.trace_report import summarize
from support.fault_jobs import trace
from support.launch import outer_world_size

pytestmark = pytest.mark.skipif(outer_world_size() > 1, reason="serial test")


def test_trace_of_a_missing_directory_says_so(tmp_path):
    report = trace(tmp_path / "nonexistent")
    assert report.returncode == 1 and report.stdout == "", report.stdout
    assert f"{tmp_path / 'nonexistent'}: no such directory (dumps go to HPC_C10D_TRACE_DIR" in report.stderr
    report = trace(tmp_path)
    assert report.returncode == 1 and report.stdout == f"no flight-recorder dumps found in {tmp_path}\n"


def test_trace_command_without_dumps_says_so(tmp_path):
    report = trace(tmp_path)
    assert report.returncode == 1
    assert "no flight-recorder dumps found" in report.stdout


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
