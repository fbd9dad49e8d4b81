"""Data-parallel training that stops cleanly when SLURM preempts it, and resumes where it stopped.

    srun -n 4 --mpi=pmi2 python examples/preemptible_training.py --checkpoint run/ckpt.npz
    mpiexec -n 4 python examples/preemptible_training.py       # works outside SLURM too

Every step all-reduces the gradients, then asks ``Preemption.should_stop()``: one small
all-reduce through which every rank learns, at the same step, whether any rank was sent
SIGTERM or SIGUSR1 (``sbatch --signal=USR1@90``, ``scancel --signal=USR1``). Then rank 0
saves the checkpoint and all ranks exit with status 0; started again, the job resumes from it.
slurm/preemptible.sbatch runs this script and requeues itself.
"""
import argparse
import os
import time

import numpy as np

import hpc_c10d as dist
from hpc_c10d.preemption import Preemption


def save(path, step, weights):
    partial = f"{path}.partial.npz"  # write, then rename: a kill mid-save keeps the old file
    np.savez(partial, step=step, weights=weights)
    os.replace(partial, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.05, help="simulated compute per step")
    parser.add_argument("--checkpoint", default="checkpoint.npz")
    parser.add_argument("--requeue", action="store_true",
                        help="after a stop, ask for a requeue (the batch script does it once srun returns)")
    args = parser.parse_args()

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(rank)
    target = np.linspace(-1.0, 1.0, 16)
    weights, start = np.zeros(16), 0
    if os.path.exists(args.checkpoint):  # every rank reads the same file
        with np.load(args.checkpoint) as saved:
            weights, start = saved["weights"], int(saved["step"])
        if rank == 0:
            print(f"resuming from {args.checkpoint} at step {start}", flush=True)

    with Preemption() as stop:
        for step in range(start, args.steps):
            grad = weights - target + 0.01 * rng.standard_normal(16)  # this rank's batch
            dist.all_reduce(grad, op=dist.ReduceOp.AVG)
            weights -= 0.1 * grad
            time.sleep(args.step_seconds)
            if rank == 0 and step % 20 == 0:
                print(f"step {step}: loss {float(np.mean((weights - target) ** 2)):.3e}", flush=True)
            if stop.should_stop():
                if rank == 0:
                    save(args.checkpoint, step + 1, weights)
                dist.barrier()  # the checkpoint exists before anyone leaves
                print(f"rank {rank}: stopped after step {step + 1} ({stop.stopped_by}); "
                      f"checkpoint {args.checkpoint}", flush=True)
                if args.requeue and stop.requeue():
                    print("requeue requested", flush=True)
                break
        else:
            if rank == 0:
                save(args.checkpoint, args.steps, weights)
            print(f"rank {rank}: finished {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
