"""Surviving the loss of a rank or a node under ULFM (Open MPI 5, ``--with-ft ulfm``), on the designated
simulated cluster (slurm/sim_cluster.sh), with raw mpi4py (tests/faults/ulfm_survive.py): no hpc_c10d.

A job on every node of the cluster (``sim_cluster.sh ompi-mpiexec``: prterun on node1, PRRTE's ssh launcher
through the cluster's stand-in; 2 nodes x 2 ranks, or 1 rank a node on 3-4 nodes: ``sim_test_layout()``)
loops Allreduce on a Dup of COMM_WORLD with MPI.ERRORS_RETURN. The fault: node2's last rank SIGKILLs itself,
node2's link goes down, or every process of node2 is SIGKILLed (node2 in every layout: never node1, where
prterun runs; at 1 rank a node, its rank 1 leaves survivors on both sides, renumbered by Shrink). The
survivors must get an MPI error (not a hang, not a wrong sum with MPI_SUCCESS), Revoke, Shrink and finish
with correct sums on the smaller communicator (each prints "rank R: survived ..."). What was measured at
2 nodes x 2 ranks when these were written (docs/slurm.md, "When a rank or a node dies"):

- a rank of node2 killed: survivors error within ~0.05 s and go on (test passes);
- node2's link down: an error only with ULFM's heartbeat detector on (``mpi_ft_detector``), after about
  its timeout; node1's ranks go on, and so do node2's (each side shrinks to its own two ranks: a split
  brain); prterun does not exit by itself afterwards (it waits for node2), so the test ends it;
- every process of node2 killed (its PRRTE daemon and the ssh stand-in with them): prterun ends the whole
  job ("A daemon failed to report back"; "PRTE has lost communication with a remote daemon ... will
  terminate the job" when the ssh session outlives the node), node1's ranks sometimes after they shrank,
  sometimes before: PRRTE 3.0 (Open MPI 5.0) aborts on any daemon loss (errmgr/dvm) until a PRRTE that
  tolerates lost daemons (openpmix/prrte#2443) ships with Open MPI; the test checks the job ends;
- without ``--mca coll ^han`` a failure across nodes can make Allreduce return MPI_SUCCESS with a wrong sum
  (HAN, chosen on multi-node communicators, is not fault tolerant: open-mpi/ompi#13915); an expected failure.

At 4 nodes x 1 rank the 3 survivors are on 3 nodes and reach each other over TCP only, and Open MPI 5.0.11's
ULFM did not recover there (measured on this simulated cluster): with node2's link down every survivor gets
the error within ~3.5 s but their Shrink never returns (``SHRINK_ACROSS_NODES``: an expected failure with raw
mpi4py; the cases on hpc_c10d and the example, which wait on the same Shrink, skip there), and
after a SIGKILLed rank, without the heartbeat detector, a survivor sometimes never hears of the failure
(``SIGKILL_ACROSS_NODES``: skipped, as its outcome varies from run to run). Losing every process of node2,
and a cut link going unnoticed without the detector, hold as at 2 nodes.

The same faults run with hpc_c10d (tests/faults/lost_node.py: ProcessFailedError, shrink_group, only
the larger side of a cut going on) and with examples/surviving_failures.py (node2's link down: its final
model equals the reference).

Serial tests that start jobs of their own. They run only on a designated simulated cluster (``eval "$(bash
slurm/sim_cluster.sh env)"``) with Open MPI as the MPI (the mpiexec beside this Python, or $MPIEXEC),
else skip saying why; they never bring a cluster up or down; a link they take down is always put back
up and every process of the job is gone when a test ends.
"""
import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from support import launch as _launch
from support.launch import ROOT, SIM_SCRIPT, fresh_env, outer_world_size

PROGRAM = os.path.join(ROOT, "tests", "faults", "ulfm_survive.py")  # raw mpi4py
LIBRARY_PROGRAM = os.path.join(ROOT, "tests", "faults", "lost_node.py")  # the same job on hpc_c10d
START_S = 120  # launch to every rank looping (a loaded 2-core VM)
BOUND_S = 60  # fault to node1's survivors reporting
GONE_S = 20
LOST_NODE = "node2"  # every fault is on node2
NO_HAN = ("--mca", "coll", "^han")
# ULFM's heartbeat detector: a cut link is noticed after about its timeout (Shrink takes about twice
# that); shorter settings gave false failures on a loaded 2-core VM
DETECTOR = ("--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_period", "1",
            "--mca", "mpi_ft_detector_timeout", "4")
