"""The simulated cluster (slurm/sim_cluster.sh) and run_suite's multi-node stages.

Everywhere: the script's checks that need no cluster (bad arguments, `status`/`env` of a cluster
that is not up), run_suite's decision about its multi-node stages (no designation: a note, or
NOT RUN under HPC_C10D_REQUIRE_SIM_CLUSTER=1) and ``_launch.sim_layout()``.

On a designated cluster (``bash slurm/sim_cluster.sh up && eval "$(bash slurm/sim_cluster.sh env)"``,
as root): a job under its mpiexec and under its srun runs ``sim_test_layout()``'s ranks on each of
its nodes (2 on each of 2 nodes; 1 on each of 3-4) that have different hostnames and that MPI takes
for different nodes (one COMM_TYPE_SHARED communicator per node, ``python -m hpc_c10d info``), and
an all-reduce between the nodes really crosses each node's veth (the bridge's byte counters).
Without a designation these skip; under HPC_C10D_REQUIRE_SIM_CLUSTER=1 (CI) they fail.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from support import launch as _launch
from support.launch import HOW_TO_DESIGNATE_SIM, ROOT, SIM_SCRIPT, TEST_NODES, TEST_RANKS_PER_NODE, fresh_env, sim_job

RUN_SUITE = os.path.join(ROOT, "tests", "run_suite.py")
SIM_VARS = ("HPC_C10D_SIM_", _launch.SIM_DESIGNATION, _launch.SIM_REQUIRED)


def _script(*args, **env):
    """sim_cluster.sh ARGS with no cluster designated and a state dir where none is."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(SIM_VARS)}
    clean.update(env)
    return subprocess.run(["timeout", "60", "bash", SIM_SCRIPT, *args], capture_output=True, text=True,
                          timeout=90, env=clean, stdin=subprocess.DEVNULL)


