"""Node awareness across nodes, on the designated simulated cluster (slurm/sim_cluster.sh).

A job on every node of the cluster (tests/programs/node_awareness.py; 2 nodes x 2 ranks, or 1 rank
a node on 3-4 nodes: ``sim_test_layout()``), under Hydra's mpiexec and under srun, reports
per rank: its node-local rank, the group new_subgroups() gave it (one per node) and that group's
all_reduce, the device bind_local_device's arithmetic picks for the CUDA_VISIBLE_DEVICES the job
sees (each node numbers its own GPUs), and what jobenv says (node list under srun -N). It saves a
checkpoint across the nodes, which a 3-rank job on one node then loads; and it waits in a
Preemption loop until SIGUSR1 reaches the ranks of node2 only: every rank must stop at the same
step.

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

from support.launch import (ROOT, fresh_env, mpiexec, mpiexec_command, sim_cluster_command, sim_cluster_env,
                            sim_test_layout)

PROGRAM = os.path.join(ROOT, "tests", "programs", "node_awareness.py")
LAUNCHERS = ("mpiexec", "srun")
SIGNALLED_NODE = "node2"
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


def _launch_options(launcher, nodes, per_node):
    """Rank r on node r // per_node + 1 (block placement), every node of the layout."""
    hosts = ",".join(f"node{k}" for k in range(1, nodes + 1))
    if launcher == "mpiexec":
        return ["mpiexec", "-n", str(nodes * per_node), "-ppn", str(per_node), "-hosts", hosts]
    return ["srun", "-N", str(nodes), "-w", hosts, f"--ntasks-per-node={per_node}", "--overcommit", "--mpi=pmi2",
            "--time=3"]


@pytest.fixture(scope="module")
def layout(sim_cluster):
    """(nodes, ranks per node, world size, each rank's host)."""
    nodes, per_node = sim_test_layout()
    size = nodes * per_node
    return nodes, per_node, size, [f"node{r // per_node + 1}" for r in range(size)]


@pytest.fixture(scope="module", params=LAUNCHERS)
def job(request, layout, tmp_path_factory):
    """Run the job once per launcher: wait until every rank is ready, send SIGUSR1 to node2's ranks
    only, wait for the end. Gives (launcher, output, checkpoint path or None, signalled ranks)."""
    launcher = request.param
    nodes, per_node, size, _ = layout
    folder = tmp_path_factory.mktemp(f"node_awareness_{launcher}")
    try:
        import h5py  # noqa: F401
        checkpoint = str(folder / "ckpt.h5")
    except ImportError:
        checkpoint = None
    env = fresh_env(HPC_C10D_SIM_MPIEXEC=mpiexec(), CUDA_VISIBLE_DEVICES="0,1", HPC_C10D_TIMEOUT="60")
    env["HPC_C10D_SIM_DIR"] = sim_cluster_env()["HPC_C10D_SIM_DIR"]
    cmd = ["timeout", "-k", "10", str(START_S + STOP_S), *sim_cluster_command(
        *_launch_options(launcher, nodes, per_node), "--", sys.executable, PROGRAM, checkpoint or "-")]
    out_path = folder / "out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(folder),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, ready = time.monotonic() + START_S, {}
        while len(ready) < size and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            ready = _lines(out_path.read_text(errors="replace"), "ready")
        signalled = sorted(r for r, record in ready.items() if record["host"] == SIGNALLED_NODE)
        if len(ready) == size:
            for r in signalled:  # the pids are the host's: the nodes share its pid namespace
                os.kill(ready[r]["pid"], signal.SIGUSR1)
        proc.wait(timeout=STOP_S + START_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = f"$ {' '.join(cmd)}\n" + out_path.read_text(errors="replace")
    assert len(ready) == size, f"not every rank got ready (exit {proc.returncode})\n{text}"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{text}"
    return launcher, text, checkpoint, signalled


def test_node_local_ranks_and_one_subgroup_per_node(job, layout):
    _, text, _, _ = job
    nodes, per_node, size, hosts = layout
    facts = _lines(text, "facts")
    assert sorted(facts) == list(range(size)), text
    assert [facts[r]["host"] for r in range(size)] == hosts, text
    assert [facts[r]["local_rank"] for r in range(size)] == [r % per_node for r in range(size)], text
    node_ranks = [[k for k in range(size) if hosts[k] == hosts[r]] for r in range(size)]
    assert [facts[r]["subgroup"] for r in range(size)] == node_ranks, text
    assert {facts[r]["subgroups"] for r in range(size)} == {nodes}, text
    assert [facts[r]["subgroup_sum"] for r in range(size)] == [sum(ranks) for ranks in node_ranks], text


def test_each_node_numbers_its_own_gpus(job, layout):
    """With CUDA_VISIBLE_DEVICES=0,1 on every node, ranks pick devices 0 and 1 on each node (the
    node-local rank modulo the visible count; device 0 alone at 1 rank a node), never 2 or 3."""
    _, text, _, _ = job
    _, per_node, size, _ = layout
    facts = _lines(text, "facts")
    assert [facts[r]["device"] for r in range(size)] == [r % per_node % 2 for r in range(size)], text


def test_jobenv_sees_the_launcher_and_under_srun_both_nodes(job, layout):
    launcher, text, _, _ = job
    nodes, per_node, size, hosts = layout
    jobs = [_lines(text, "facts")[r]["job"] for r in range(size)]
    assert all(not j["disagreements"] for j in jobs), jobs
    if launcher == "srun":
        assert {j["launcher"] for j in jobs} == {"srun"}, jobs
        assert all(j["nodes"] == sorted(set(hosts)) and j["num_nodes"] == nodes for j in jobs), jobs
        assert all(j["tasks_per_node"] == [per_node] * nodes for j in jobs), jobs
    else:
        assert {j["launcher"] for j in jobs} == {"mpich-hydra"}, jobs
    assert [j["env_local_rank"] for j in jobs] == [r % per_node for r in range(size)], jobs


def test_a_signal_on_one_node_stops_every_rank_at_the_same_step(job, layout):
    _, text, _, signalled = job
    _, _, size, hosts = layout
    on_node = [hosts[r] == SIGNALLED_NODE for r in range(size)]
    assert signalled == [r for r in range(size) if on_node[r]], text
    stopped = _lines(text, "stopped")
    assert sorted(stopped) == list(range(size)), text
    assert len({stopped[r]["step"] for r in range(size)}) == 1, text
    assert {stopped[r]["by"] for r in range(size)} == {"SIGUSR1"}, text
    assert [stopped[r]["requested"] for r in range(size)] == on_node, text


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
