"""Jobs that misbehave (tests/faults/scenario.py, mismatch.py), each within a time bound.

Serial tests that start mpiexec themselves (skipped under an outer mpiexec). They check that an
exception on one rank ends the job, that ranks calling a collective with different shapes end the
job without hanging (at debug level OFF) or raise on every rank (DETAIL), that a bad
HPC_C10D_TIMEOUT fails init, and that monitored_barrier names the missing rank. A hang and its
report: test_watchdog.py, test_flight_recorder.py, test_trace_report.py.
"""
import re
import subprocess
import sys

import pytest

from support.fault_jobs import MISMATCH, SERIAL_JOBS, run_job
from support.launch import ROOT, flavour, fresh_env, job_sizes

pytestmark = SERIAL_JOBS


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_mismatched_shapes_in_detail_raise_on_every_rank(nprocs, tmp_path):
    proc, took, output = run_job("mismatch", nprocs, tmp_path, HPC_C10D_DEBUG="DETAIL")
    assert proc.returncode == 0, output
    others = "rank 0" if nprocs == 2 else f"ranks 0-{nprocs - 2}"
    for r in range(nprocs):
        assert f"rank {r}: DistError: Detected mismatch between collectives" in proc.stdout, output
        assert f"rank {r}: then all_reduce gave {[float(nprocs)] * 4}" in proc.stdout, output
    assert proc.stdout.count(f"shape differs: {others}: (4,); rank {nprocs - 1}: (5,)") == nprocs, output


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


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
@pytest.mark.parametrize("mpi_errors", ["exception", "fatal"])
def test_a_mismatched_broadcast_at_off_ends_the_job_naming_rank_op_and_detail(nprocs, mpi_errors, tmp_path):
    """MPICH reports the mismatch where a receive has the wrong size: on the last rank. hpc_c10d raises
    DistBackendError there, and the exception hook ends the job. The ranks whose size matched the
    root's got the root's data. MPI4PY_RC_ERRORS=fatal (MPI errors abort inside MPI on the
    application's communicators) leaves hpc_c10d's communicators returning errors. Open MPI does
    not see a receive larger than the message: the last rank gets the root's 4 values and keeps its
    fifth (only HPC_C10D_DEBUG=DETAIL catches that)."""
    proc, took, output = run_job("broadcast", nprocs, tmp_path, program=MISMATCH, MPI4PY_RC_ERRORS=mpi_errors)
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


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
@pytest.mark.parametrize("op, mpich_name", [("all_reduce", "Allreduce"), ("all_gather_into_tensor", "Allgather")])
def test_a_mismatched_exchange_at_off_ends_the_job_without_hanging(nprocs, op, mpich_name, tmp_path):
    """Where MPI returns the error, the job ends with hpc_c10d's message, as for broadcast. MPICH
    does not return it: a message truncated inside a collective's paired exchange (MPIC_Sendrecv)
    is fatal whatever the error handler, so MPICH ends the job with its own message, which names
    the world rank ("on node R"). A rank whose receives were large enough may return first."""
    proc, took, output = run_job(op, nprocs, tmp_path, program=MISMATCH)
    assert proc.returncode != 0, output
    ours = f"{op} seq 4 of group 0" in proc.stderr and "HPC_C10D_DEBUG=DETAIL" in proc.stderr
    mpich = re.search(rf"Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): Fatal error in internal_{mpich_name}_c: "
                      r"Message truncated", proc.stderr)
    assert ours or mpich, output


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_a_refusal_ends_the_others_blocking_call_long_before_the_timeout(nprocs, tmp_path):
    """Rank 0 refuses a blocking gather's empty list while the others send it 8 MB each, inside
    MPI's blocking gather, which nothing interrupts: the refusal's notice reaches their watchdog,
    which ends the job naming the refusal, not the 60 s timeout."""
    proc, took, output = run_job("refuses", nprocs, tmp_path, HPC_C10D_TIMEOUT="60")
    assert proc.returncode != 0, output
    assert "rank 0: ValueError: Argument ``gather_list`` must be specified on destination rank." in proc.stdout, output
    assert ("gather #4 in group '0': rank 0 refused its arguments (ValueError: Argument ``gather_list`` must be "
            "specified on destination rank.)") in proc.stderr, output
    assert "inside MPI's blocking gather, which cannot be interrupted" in proc.stderr, output
    assert took < 30, f"took {took:.1f} s\n{output}"


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_a_refusal_raises_in_the_others_blocking_calls_with_notices_raise(nprocs, tmp_path):
    """HPC_C10D_REFUSAL_NOTICES=raise: blocking calls wait watching the notices, so the others raise
    DistBackendError, and every rank's next call on the group says it is unusable."""
    proc, took, output = run_job("refuses", nprocs, tmp_path, HPC_C10D_TIMEOUT="60", HPC_C10D_REFUSAL_NOTICES="raise")
    assert proc.returncode == 0, output
    for rank in range(1, nprocs):
        assert (f"rank {rank}: DistBackendError: gather #4 in group '0': rank 0 refused its arguments "
                f"(ValueError: Argument ``gather_list`` must be specified on destination rank.) while rank {rank} "
                "took part; the group is unusable now") in proc.stdout, output
    for rank in range(nprocs):
        assert re.search(rf"rank {rank}: then DistBackendError: .*the group is unusable now", proc.stdout), output
        assert f"rank {rank}: done" in proc.stdout, output


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_an_exception_on_one_rank_ends_the_job_promptly(nprocs, tmp_path):
    proc, took, output = run_job("raises", nprocs, tmp_path)
    assert proc.returncode != 0, output
    assert f"[rank {nprocs - 1}]: ValueError: a bad batch on the last rank" in proc.stderr, output
    assert took < 30, f"took {took:.1f} s\n{output}"


def test_the_exception_hook_can_be_turned_off(tmp_path):
    """With HPC_C10D_ABORT_ON_EXCEPTION=0 the others are ended by the watchdog instead."""
    proc, took, output = run_job("raises", 2, tmp_path, HPC_C10D_ABORT_ON_EXCEPTION="0")
    assert proc.returncode != 0, output
    assert "aborting the job" not in proc.stderr, output
    assert "Watchdog caught collective operation timeout: all_reduce seq 4 of group 0" in proc.stderr, output


@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
def test_monitored_barrier_names_the_missing_rank(nprocs, tmp_path):
    proc, took, output = run_job("monitored", nprocs, tmp_path)
    last = nprocs - 1
    assert proc.returncode == 0, output
    assert f"rank 0: monitored_barrier: [Rank 0]: Rank {last} failed to pass monitoredBarrier" in proc.stdout, output
    assert f"rank {last}: done" in proc.stdout, output