SHRINK_ACROSS_NODES = (
    "survivors on several nodes (1 rank a node): with node2's link down, Open MPI 5.0.11's ULFM Shrink never "
    "returns on the 3 survivors, though each got MPI_ERR_PROC_FAILED or MPI_ERR_REVOKED from the heartbeat "
    "detector within ~3.5 s (no return after 60-200 s in 8 of 8 runs at 4x1: raw mpi4py, hpc_c10d and the "
    "example; the cut-off rank's own Shrink returns after ~16 s)")
SIGKILL_ACROSS_NODES = (
    "survivors on several nodes (1 rank a node): after a SIGKILLed rank, without ULFM's heartbeat detector, "
    "Open MPI 5.0.11 at times gives a survivor neither an error nor the revoke; it hangs, and the others' "
    "Shrink, after 36-145 s, drops it (and at times others) as failed. At 4x1 raw mpi4py recovered in 2 of 7 "
    "runs (one of them the default-collectives case), hpc_c10d in 0 of 3 within 60 s; with the detector on, "
    "5 of 5 runs recovered in 0.04 s but MPI_Finalize then hung. An outcome that varies from run to run: "
    "skipped, not an expected failure")
SURVIVED = re.compile(r"rank (\d+): survived: new rank (\d+) of (\d+), failed \[([\d, ]*)\].*wrong_results (\d+)")


def _problem():
    if outer_world_size() > 1:
        return "serial test that starts jobs itself; run without mpiexec"
    if _launch.flavour().name != "openmpi":
        return (f"ULFM needs Open MPI 5 (the MPI here is {_launch.flavour().name}: "
                "MPIEXEC=<Open MPI's mpiexec> or an Open MPI venv)")
    return _launch.sim_cluster_problem(nodes=2)


# CI's multi-node stage sets HPC_C10D_REQUIRE_ULFM=1: a problem is then a failure, not a skip
pytestmark = pytest.mark.skipif(bool(_problem()) and os.environ.get("HPC_C10D_REQUIRE_ULFM") != "1",
                                reason=_problem() or "-")


def _layout():
    """(world size, ranks per node, node2's ranks, the other nodes' ranks) of the job."""
    nodes, per_node = _launch.sim_test_layout()
    size, lost = nodes * per_node, tuple(range(per_node, 2 * per_node))
    return size, per_node, lost, tuple(r for r in range(size) if r not in lost)


def _survivors_span_nodes():
    """Whether node2's loss leaves survivors on more than one node (3-4 nodes), talking over TCP only."""
    return _launch.sim_test_layout()[0] > 2


def _bound_for_shrink_across_nodes(request, raw=True):
    """Seconds to wait for the survivors of node2's cut link: BOUND_S, or where they span several nodes
    (Shrink does not return there, ``SHRINK_ACROSS_NODES``) a strict expected failure after 12 s, ample
    for a Shrink that returns within a second once the error is known (about 3.5 s). The cases on
    hpc_c10d (``raw=False``) skip there: they wait on the same Shrink, whose failure the raw case shows."""
    if not _survivors_span_nodes():
        return BOUND_S
    if not raw:
        pytest.skip(f"{SHRINK_ACROSS_NODES}; test_node2_link_down_node1_ranks_shrink_and_go_on is the expected "
                    "failure that shows it with raw mpi4py")
    request.applymarker(pytest.mark.xfail(strict=True, reason=SHRINK_ACROSS_NODES))
    return 12


def _one_victim():
    """(node2's last rank, which SIGKILLs itself; the ranks left)."""
    size, _, lost, _ = _layout()
    return lost[-1], tuple(r for r in range(size) if r != lost[-1])


def _env(**extra):
    env = fresh_env(HPC_C10D_SIM_OMPI_MPIEXEC=_launch.mpiexec(), **extra)
    env["HPC_C10D_SIM_DIR"] = _launch.sim_cluster_env()["HPC_C10D_SIM_DIR"]
    env.pop("MPIR_CVAR_NOLOCAL", None)
    return env


def _sim(*args):
    return subprocess.run(["timeout", "60", "bash", SIM_SCRIPT, *args], env=_env(), capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL)


