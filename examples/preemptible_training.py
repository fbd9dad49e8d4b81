"""Data-parallel training that stops cleanly when SLURM preempts it, and resumes where it stopped.

    srun -n 4 --mpi=pmi2 python examples/preemptible_training.py --checkpoint run/ckpt.h5
    mpiexec -n 4 python examples/preemptible_training.py       # works outside SLURM too

Every step all-reduces the gradients, then asks ``Preemption.should_stop()``: one small
all-reduce through which every rank learns, at the same step, whether any rank was sent
SIGTERM or SIGUSR1 (``sbatch --signal=USR1@90``, ``scancel --signal=USR1``). Then the ranks
save one HDF5 checkpoint together (the weights, replicated; the optimizer's momentum, sharded
over the ranks) and exit with status 0. Started again, at any number of ranks, the job resumes
from it: the momentum is resharded on load. slurm/preemptible.sbatch runs this script and
requeues itself.
"""
import argparse
import os
import time

import numpy as np

import hpc_c10d as dist
from hpc_c10d import checkpoint
from hpc_c10d.job import Preemption

SIZE = 16  # parameters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.05, help="simulated compute per step")
    parser.add_argument("--checkpoint", default="checkpoint.h5")
    parser.add_argument("--requeue", action="store_true",
                        help="after a stop, ask for a requeue (the batch script does it once srun returns)")
    args = parser.parse_args()

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(rank)
    target = np.linspace(-1.0, 1.0, SIZE)
    mine = np.array_split(np.arange(SIZE), size)[rank]  # the parameters whose momentum this rank keeps
    state = {"weights": np.zeros(SIZE), "momentum": checkpoint.Shard(np.zeros(len(mine))), "step": 0}
    if os.path.exists(args.checkpoint):  # written by any number of ranks: load reshards
        checkpoint.load(state, args.checkpoint)
        if rank == 0:
            print(f"resuming from {args.checkpoint} at step {state['step']}", flush=True)
    weights, momentum = state["weights"], state["momentum"].array

    with Preemption() as stop:
        for step in range(state["step"], args.steps):
            grad = weights - target + 0.01 * rng.standard_normal(SIZE)  # this rank's batch
            dist.all_reduce(grad, op=dist.ReduceOp.AVG)
            momentum[:] = 0.5 * momentum + grad[mine]  # each rank updates its shard ...
            update = np.zeros(SIZE)
            update[mine] = momentum
            dist.all_reduce(update)  # ... and the ranks share the step
            weights -= 0.1 * update
            time.sleep(args.step_seconds)
            if rank == 0 and step % 20 == 0:
                print(f"step {step}: loss {float(np.mean((weights - target) ** 2)):.3e}", flush=True)
            if stop.should_stop():
                state["step"] = step + 1
                checkpoint.save(state, args.checkpoint)  # every rank writes its part; then renamed
                print(f"rank {rank}: stopped after step {step + 1} ({stop.stopped_by}); "
                      f"checkpoint {args.checkpoint}", flush=True)
                if args.requeue and stop.requeue():
                    print("requeue requested", flush=True)
                break
        else:
            state["step"] = args.steps
            checkpoint.save(state, args.checkpoint)
            print(f"rank {rank}: finished {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
