"""The flight recorder: each rank's numbered operations, the ring of the last N and what each thread
is inside, dumped to a JSON file per rank. Here a straggler's job (tests/faults/scenario.py). Also:
test_watchdog.py (dumps on SIGUSR2), test_trace_report.py (the merged report), and under torch
tests/torch_backend/test_torch_backend_debug.py and test_torch_backend_hangs.py.
"""
import json
import os

import pytest

from support.fault_jobs import SERIAL_JOBS, run_job, trace
from support.launch import job_sizes

pytestmark = SERIAL_JOBS


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
@pytest.mark.long
def test_a_rank_that_never_joins_the_barrier_ends_the_job_with_a_report(nprocs, tmp_path):
    """The program's timeout=3 s wins over HPC_C10D_TIMEOUT."""
    proc, took, output = run_job("straggler", nprocs, tmp_path, HPC_C10D_TRACE_BUFFER_SIZE="3", HPC_C10D_TIMEOUT="600")
    assert proc.returncode != 0, output
    assert "Watchdog caught collective operation timeout: barrier seq 4 of group 0" in proc.stderr, output
    assert "(timeout 3 s)" in proc.stderr, output
    straggler = nprocs - 1
    others = "rank 0" if nprocs == 2 else f"ranks 0-{nprocs - 2}"
    assert f"{others} in barrier seq 4 of group 0" in proc.stderr, output
    assert f"behind: rank {straggler} (collective seq 3 < 4)" in proc.stderr, output

    traces = tmp_path / "traces"
    dumps = sorted(p for p in os.listdir(traces) if p.endswith(".json"))
    assert len(dumps) == nprocs, (dumps, output)
    by_rank = {d["rank"]: d for d in (json.loads((traces / name).read_text()) for name in dumps)}
    assert set(by_rank) == set(range(nprocs))
    for r, dump in by_rank.items():
        assert dump["world_size"] == nprocs and dump["groups"][0]["name"] == "0"
        assert dump["groups"][0]["seq"] == (3 if r == straggler else 4)
        assert [f["op"] for f in dump["in_flight"]] == ([] if r == straggler else ["barrier"])
        ring = [(e["op"], e["seq"], e["dtype"], e["shape"], e["state"]) for e in dump["entries"]]
        warm_up = [("allreduce", seq, "float32", [4], "completed") for seq in (1, 2, 3)]
        assert ring == (warm_up if r == straggler else warm_up[1:] + [("barrier", 4, None, None, "started")])

    report = trace(traces)
    assert report.returncode == 0, report.stderr
    assert f"dumps from {nprocs} of {nprocs} ranks" in report.stdout
    assert f"rank {straggler} not inside any operation" in report.stdout, report.stdout
    assert f"behind: rank {straggler}" in report.stdout, report.stdout
