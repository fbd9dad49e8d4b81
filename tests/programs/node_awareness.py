"""What a rank knows about its node, for tests/launch/test_multinode.py on the simulated cluster.

Usage: node_awareness.py CHECKPOINT|- [load]

Every rank prints one JSON line ("facts": host, node-local rank, its new_subgroups() group and
that group's all_reduce of the ranks, the device bind_local_device would pick for the
CUDA_VISIBLE_DEVICES it sees, what jobenv says), saves its slab of a checkpoint unless "-", then
waits in a Preemption loop (SIGUSR1): it prints "ready" with its pid, steps until every rank
agrees to stop, and prints the step and what stopped it. With "load", it only loads the
checkpoint (at whatever size and placement it runs) and prints what it read.
"""
import json
import os
import socket
import sys
import time

import numpy as np

import hpc_c10d as dist
from hpc_c10d.job import jobenv
from hpc_c10d.nccl.device import local_device

STEP_S = 0.05
MAX_STEPS = 1200  # a minute: a job no signal reaches still ends


def reference():
    """The checkpoint: 12 x 2 rows sharded over the ranks, a replicated vector, a step."""
    return {"w": np.arange(24, dtype=np.float64).reshape(12, 2) - 5.5, "b": np.linspace(0, 1, 4), "step": 7}


def say(kind, **fields):
    os.write(1, (json.dumps({"kind": kind, "rank": dist.get_rank(), **fields}) + "\n").encode())  # one write


def facts():
    rank, local = dist.get_rank(), dist.get_node_local_rank()
    mine, subgroups = dist.new_subgroups()
    total = np.array([rank], np.int64)
    dist.all_reduce(total, group=mine)
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    job = jobenv.detect()
    say("facts", host=socket.gethostname(), local_rank=local, subgroup=dist.get_process_group_ranks(mine),
        subgroups=len(subgroups), subgroup_sum=int(total[0]),
        device=local_device(local, len(visible)) if visible else None,
        job={"launcher": job.launcher, "nodes": job.nodes(), "num_nodes": job.num_nodes,
             "tasks_per_node": job.tasks_per_node, "env_local_rank": job.env_local_rank,
             "disagreements": job.disagreements(rank, dist.get_world_size())})


def main():
    path, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "run")
    dist.init_process_group()
    from hpc_c10d import checkpoint

    ref, rank, size = reference(), dist.get_rank(), dist.get_world_size()
    if mode == "load":
        state = {"w": checkpoint.Shard(np.zeros_like(np.array_split(ref["w"], size)[rank])),
                 "b": np.zeros(4), "step": 0}
        checkpoint.load(state, path)
        say("loaded", w=state["w"].array.tolist(), b=state["b"].tolist(), step=state["step"])
        dist.destroy_process_group()
        return
    facts()
    if path != "-":
        checkpoint.save({"w": checkpoint.Shard(np.array_split(ref["w"], size)[rank].copy()), "b": ref["b"],
                         "step": ref["step"]}, path)
    with dist.Preemption(["USR1"]) as stop:
        dist.barrier()
        say("ready", pid=os.getpid(), host=socket.gethostname())
        step = 0
        while not stop.should_stop() and step < MAX_STEPS:
            time.sleep(STEP_S)
            step += 1
        say("stopped", step=step, requested=stop.requested, by=stop.stopped_by)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
