"""Checkpoint a sharded state into one HDF5 file when asked to stop, and resume from it.

    mpiexec -n 2 python examples/checkpoint_resume.py        # 200 steps, then ckpt.h5
    mpiexec -n 3 python examples/checkpoint_resume.py 400    # resumes at step 200, at 3 ranks

Send SIGUSR1 or SIGTERM to any rank (``kill -USR1 <pid>``, ``scancel --signal=USR1 <jobid>``):
every rank stops at the same step and the checkpoint holds that step. Needs h5py
(``pip install '.[hdf5]'`` in a checkout). docs/checkpoints.md explains each line.
"""
import os
import sys
import time

import numpy as np

import hpc_c10d as dist
from hpc_c10d import checkpoint
from hpc_c10d.checkpoint import Shard

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
path = "ckpt.h5"

dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
rows = np.array_split(np.arange(12), size)[rank]       # this rank's rows of a 12 x 4 matrix
my_rows = np.zeros((len(rows), 4))                      # its slab (slabs may be uneven)
bias = np.zeros(4)                                      # replicated: the same on every rank

state = {"model": {"w": Shard(my_rows),                 # Shard: this rank's slab (axis 0 unless axis=)
                   "b": bias},                          # a plain array: replicated, written once
         "step": 0, "run": "exp-7"}                     # scalars and strings come back with their types
if os.path.exists(path):
    checkpoint.load(state, path)                        # fills the arrays in place, resharding; sets "step"
    if rank == 0:
        print(f"resuming from {path} at step {state['step']} on {size} ranks", flush=True)


def train(step):
    grad = np.ones(4)
    dist.all_reduce(grad, op=dist.ReduceOp.AVG)         # every rank adds 1 per step
    my_rows[:] += grad
    bias[:] += grad
    time.sleep(0.01)


with dist.Preemption() as stop:                         # catches SIGTERM and SIGUSR1
    for step in range(state["step"], steps):
        train(step)
        state["step"] = step + 1                        # steps done, saved with the arrays
        if stop.should_stop():                          # the signal, agreed by every rank
            checkpoint.save(state, path)                # <path>.partial, renamed when all are done
            stop.requeue()                              # under SLURM: the batch script requeues the job
            break
    else:
        checkpoint.save(state, path)                    # finished: save the last step too

done = state["step"]
ok = np.array([np.all(my_rows == done) and np.all(bias == done)], dtype=np.int32)
dist.all_reduce(ok, op=dist.ReduceOp.MIN)
if rank == 0:
    print(f"saved {path} at step {done}; every weight equals the step count: {bool(ok[0])}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok[0] else 1)
