"""Fault scenarios as real multi-rank jobs (tests/faults/), each within a time bound.

Serial tests that start mpiexec themselves (skipped under an outer mpiexec). They check that
a hang becomes a prompt abort with a report naming the operation (also with the timeout taken
from HPC_C10D_TIMEOUT), that an exception on one rank ends the job, that ranks calling a
collective with different shapes at debug level OFF end the job without hanging, that
monitored_barrier names the missing rank, and that the flight-recorder dumps parse and
``python -m hpc_c10d trace`` names the straggler.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from _launch import ROOT, flavour, fresh_env, launch, mpiexec, outer_world_size

SCENARIO = os.path.join(ROOT, "tests", "faults", "scenario.py")
MISMATCH = os.path.join(ROOT, "tests", "faults", "mismatch.py")
BOUND_S = 45  # each job must end well inside a minute

pytestmark = [
    pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself"),
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH"),
]


def _run(scenario, nprocs, tmp_path, program=SCENARIO, **env):
    env = {"HPC_C10D_TRACE_DIR": str(tmp_path / "traces"), "HPC_C10D_ABORT_GRACE": "2", **env}
    start = time.monotonic()
    proc, cmd = launch(nprocs, [program, scenario], BOUND_S, env=env, cwd=str(tmp_path))
    took = time.monotonic() - start
    output = f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode != 124, f"{scenario} at -n {nprocs} hung past {BOUND_S} s\n{output}"
    return proc, took, output


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_a_rank_that_never_joins_the_barrier_ends_the_job_with_a_report(nprocs, tmp_path):
    """The program's timeout=3 s wins over HPC_C10D_TIMEOUT."""
    proc, took, output = _run("straggler", nprocs, tmp_path, HPC_C10D_TRACE_BUFFER_SIZE="3", HPC_C10D_TIMEOUT="600")
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

    report = _trace(traces)
    assert report.returncode == 0, report.stderr
    assert f"dumps from {nprocs} of {nprocs} ranks" in report.stdout
    assert f"rank {straggler} not inside any operation" in report.stdout, report.stdout
    assert f"behind: rank {straggler}" in report.stdout, report.stdout


