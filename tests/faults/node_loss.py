"""A job that loses a node: tests/failures/test_multinode_faults.py runs it on the simulated cluster.

Every rank saves its slab of a checkpoint (argv[1]; "-" for none), then all_reduces in a loop
until a node is cut off or killed; the group's timeout comes from HPC_C10D_TIMEOUT. Once every
rank is past the save, each prints "rank R on HOST pid P: looping", the test's cue for the fault.
The loop ends by itself after argv[2] seconds (default 90), so a job nothing stops still ends.
"""
import os
import socket
import sys
import time

import numpy as np

import hpc_c10d as dist


def reference():
    """The checkpoint's content: a 10 x 3 matrix sharded by rows, a replicated bias, scalars."""
    weights = np.arange(30, dtype=np.float64).reshape(10, 3) * 0.5 - 2.0
    bias = np.linspace(-1.0, 1.0, 5, dtype=np.float32)
    return {"model": {"w": weights, "b": bias}, "step": 41, "run": "node-loss"}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "-"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 90.0
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    if path != "-":
        from hpc_c10d import checkpoint

        ref = reference()
        mine = np.array_split(ref["model"]["w"], size)[rank].copy()
        checkpoint.save({"model": {"w": checkpoint.Shard(mine), "b": ref["model"]["b"].copy()},
                         "step": ref["step"], "run": ref["run"]}, path)
    x = np.ones(256, np.float32)
    dist.all_reduce(x)  # every rank is past the save
    print(f"rank {rank} on {socket.gethostname()} pid {os.getpid()}: looping", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        x[:] = 1
        dist.all_reduce(x)
        if x[0] != size:
            raise SystemExit(f"rank {rank}: all_reduce gave {x[0]}, not {size}")
        time.sleep(0.005)
    print(f"rank {rank}: the loop ended without a fault", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
