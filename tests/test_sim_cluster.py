"""The simulated cluster (slurm/sim_cluster.sh) and run_suite's multi-node stages.

Everywhere: the script's checks that need no cluster (bad arguments, `status`/`env` of a cluster
that is not up), run_suite's decision about its multi-node stages (no designation: a note, or
NOT RUN under HPC_C10D_REQUIRE_SIM_CLUSTER=1) and ``_launch.sim_layout()``.

On a designated cluster (``bash slurm/sim_cluster.sh up && eval "$(bash slurm/sim_cluster.sh env)"``,
as root): a 4-rank job under its mpiexec and under its srun runs 2 ranks on each of 2 nodes that
have different hostnames and that MPI takes for different nodes (one COMM_TYPE_SHARED
communicator per node, ``python -m hpc_c10d info``), and an all-reduce between nodes really
crosses the veths (the bridge's byte counters). Without a designation these skip; under
HPC_C10D_REQUIRE_SIM_CLUSTER=1 (CI) they fail.
"""
import json
import os
import re
import subprocess
import sys

import pytest

import _launch
from _launch import HOW_TO_DESIGNATE_SIM, ROOT, SIM_SCRIPT, TEST_NODES, TEST_RANKS_PER_NODE, fresh_env, sim_job

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


LAUNCHES = {
    "mpiexec": ["mpiexec", "-n", "4", "-ppn", "2"],
    "srun": ["srun", "-N", "2", "--ntasks-per-node=2", "--overcommit", "--mpi=pmi2"],
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHES))
def test_two_ranks_on_each_of_two_nodes(sim_cluster, launcher):
    out = _job(LAUNCHES[launcher], ["-c", PROBE])
    ranks = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["node_size"], r["node_rank"]) for r in ranks] == [
        (0, "node1", 2, 0), (1, "node1", 2, 1), (2, "node2", 2, 0), (3, "node2", 2, 1)], out


@pytest.mark.parametrize("launcher", sorted(LAUNCHES))
def test_info_sees_two_nodes(sim_cluster, launcher):
    out = _job(LAUNCHES[launcher], ["-m", "hpc_c10d", "info"])
    assert "world size       4 on 2 node(s)" in out, out
    hosts = re.findall(r"^ +(\d) +(node\d) +(\d) ", out, re.MULTILINE)
    assert hosts == [("0", "node1", "0"), ("1", "node1", "1"), ("2", "node2", "0"), ("3", "node2", "1")], out


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


@pytest.mark.parametrize("launcher", sorted(LAUNCHES))
def test_traffic_between_nodes_crosses_the_cables(sim_cluster, launcher):
    """Without the cluster's MPI settings MPICH's UCX would take shared memory between the
    namespaces and the counters would not move."""
    launch = {"mpiexec": ["mpiexec", "-n", "2", "-ppn", "1"],
              "srun": ["srun", "-N", "2", "--ntasks-per-node=1", "--mpi=pmi2"]}[launcher]
    before = [_bridge_bytes(sim_cluster, node) for node in ("node1", "node2")]
    _job(launch, ["-c", ALLREDUCE])
    moved = [_bridge_bytes(sim_cluster, node) - b for node, b in zip(("node1", "node2"), before)]
    assert min(moved) > 32 << 20, moved  # at least the array itself crossed each cable