def _trace(directory):
    return subprocess.run([sys.executable, "-m", "hpc_c10d", "trace", str(directory)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_sigusr2_dumps_a_rank_and_the_job_goes_on(tmp_path):
    proc, took, output = _run("usr2", 3, tmp_path)
    assert proc.returncode == 0, output
    assert all(f"rank {r}: done" in proc.stdout for r in range(3)), output
    traces = tmp_path / "traces"
    dumps = [json.loads((traces / name).read_text()) for name in os.listdir(traces) if name.endswith(".json")]
    assert [(d["rank"], d["reason"]) for d in dumps] == [(0, "SIGUSR2")], output
    assert [(f["op"], f["seq"]) for f in dumps[0]["in_flight"]] == [("barrier", 4)], dumps[0]
    report = _trace(traces)  # the other ranks were not asked, not dead
    assert "no dump from ranks 1-2 on" in report.stdout and "SIGUSR2 makes only the ranks it reaches dump" \
        in report.stdout and "dead" not in report.stdout, report.stdout


@pytest.mark.parametrize("nprocs", [2, 3])
def test_ranks_done_early_are_reported_in_destroy_process_group(nprocs, tmp_path):
    proc, took, output = _run("finished", nprocs, tmp_path)
    assert proc.returncode != 0, output
    others = "rank 1" if nprocs == 2 else f"ranks 1-{nprocs - 1}"
    assert f"dumps from {nprocs} of {nprocs} ranks" in proc.stderr and "dead" not in proc.stderr, output
    assert f"rank 0 in all_reduce seq 4 of group 0 float32[8]; {others} in destroy_process_group\n" in proc.stderr, \
        output


def test_trace_of_a_missing_directory_says_so(tmp_path):
    report = _trace(tmp_path / "nonexistent")
    assert report.returncode == 1 and report.stdout == "", report.stdout
    assert f"{tmp_path / 'nonexistent'}: no such directory (dumps go to HPC_C10D_TRACE_DIR" in report.stderr
    report = _trace(tmp_path)
    assert report.returncode == 1 and report.stdout == f"no flight-recorder dumps found in {tmp_path}\n"


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_mismatched_shapes_in_detail_raise_on_every_rank(nprocs, tmp_path):
    proc, took, output = _run("mismatch", nprocs, tmp_path, HPC_C10D_DEBUG="DETAIL")
    assert proc.returncode == 0, output
    others = "rank 0" if nprocs == 2 else f"ranks 0-{nprocs - 2}"
    for r in range(nprocs):
        assert f"rank {r}: DistError: Detected mismatch between collectives" in proc.stdout, output
        assert f"rank {r}: then all_reduce gave {[float(nprocs)] * 4}" in proc.stdout, output
    assert proc.stdout.count(f"shape differs: {others}: (4,); rank {nprocs - 1}: (5,)") == nprocs, output


@pytest.mark.parametrize("nprocs", [2, 3])
def test_hpc_c10d_timeout_ends_ranks_that_disagree_on_the_operation(nprocs, tmp_path):
    """No timeout= in the program: HPC_C10D_TIMEOUT replaces torch's 30 minutes for the whole job."""
    proc, took, output = _run("disagree", nprocs, tmp_path, HPC_C10D_TIMEOUT="2.5")
    assert proc.returncode != 0, output
    assert "Watchdog caught collective operation timeout" in proc.stderr, output
    assert "(timeout 2.5 s)" in proc.stderr, output
    others = "rank 0" if nprocs == 2 else f"ranks 0-{nprocs - 2}"
    assert f"{others} in all_reduce seq 4 of group 0" in proc.stderr, output
    assert f"rank {nprocs - 1} in barrier seq 4 of group 0" in proc.stderr, output
    assert took < 30, f"took {took:.1f} s\n{output}"


_BEFORE_MPI = """
import sys
from datetime import timedelta
import hpc_c10d as dist
try:
    dist.init_process_group(timeout=timedelta(seconds=float(sys.argv[1])) if len(sys.argv) > 1 else None)
except ValueError as exc:
    print(exc)
print("MPI started:", "mpi4py.MPI" in sys.modules)
"""


@pytest.mark.parametrize("value", ["soon", "0", "-2", "nan", "inf", "1e300"])
@pytest.mark.parametrize("explicit", [[], ["5"]], ids=["no timeout=", "timeout=5s"])
def test_a_bad_hpc_c10d_timeout_fails_init_before_mpi_starts(value, explicit):
    """Checked like the other settings, also when timeout= would override it."""
    proc = subprocess.run([sys.executable, "-c", _BEFORE_MPI, *explicit], env=fresh_env(HPC_C10D_TIMEOUT=value),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    reason = "is not a number of seconds" if value == "soon" else (
        "must be >= 0" if value == "-2" else "must be a positive, finite number of seconds")
    assert proc.stdout.splitlines() == [f"HPC_C10D_TIMEOUT={value!r} {reason}", "MPI started: False"], proc.stderr


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("mpi_errors", ["exception", "fatal"])
def test_a_mismatched_broadcast_at_off_ends_the_job_naming_rank_op_and_detail(nprocs, mpi_errors, tmp_path):
    """MPICH reports the mismatch where a receive has the wrong size: on the last rank. hpc_c10d raises
    DistBackendError there, and the exception hook ends the job. The ranks whose size matched the
    root's got the root's data. MPI4PY_RC_ERRORS=fatal (MPI errors abort inside MPI on the
    application's communicators) leaves hpc_c10d's communicators returning errors. Open MPI does
    not see a receive larger than the message: the last rank gets the root's 4 values and keeps its
    fifth (only HPC_C10D_DEBUG=DETAIL catches that)."""
    proc, took, output = _run("broadcast", nprocs, tmp_path, program=MISMATCH, MPI4PY_RC_ERRORS=mpi_errors)
    last = nprocs - 1
    if flavour().name == "openmpi":
        assert proc.returncode == 0, output
        assert f"rank {last}: broadcast returned [0.0, 0.0, 0.0, 0.0, {float(last)}]" in proc.stdout, output
        return
    assert proc.returncode != 0, output
    assert (f"[rank {last}]: hpc_c10d.errors.DistBackendError: [rank {last}] broadcast seq 4 of group 0 "
            f"float32[5] failed in MPI: ") in proc.stderr, output
    assert "the ranks may disagree on the shape, dtype or operation: rerun with HPC_C10D_DEBUG=DETAIL" in proc.stderr
    returned = re.findall(r"rank (\d+): broadcast returned (\[[^]]*\])", proc.stdout)  # lines may interleave
    assert all(r != str(last) and values == "[0.0, 0.0, 0.0, 0.0]" for r, values in returned), output


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("op, mpich_name", [("all_reduce", "Allreduce"), ("all_gather_into_tensor", "Allgather")])
def test_a_mismatched_exchange_at_off_ends_the_job_without_hanging(nprocs, op, mpich_name, tmp_path):
    """Where MPI returns the error, the job ends with hpc_c10d's message, as for broadcast. MPICH
    does not return it: a message truncated inside a collective's paired exchange (MPIC_Sendrecv)
    is fatal whatever the error handler, so MPICH ends the job with its own message, which names
    the world rank ("on node R"). A rank whose receives were large enough may return first."""
    proc, took, output = _run(op, nprocs, tmp_path, program=MISMATCH)
    assert proc.returncode != 0, output
    ours = f"{op} seq 4 of group 0" in proc.stderr and "HPC_C10D_DEBUG=DETAIL" in proc.stderr
    mpich = re.search(rf"Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): Fatal error in internal_{mpich_name}_c: "
                      r"Message truncated", proc.stderr)
    assert ours or mpich, output


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_an_exception_on_one_rank_ends_the_job_promptly(nprocs, tmp_path):
    proc, took, output = _run("raises", nprocs, tmp_path)
    assert proc.returncode != 0, output
    assert f"[rank {nprocs - 1}]: ValueError: a bad batch on the last rank" in proc.stderr, output
    assert took < 30, f"took {took:.1f} s\n{output}"


def test_the_exception_hook_can_be_turned_off(tmp_path):
    """With HPC_C10D_ABORT_ON_EXCEPTION=0 the others are ended by the watchdog instead."""
    proc, took, output = _run("raises", 2, tmp_path, HPC_C10D_ABORT_ON_EXCEPTION="0")
    assert proc.returncode != 0, output
    assert "aborting the job" not in proc.stderr, output
    assert "Watchdog caught collective operation timeout: all_reduce seq 4 of group 0" in proc.stderr, output


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_monitored_barrier_names_the_missing_rank(nprocs, tmp_path):
    proc, took, output = _run("monitored", nprocs, tmp_path)
    last = nprocs - 1
    assert proc.returncode == 0, output
    assert f"rank 0: monitored_barrier: [Rank 0]: Rank {last} failed to pass monitoredBarrier" in proc.stdout, output
    assert f"rank {last}: done" in proc.stdout, output


def test_trace_command_without_dumps_says_so(tmp_path):
    report = subprocess.run([sys.executable, "-m", "hpc_c10d", "trace", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 1
    assert "no flight-recorder dumps found" in report.stdout
