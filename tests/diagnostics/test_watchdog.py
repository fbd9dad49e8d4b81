"""The watchdog: an operation outstanding past its group's timeout ends the job, after a roll call,
the ranks' dumps and a report of who is where; SIGUSR2 makes one rank dump. The jobs of
tests/faults/scenario.py. Also: test_flight_recorder.py (a straggler), test_faults.py (the exception
hook), tests/torch_backend/test_torch_backend_hangs.py and test_torch_backend_debug.py (under torch).
"""
import json
import os

import pytest

from support.fault_jobs import SERIAL_JOBS, run_job, trace
from support.launch import job_sizes

pytestmark = SERIAL_JOBS


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_hpc_c10d_timeout_ends_ranks_that_disagree_on_the_operation(nprocs, tmp_path):
    """No timeout= in the program: HPC_C10D_TIMEOUT replaces torch's 30 minutes for the whole job."""
    proc, took, output = run_job("disagree", nprocs, tmp_path, HPC_C10D_TIMEOUT="2.5")
    assert proc.returncode != 0, output
    assert "Watchdog caught collective operation timeout" in proc.stderr, output
    assert "(timeout 2.5 s)" in proc.stderr, output
    others = "rank 0" if nprocs == 2 else f"ranks 0-{nprocs - 2}"
    assert f"{others} in all_reduce seq 4 of group 0" in proc.stderr, output
    assert f"rank {nprocs - 1} in barrier seq 4 of group 0" in proc.stderr, output
    assert took < 30, f"took {took:.1f} s\n{output}"


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_ranks_done_early_are_reported_in_destroy_process_group(nprocs, tmp_path):
    proc, took, output = run_job("finished", nprocs, tmp_path)
    assert proc.returncode != 0, output
    others = "rank 1" if nprocs == 2 else f"ranks 1-{nprocs - 1}"
    assert f"dumps from {nprocs} of {nprocs} ranks" in proc.stderr and "dead" not in proc.stderr, output
    assert f"rank 0 in all_reduce seq 4 of group 0 float32[8]; {others} in destroy_process_group\n" in proc.stderr, \
        output


def test_sigusr2_dumps_a_rank_and_the_job_goes_on(tmp_path):
    proc, took, output = run_job("usr2", 3, tmp_path)
    assert proc.returncode == 0, output
    assert all(f"rank {r}: done" in proc.stdout for r in range(3)), output
    traces = tmp_path / "traces"
    dumps = [json.loads((traces / name).read_text()) for name in os.listdir(traces) if name.endswith(".json")]
    assert [(d["rank"], d["reason"]) for d in dumps] == [(0, "SIGUSR2")], output
    assert [(f["op"], f["seq"]) for f in dumps[0]["in_flight"]] == [("barrier", 4)], dumps[0]
    report = trace(traces)  # the other ranks were not asked, not dead
    assert "no dump from ranks 1-2 on" in report.stdout and "SIGUSR2 makes only the ranks it reaches dump" \
        in report.stdout and "dead" not in report.stdout, report.stdout