def test_script_parses():
    proc = subprocess.run(["bash", "-n", SIM_SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_status_and_env_of_a_cluster_that_is_not_up(tmp_path):
    state = str(tmp_path / "sim")
    proc = _script("status", HPC_C10D_SIM_DIR=state)
    assert proc.returncode == 1 and f"cluster hpcsim: down (no cluster in {state})" in proc.stdout, proc
    proc = _script("env", HPC_C10D_SIM_DIR=state)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert "cluster hpcsim is not up" in proc.stderr and "sim_cluster.sh up" in proc.stderr, proc.stderr
    assert not os.path.exists(state)


@pytest.mark.parametrize("args, env, message", [
    (["up", "--nodes", "5"], {}, "--nodes 5: give 2, 3 or 4"),
    (["up"], {"HPC_C10D_SIM_SUBNET": "8.8.8"}, "HPC_C10D_SIM_SUBNET=8.8.8: give three octets of a private /24"),
    (["up"], {"HPC_C10D_SIM_PREFIX": "a b"}, "HPC_C10D_SIM_PREFIX=a b: use letters, digits"),
], ids=["nodes", "public-subnet", "prefix"])
def test_up_refuses_bad_settings_before_touching_anything(tmp_path, args, env, message):
    proc = _script(*args, HPC_C10D_SIM_DIR=str(tmp_path / "sim"), **env)
    assert proc.returncode == 1 and message in proc.stderr, proc
    assert not os.path.exists(tmp_path / "sim")


def test_unknown_command_prints_the_usage():
    proc = _script("frobnicate")
    assert proc.returncode == 2 and "sim_cluster.sh mpiexec [MPIEXEC ARGS] -- CMD..." in proc.stderr, proc.stderr
    assert "sim_cluster.sh ompi-mpiexec [MPIEXEC ARGS] -- CMD..." in proc.stderr, proc.stderr


def _run_suite_without_stages(tmp_path, *args, **env):
    """run_suite with no pytest stage but the multi-node ones: only its decision about them runs."""
    clean = fresh_env(drop=SIM_VARS, **env)
    return subprocess.run([sys.executable, RUN_SUITE, "--no-serial", "--sizes", "", "--net-sizes", "",
                           "--slurm-sizes", "", "--results-dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=120, env=clean, cwd=ROOT)


@pytest.mark.parametrize("required", ["", "1"], ids=["skipped", "required"])
def test_run_suite_has_no_multi_node_stages_without_a_designation(tmp_path, required):
    proc = _run_suite_without_stages(tmp_path, HPC_C10D_REQUIRE_SIM_CLUSTER=required)
    if required:
        for stage in ("sim mpiexec 2x2", "sim srun 2x2"):
            assert re.search(re.escape(stage) + r" +4 +NOT RUN .*" + re.escape(HOW_TO_DESIGNATE_SIM), proc.stdout), \
                proc.stdout
        assert proc.returncode == 1
    else:
        assert f"run_suite: no sim mpiexec 2x2 or sim srun 2x2 stage: {HOW_TO_DESIGNATE_SIM}" in proc.stdout, \
            proc.stdout


def test_run_suite_refuses_a_malformed_layout(tmp_path):
    proc = _run_suite_without_stages(tmp_path, "--node-layouts", "2by2")
    assert proc.returncode == 2 and "--node-layouts '2by2': give NODESxRANKS_PER_NODE" in proc.stderr, proc.stderr


def test_sim_layout(monkeypatch):
    monkeypatch.delenv(TEST_NODES, raising=False)
    monkeypatch.delenv(TEST_RANKS_PER_NODE, raising=False)
    assert _launch.sim_layout() is None
    monkeypatch.setenv(TEST_NODES, "2")
    assert _launch.sim_layout() is None
    monkeypatch.setenv(TEST_RANKS_PER_NODE, "3")
    assert _launch.sim_layout() == (2, 3)
    monkeypatch.setenv(TEST_RANKS_PER_NODE, "x")
    assert _launch.sim_layout() is None


def test_sim_test_layout(monkeypatch, tmp_path):
    """The serial multi-node tests' layout: the designated cluster's nodes, 2 ranks a node on 2 nodes and
    1 on more, unless HPC_C10D_TEST_NODES and HPC_C10D_TEST_RANKS_PER_NODE say otherwise."""
    monkeypatch.delenv(TEST_NODES, raising=False)
    monkeypatch.delenv(TEST_RANKS_PER_NODE, raising=False)
    monkeypatch.setenv(_launch.SIM_DESIGNATION, str(tmp_path))
    for nodes, layout in (("2", (2, 2)), ("4", (4, 1))):
        (tmp_path / "cluster.env").write_text(f"SIM_PREFIX=h\nSIM_SUBNET=10.9.0\nSIM_NODES={nodes}\n")
        assert _launch.sim_test_layout() == layout
    monkeypatch.setenv(TEST_NODES, "3")
    monkeypatch.setenv(TEST_RANKS_PER_NODE, "2")
    assert _launch.sim_test_layout() == (3, 2)


# ------------------------------------------------------------------ on the designated cluster --
PROBE = """
import json, os, socket
from mpi4py import MPI
world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED)
line = json.dumps({"rank": world.rank, "host": socket.gethostname(), "node_size": node.size, "node_rank": node.rank})
os.write(1, (line + "\\n").encode())  # one write: the launcher interleaves the ranks' writes
"""


def _job(launch, argv):
    proc = sim_job(launch, argv)
    assert proc.returncode == 0, f"{launch} {argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


LAUNCHERS = ("mpiexec", "srun")


def _launch_options(launcher, nodes, per_node):
    """Rank r on node r // per_node + 1, on the cluster's first ``nodes`` nodes."""
    if launcher == "mpiexec":
        return ["mpiexec", "-n", str(nodes * per_node), "-ppn", str(per_node)]
    return ["srun", "-N", str(nodes), f"--ntasks-per-node={per_node}", "--overcommit", "--mpi=pmi2"]


def _placement(launcher):
    """``sim_test_layout()``'s job: (its launch options, [(rank, host, node-local rank)], ranks per node)."""
    nodes, per_node = _launch.sim_test_layout()
    return (_launch_options(launcher, nodes, per_node),
            [(r, f"node{r // per_node + 1}", r % per_node) for r in range(nodes * per_node)], per_node)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_two_ranks_on_each_of_two_nodes(sim_cluster, launcher):
    launch, placement, per_node = _placement(launcher)
    out = _job(launch, ["-c", PROBE])
    ranks = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["node_size"], r["node_rank"]) for r in ranks] == [
        (rank, host, per_node, local) for rank, host, local in placement], out


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_info_sees_two_nodes(sim_cluster, launcher):
    launch, placement, _ = _placement(launcher)
    out = _job(launch, ["-m", "hpc_c10d", "info"])
    nodes = len({host for _, host, _ in placement})
    assert f"world size       {len(placement)} on {nodes} node(s)" in out, out
    hosts = re.findall(r"^ +(\d+) +(node\d) +(\d+) ", out, re.MULTILINE)
    assert hosts == [(str(rank), host, str(local)) for rank, host, local in placement], out


def _bridge_bytes(sim_cluster, node):
    """Bytes the bridge's end of ``node``'s cable received and sent."""
    proc = subprocess.run(["ip", "-n", f"{sim_cluster['SIM_PREFIX']}-br", "-s", "-j", "link", "show", node],
                          capture_output=True, text=True, timeout=30, check=True)
    stats = json.loads(proc.stdout)[0]["stats64"]
    return stats["rx"]["bytes"] + stats["tx"]["bytes"]


ALLREDUCE = """
import numpy as np
from mpi4py import MPI
a = np.ones(4 << 20)  # 32 MiB
b = np.empty_like(a)
MPI.COMM_WORLD.Allreduce(a, b)
assert b[0] == MPI.COMM_WORLD.size
"""


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_traffic_between_nodes_crosses_the_cables(sim_cluster, launcher):
    """One rank on each of the layout's nodes. Without the cluster's MPI settings MPICH's UCX would
    take shared memory between the namespaces and the counters would not move."""
    nodes = _launch.sim_test_layout()[0]
    names = [f"node{k}" for k in range(1, nodes + 1)]
    before = [_bridge_bytes(sim_cluster, node) for node in names]
    _job(_launch_options(launcher, nodes, 1), ["-c", ALLREDUCE])
    moved = [_bridge_bytes(sim_cluster, node) - b for node, b in zip(names, before)]
    assert min(moved) > 32 << 20, moved  # at least the array itself crossed each cable