def _logs(log_dir):
    return {int(re.search(r"rank(\d+)\.log$", p).group(1)): Path(p).read_text(errors="replace")
            for p in glob.glob(os.path.join(log_dir, "rank*.log"))}


def _survivors(log_dir):
    """{world rank: (new rank, new size, failed ranks, wrong results)} of the ranks that report surviving."""
    found = {}
    for text in _logs(log_dir).values():
        for m in SURVIVED.finditer(text):
            failed = tuple(int(r) for r in m[4].replace(" ", "").split(",") if r)
            found[int(m[1])] = (int(m[2]), int(m[3]), failed, int(m[5]))
    return found


def _settled(log_dir, program):
    """For the library's job, node2's ranks have said they are cut off too (or there are none left)."""
    if program != LIBRARY_PROGRAM:
        return True
    logs = _logs(log_dir)
    return all("cut off" in logs.get(r, "cut off") or "survived" in logs.get(r, "") for r in _layout()[2])


def _job_pids(prefix, marks):
    """Pids of processes in the cluster's namespaces whose command line holds one of ``marks``."""
    inodes = set()
    for path in glob.glob(f"/run/netns/{prefix}-*"):
        try:
            inodes.add(os.stat(path).st_ino)
        except OSError:
            pass
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino not in inodes:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(mark in cmd for mark in marks):
            pids.append(int(pid))
    return pids


