"""Node awareness across nodes, on the designated simulated cluster (slurm/sim_cluster.sh).

A 2-node x 2-rank job (tests/programs/node_awareness.py), under Hydra's mpiexec and under srun,
reports per rank: its node-local rank, the group new_subgroups() gave it (one per node) and that
group's all_reduce, the device bind_local_device's arithmetic picks for the CUDA_VISIBLE_DEVICES
the job sees (each node numbers its own GPUs), and what jobenv says (node list under srun -N 2).
It saves a checkpoint on the 2 nodes, which a 3-rank job on one node then loads; and it waits in
a Preemption loop until SIGUSR1 reaches the ranks of node2 only: every rank must stop at the
same step.

Serial tests (they start jobs of their own): the ``sim_cluster`` fixture skips them without a
designated cluster and fails them under HPC_C10D_REQUIRE_SIM_CLUSTER=1.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from _launch import ROOT, fresh_env, mpiexec, mpiexec_command, sim_cluster_command, sim_cluster_env

PROGRAM = os.path.join(ROOT, "tests", "programs", "node_awareness.py")
LAUNCHES = {  # ranks 0-1 on node1, 2-3 on node2
    "mpiexec": ["mpiexec", "-n", "4", "-ppn", "2", "-hosts", "node1,node2"],
    "srun": ["srun", "-N", "2", "-w", "node1,node2", "--ntasks-per-node=2", "--overcommit", "--mpi=pmi2",
             "--time=3"],
}
HOSTS = ["node1", "node1", "node2", "node2"]
START_S = 120  # until every rank is ready (Python, MPI and h5py start on a 2-core VM)
STOP_S = 30  # from the signal to the job's end

sys.path.insert(0, os.path.dirname(PROGRAM))
from node_awareness import reference  # noqa: E402  (the checkpoint the job writes)


def _lines(text, kind):
    """The ranks' JSON lines of ``kind``, by rank."""
    found = {}
    for line in text.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record["kind"] == kind:
                found[record["rank"]] = record
    return found


@pytest.fixture(scope="module", params=sorted(LAUNCHES))
def job(request, sim_cluster, tmp_path_factory):
    """Run the job once per launcher: wait until every rank is ready, send SIGUSR1 to node2's ranks
    only, wait for the end. Gives (launcher, output, checkpoint path or None, signalled ranks)."""
    launcher = request.param
    folder = tmp_path_factory.mktemp(f"node_awareness_{launcher}")
    try:
        import h5py  # noqa: F401
        checkpoint = str(folder / "ckpt.h5")
    except ImportError:
        checkpoint = None
    env = fresh_env(HPC_C10D_SIM_MPIEXEC=mpiexec(), CUDA_VISIBLE_DEVICES="0,1", HPC_C10D_TIMEOUT="60")
    env["HPC_C10D_SIM_DIR"] = sim_cluster_env()["HPC_C10D_SIM_DIR"]
    cmd = ["timeout", "-k", "10", str(START_S + STOP_S),
           *sim_cluster_command(*LAUNCHES[launcher], "--", sys.executable, PROGRAM, checkpoint or "-")]
    out_path = folder / "out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(folder),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, ready = time.monotonic() + START_S, {}
        while len(ready) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            ready = _lines(out_path.read_text(errors="replace"), "ready")
        signalled = sorted(r for r, record in ready.items() if record["host"] == "node2")
        if len(ready) == 4:
            for r in signalled:  # the pids are the host's: the nodes share its pid namespace
                os.kill(ready[r]["pid"], signal.SIGUSR1)
        proc.wait(timeout=STOP_S + START_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = f"$ {' '.join(cmd)}\n" + out_path.read_text(errors="replace")
    assert len(ready) == 4, f"not every rank got ready (exit {proc.returncode})\n{text}"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{text}"
    return launcher, text, checkpoint, signalled


def test_node_local_ranks_and_one_subgroup_per_node(job):
    _, text, _, _ = job
    facts = _lines(text, "facts")
    assert sorted(facts) == [0, 1, 2, 3], text
    assert [facts[r]["host"] for r in range(4)] == HOSTS, text
    assert [facts[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1], text
    assert [facts[r]["subgroup"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]], text
    assert {facts[r]["subgroups"] for r in range(4)} == {2}, text
    assert [facts[r]["subgroup_sum"] for r in range(4)] == [1, 1, 5, 5], text


def test_each_node_numbers_its_own_gpus(job):
    """With CUDA_VISIBLE_DEVICES=0,1 on every node, ranks pick devices 0 and 1 on each node (the
    node-local rank modulo the visible count), never 2 or 3."""
    _, text, _, _ = job
    facts = _lines(text, "facts")
    assert [facts[r]["device"] for r in range(4)] == [0, 1, 0, 1], text


def test_jobenv_sees_the_launcher_and_under_srun_both_nodes(job):
    launcher, text, _, _ = job
    jobs = [_lines(text, "facts")[r]["job"] for r in range(4)]
    assert all(not j["disagreements"] for j in jobs), jobs
    if launcher == "srun":
        assert {j["launcher"] for j in jobs} == {"srun"}, jobs
        assert all(j["nodes"] == ["node1", "node2"] and j["num_nodes"] == 2 for j in jobs), jobs
        assert all(j["tasks_per_node"] == [2, 2] for j in jobs), jobs
    else:
        assert {j["launcher"] for j in jobs} == {"mpich-hydra"}, jobs
    assert [j["env_local_rank"] for j in jobs] == [0, 1, 0, 1], jobs


def test_a_signal_on_one_node_stops_every_rank_at_the_same_step(job):
    _, text, _, signalled = job
    assert signalled == [2, 3], text
    stopped = _lines(text, "stopped")
    assert sorted(stopped) == [0, 1, 2, 3], text
    assert len({stopped[r]["step"] for r in range(4)}) == 1, text
    assert {stopped[r]["by"] for r in range(4)} == {"SIGUSR1"}, text
    assert [stopped[r]["requested"] for r in range(4)] == [False, False, True, True], text


def test_a_checkpoint_saved_on_two_nodes_loads_on_one(job, tmp_path):
    _, _, checkpoint, _ = job
    if checkpoint is None:
        pytest.skip("h5py is not installed (pip install h5py)")
    cmd = ["timeout", "-k", "10", "120", *mpiexec_command(3), sys.executable, PROGRAM, checkpoint, "load"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=fresh_env(), cwd=str(tmp_path),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    loaded, ref = _lines(proc.stdout, "loaded"), reference()
    assert sorted(loaded) == [0, 1, 2], proc.stdout
    np.testing.assert_array_equal(np.concatenate([loaded[r]["w"] for r in range(3)]), ref["w"])
    for r in range(3):
        np.testing.assert_array_equal(loaded[r]["b"], ref["b"])
        assert loaded[r]["step"] == ref["step"]