@contextlib.contextmanager
def _job(tmp_path, argv, mca=(), env=None):
    """Start ``argv`` (after python) on the layout's nodes under ULFM, in ``tmp_path``; yield (the
    launcher's Popen, what it printed so far, the fault: ``fault('link'|'kill')`` on node2). Leaves
    nothing behind: node2's link back up, every process of the job gone (the launcher may wait for
    node2's ranks for ever)."""
    prefix = _launch.sim_cluster_settings()["SIM_PREFIX"]
    size, per_node, _, _ = _layout()
    cmd = ["bash", SIM_SCRIPT, "ompi-mpiexec", "-n", str(size), "--map-by", f"ppr:{per_node}:node", "--with-ft",
           "ulfm", *mca, "--", sys.executable, *argv]
    out_path = tmp_path / "launcher.out"
    cut = []
    with open(out_path, "w") as out:
        job = subprocess.Popen(cmd, env=_env(**(env or {})), cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    marks = [str(tmp_path), argv[0], f"prterun-node1-{job.pid}@"]  # the ranks; prterun's daemons

    def printed():
        return f"$ {' '.join(cmd)}\n--- launcher ---\n{out_path.read_text(errors='replace')}"

    def fault(kind):
        if kind == "link":
            cut.append(True)
            done = _sim("link", LOST_NODE, "down")
        else:
            done = _sim("kill", LOST_NODE)
        assert done.returncode == 0, done.stderr

    try:
        yield job, printed, fault
    finally:
        if cut:
            restored = _sim("link", LOST_NODE, "up")
            assert restored.returncode == 0, f"could not put {LOST_NODE}'s link back up: {restored.stderr}"
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + GONE_S
        while True:  # prterun's daemons and the ranks, on every node
            left = _job_pids(prefix, marks)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not _job_pids(prefix, marks), f"processes of the job left behind\n{printed()}"


class _DaemonLostAtLaunch(Exception):
    """prterun ended the job before any rank started: a PRRTE daemon exited before it reported back."""


def _run(tmp_path, fault, mca=(), victims="", want=None, bound=BOUND_S, program=PROGRAM):
    """Start the job, wait for it to loop, inflict ``fault`` ('rank', 'link' or 'kill' on node2), wait until
    the ranks in ``want`` (default: the other nodes') report surviving (or ``bound`` seconds); clean everything
    up. Return (survivors, output, seconds from the fault to the last report, whether the launcher had exited
    by itself).

    A launch that PRRTE gives up before any rank runs (node2's prted exited with status 1, without a word,
    once in a CI run, right after the previous test's job; not reproduced) is tried once more, with a
    warning: these tests are about faults after the start."""
    for attempt in (1, 2):
        try:
            return _run_once(tmp_path / f"attempt{attempt}", fault, mca, victims, want, bound, program)
        except _DaemonLostAtLaunch as lost:
            if attempt == 2:
                pytest.fail(f"the job did not start, twice\n{lost}")
            warnings.warn(f"the job did not start; starting it again\n{lost}", stacklevel=2)


def _run_once(tmp_path, fault, mca, victims, want, bound, program):
    prefix = _launch.sim_cluster_settings()["SIM_PREFIX"]
    size, _, _, others = _layout()
    want = others if want is None else want
    log_dir = str(tmp_path / "ranks")
    os.makedirs(log_dir)  # and tmp_path
    env = dict(ULFM_VICTIMS=victims, ULFM_KILL_STEP="200", ULFM_SECONDS=str(START_S + BOUND_S), ULFM_PAUSE="0.01")
    took, exited = None, False
    with _job(tmp_path, [program, log_dir], mca, env) as (job, printed, inflict):

        def output():
            ranks = "\n".join(f"--- rank {r} ---\n{t}" for r, t in sorted(_logs(log_dir).items()))
            return f"{printed()}\n{ranks}"

        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and job.poll() is None:
            if sum("looping" in t for t in _logs(log_dir).values()) == size:
                break
            time.sleep(0.2)
        logs = _logs(log_dir)
        if job.poll() is not None and not logs and "A daemon failed to report back" in printed():
            raise _DaemonLostAtLaunch(output())
        assert sum("looping" in t for t in logs.values()) == size, f"the job did not start\n{output()}"
        time.sleep(0.5)
        fault_at = time.monotonic()
        if fault != "rank":
            inflict(fault)
        deadline = fault_at + bound
        while time.monotonic() < deadline:
            if set(want) <= set(_survivors(log_dir)) and _settled(log_dir, program):
                took = time.monotonic() - fault_at
                break
            if job.poll() is not None and not _job_pids(prefix, [log_dir]):
                break  # the job is over and no rank is left to report
            time.sleep(0.2)
        if took is not None:
            try:
                job.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        exited = job.poll() is not None
        text = output()
    return _survivors(log_dir), text, took, exited


def _check_went_on(survivors, ranks, failed, size, text):
    for r in ranks:
        assert r in survivors, f"rank {r} did not report surviving\n{text}"
        new_rank, new_size, lost, wrong = survivors[r]
        assert (new_size, lost) == (size, tuple(failed)), (survivors[r], text)
        assert wrong == 0, f"rank {r}: an Allreduce returned MPI_SUCCESS with a wrong sum\n{text}"
    assert sorted(survivors[r][0] for r in ranks) == list(range(size)), (survivors, text)


def test_a_rank_of_node2_sigkilled_the_other_three_shrink_and_go_on(tmp_path):
    if _survivors_span_nodes():
        pytest.skip(SIGKILL_ACROSS_NODES)
    victim, rest = _one_victim()
    survivors, text, took, exited = _run(tmp_path, "rank", NO_HAN, victims=str(victim), want=rest)
    _check_went_on(survivors, rest, (victim,), len(rest), text)
    assert exited, f"the launcher did not exit after the survivors finished\n{text}"


def test_node2_link_down_node1_ranks_shrink_and_go_on(tmp_path, request):
    # node1's ranks: at 1 rank a node, those of every node but node2
    bound = _bound_for_shrink_across_nodes(request)
    _, _, lost, others = _layout()
    survivors, text, took, exited = _run(tmp_path, "link", NO_HAN + DETECTOR, bound=bound)
    _check_went_on(survivors, others, lost, len(others), text)
    # measured at 2x2: node2's ranks also go on, as a world of their own (failed [0, 1]); prterun never exits


def test_node2_link_down_is_never_reported_without_the_heartbeat_detector(tmp_path):
    # 10 s: with the detector on, the survivors report within about 4 s (its timeout) plus the Shrink
    survivors, text, took, exited = _run(tmp_path, "link", NO_HAN, bound=10)
    assert not survivors, f"the survivors detected the cut link without mpi_ft_detector\n{text}"


def test_every_process_of_node2_killed_ends_the_job(tmp_path):
    # PRRTE 3.0 (Open MPI 5.0.x) ends the whole job when it loses its daemon on node2 ('A daemon failed
    # to report back' here, where the ssh stand-in dies with node2; 'PRTE has lost communication with a
    # remote daemon' when the ssh session outlives it); openpmix/prrte#2443 (tolerating lost daemons) is
    # not in an Open MPI release yet. node1's ranks sometimes shrink before that and sometimes not
    # (both seen); what holds is that the launcher ends the job and nothing hangs or is left behind.
    survivors, text, took, exited = _run(tmp_path, "kill", NO_HAN + DETECTOR)
    assert exited, f"the launcher did not end the job after node2 was lost\n{text}"


@pytest.mark.xfail(strict=True, reason="coll/han, chosen on communicators that span nodes, is not fault "
                   "tolerant: Allreduce returned MPI_SUCCESS with a wrong sum on the survivors "
                   "(open-mpi/ompi#13915); launch with --mca coll ^han")
def test_default_collectives_report_the_failure_of_a_rank_on_node2(tmp_path):
    if _survivors_span_nodes():
        pytest.skip(SIGKILL_ACROSS_NODES)
    victim, rest = _one_victim()
    survivors, text, took, exited = _run(tmp_path, "rank", (), victims=str(victim), want=rest)
    _check_went_on(survivors, rest, (victim,), len(rest), text)


# The same faults with hpc_c10d (tests/faults/lost_node.py): ProcessFailedError, shrink_group. No
# --mca coll ^han here: under ULFM the library leaves HAN out itself (mpi/ulfm.before_init).
def test_library_a_rank_of_node2_sigkilled_the_other_three_shrink_and_go_on(tmp_path):
    if _survivors_span_nodes():
        pytest.skip(SIGKILL_ACROSS_NODES)
    victim, rest = _one_victim()
    survivors, text, took, exited = _run(tmp_path, "rank", victims=str(victim), want=rest, program=LIBRARY_PROGRAM)
    _check_went_on(survivors, rest, (victim,), len(rest), text)
    assert f"hosts ['{LOST_NODE}']" in text, text
    assert exited, f"the launcher did not exit after the survivors finished\n{text}"


def test_library_node2_link_down_node1_goes_on_and_node2_stops(tmp_path, request):
    bound = _bound_for_shrink_across_nodes(request, raw=False)
    _, _, lost, others = _layout()
    survivors, text, took, exited = _run(tmp_path, "link", DETECTOR, bound=bound, program=LIBRARY_PROGRAM)
    _check_went_on(survivors, others, lost, len(others), text)
    assert not set(lost) & set(survivors), f"node2's ranks went on too (split brain)\n{text}"
    assert text.count("cut off: ") >= len(lost), f"node2's ranks were not told they are cut off\n{text}"


def test_library_every_process_of_node2_killed_ends_the_job(tmp_path):
    # as the raw case above: PRRTE ends the job; nothing may hang or be left behind
    survivors, text, took, exited = _run(tmp_path, "kill", DETECTOR, program=LIBRARY_PROGRAM)
    assert exited, f"the launcher did not end the job after node2 was lost\n{text}"


def test_the_example_survives_node2s_link_going_down(tmp_path, request):
    # examples/surviving_failures.py, paced, checkpointing every 5 steps; node2's link goes down after
    # its first checkpoint. The other nodes' ranks (node1's two at 2x2) shrink, reload the last checkpoint
    # without node2's and finish, and their final model equals all ranks up to that checkpoint and the
    # survivors after it.
    from failures.test_surviving_failures import EXAMPLE, reference, saved  # needs h5py (skips without)

    bound = _bound_for_shrink_across_nodes(request, raw=False)
    size, _, lost, others = _layout()
    steps = 40
    finished = f"finished {steps} steps on {len(others)} ranks"
    with _job(tmp_path, [EXAMPLE, "--steps", str(steps), "--every", "5", "--pace", "0.3"], DETECTOR) as \
            (job, printed, inflict):
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and not (tmp_path / "surviving.h5").exists():
            assert job.poll() is None, printed()
            time.sleep(0.2)
        assert (tmp_path / "surviving.h5").exists(), f"no first checkpoint\n{printed()}"
        inflict("link")
        deadline = time.monotonic() + bound + steps * 0.3
        while time.monotonic() < deadline and finished not in printed():
            time.sleep(0.5)
        text = printed()
    assert finished in text, text
    assert f"lost rank(s) {list(lost)} on {[LOST_NODE] * len(lost)}" in text, text
    resumed = int(re.search(rf"step (\d+): {len(others)} ranks", text)[1])
    weights, momentum, step = saved(tmp_path)
    want_weights, want_momentum = reference(size, resumed, steps=steps, lost=len(lost))
    assert step == steps, text
    np.testing.assert_allclose(weights, want_weights, rtol=1e-9, atol=1e-12, err_msg=text)
    np.testing.assert_allclose(momentum, want_momentum, rtol=1e-9, atol=1e-12, err_msg=text)
