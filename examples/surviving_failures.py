"""Data-parallel training that loses a rank and finishes with the survivors (ULFM).

    mpiexec --with-ft ulfm -n 4 python examples/surviving_failures.py --kill-rank 2 --kill-step 13
    mpiexec --with-ft ulfm -n 4 python examples/surviving_failures.py --torch --kill-rank 2 --kill-step 13

A linear model learns by SGD with momentum. Every step each rank takes BATCH samples of the step's
global batch (BATCH per rank: the training depends on the number of ranks), the ranks average their
gradients, and each rank updates the momentum of its own slice of the weights only (a sharded
optimizer state, as ZeRO does); one all_reduce shares the update. Every ``--every`` steps the ranks
save one HDF5 checkpoint: the weights, the momentum as one global array, the step. At start the
program resumes from that file if there is one, at any number of ranks.

When a rank dies (``--kill-rank R --kill-step S``: launch rank R SIGKILLs itself as step S begins)
every survivor gets ``ProcessFailedError`` (torch: ``DistBackendError``) with ``failed_ranks``
from the collective it is in. The survivors shrink the default group (ranks renumbered 0..n-2),
rebuild DDP on it (torch), load the last checkpoint resharded over n-1 ranks, and go on from its
step with the batches split n-1 ways. Rank 0 prints how long each part of the recovery took.

Reference: the result equals that of a job that stopped at the last checkpoint C before the
failure (``--steps C`` at n ranks) and was restarted from it at n-1 ranks, within float rounding:
the survivors redo the steps since C and lose nothing saved, and an uninterrupted run ends
elsewhere (the batches depend on the number of ranks). tests/failures/test_surviving_failures.py checks
it against the same arithmetic done in one process. This needs Open MPI 5 with ``mpiexec --with-ft ulfm``;
elsewhere (MPICH) the death of a rank ends the job, and running it again resumes from the file.
docs/surviving_failures.md walks through it.
"""
from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

import numpy as np

from hpc_c10d import ProcessFailedError, checkpoint

FEATURES, SAMPLES, BATCH = 16, 4096, 32  # BATCH samples per rank and step
LR, BETA = 0.05, 0.9


def dataset() -> tuple[np.ndarray, np.ndarray]:
    """The same noisy linear problem on every rank."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES))
    return x, x @ np.linspace(-1.0, 1.0, FEATURES) + 0.1 * rng.standard_normal(SAMPLES)


def my_batch(step: int, rank: int, size: int) -> np.ndarray:
    """This rank's sample indices at ``step``: its part of a global batch of ``size * BATCH``."""
    chosen = np.random.default_rng(step).choice(SAMPLES, size * BATCH, replace=False)
    return np.array_split(chosen, size)[rank]


def mse_gradient(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The gradient of the mean squared error over the samples ``x``, ``y``."""
    return 2 * x.T @ (x @ weights - y) / len(y)


def my_slice(rank: int, size: int) -> slice:
    """The weights whose momentum this rank keeps."""
    bounds = np.cumsum([0] + [len(part) for part in np.array_split(np.arange(FEATURES), size)])
    return slice(int(bounds[rank]), int(bounds[rank + 1]))


class NumpyTrainer:
    """numpy arrays, gradients averaged with ``hpc_c10d.all_reduce``."""

    def __init__(self) -> None:
        import hpc_c10d as dist

        self.dist = dist
        dist.init_process_group()
        self.weights = np.zeros(FEATURES)

    def zeros(self, n: int) -> np.ndarray:
        """An array of ``n`` zeros of this flavour."""
        return np.zeros(n)

    def gradient(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The gradient over this rank's samples, averaged over the ranks."""
        grad = mse_gradient(self.weights, x, y)
        self.dist.all_reduce(grad, op=self.dist.ReduceOp.AVG)
        return grad

    def rebuild(self) -> None:
        """Nothing lives on the old group."""


class TorchTrainer:
    """A ``torch.nn.Linear`` in DDP on backend "hpc"; DDP averages the gradients."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("hpc")
        self.module = torch.nn.Linear(FEATURES, 1, bias=False, dtype=torch.float64)
        torch.nn.init.zeros_(self.module.weight)
        self.weights = self.module.weight.data.view(-1)  # shares the parameter's memory
        self.rebuild()

    def zeros(self, n: int) -> Any:
        """A tensor of ``n`` zeros of this flavour."""
        return self.torch.zeros(n, dtype=self.torch.float64)

    def gradient(self, x: np.ndarray, y: np.ndarray) -> Any:
        """The gradient over this rank's samples, averaged over the ranks."""
        self.module.zero_grad()
        out = self.ddp(self.torch.from_numpy(x)).view(-1)
        self.torch.nn.functional.mse_loss(out, self.torch.from_numpy(y)).backward()  # DDP all_reduces here
        return self.module.weight.grad.view(-1)

    def rebuild(self) -> None:
        """DDP on the (new) default group."""
        self.ddp = self.torch.nn.parallel.DistributedDataParallel(self.module)


def fresh_state(trainer: Any, mine: slice) -> dict:
    """What the checkpoint holds, with this rank's shard of the momentum for the current size."""
    return {"weights": trainer.weights, "momentum": checkpoint.Shard(trainer.zeros(mine.stop - mine.start)),
            "step": 0}


def train_step(trainer: Any, state: dict, rows: np.ndarray, mine: slice, data: tuple) -> None:
    """One step of SGD with momentum, the momentum sharded over the ranks."""
    x, y = data
    grad = trainer.gradient(x[rows], y[rows])
    momentum = state["momentum"].array
    momentum[:] = BETA * momentum + grad[mine]
    update = trainer.zeros(FEATURES)
    update[mine] = momentum  # zeros elsewhere: the sum is exact
    trainer.dist.all_reduce(update)
    trainer.weights -= LR * update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every EVERY steps")
    parser.add_argument("--checkpoint", default="surviving.h5")
    parser.add_argument("--torch", action="store_true", help="torch DDP on backend 'hpc' (else numpy)")
    parser.add_argument("--kill-rank", type=int, default=-1, help="this launch rank SIGKILLs itself ...")
    parser.add_argument("--kill-step", type=int, default=-1, help="... as this step begins")
    parser.add_argument("--pace", type=float, default=0.0,
                        help="seconds to wait after each step (to take a node away while it runs)")
    args = parser.parse_args()

    trainer = TorchTrainer() if args.torch else NumpyTrainer()
    dist, data = trainer.dist, dataset()
    victim = dist.get_rank() == args.kill_rank
    marks: dict[str, float] = {}  # the moments of a recovery, for rank 0's report
    while True:
        rank, size = dist.get_rank(), dist.get_world_size()
        mine = my_slice(rank, size)
        state = fresh_state(trainer, mine)
        if os.path.exists(args.checkpoint):
            checkpoint.load(state, args.checkpoint)  # resharded to this size
        if marks:
            marks["reloaded"] = time.monotonic()
        if rank == 0:
            print(f"step {state['step']}: {size} ranks", flush=True)
        try:
            for step in range(state["step"], args.steps):
                began = time.monotonic()
                if victim and step == args.kill_step:
                    os.kill(os.getpid(), signal.SIGKILL)
                train_step(trainer, state, my_batch(step, rank, size), mine, data)
                state["step"] = step + 1
                if marks:
                    marks["first step done"] = time.monotonic()
                    if rank == 0:
                        report(marks)
                    marks = {}
                if state["step"] % args.every == 0 or state["step"] == args.steps:
                    checkpoint.save(state, args.checkpoint)
                time.sleep(args.pace)
            break
        except ProcessFailedError as error:  # torch flavour: torch's DistBackendError too
            marks = {"step began": began, "detected": time.monotonic()}
            dist.shrink_group(error.failed_ranks)  # the default group: renumbered 0..n-1
            trainer.rebuild()
            marks["shrunk"] = time.monotonic()
            if dist.get_rank() == 0:
                print(f"step {step}: lost rank(s) {error.failed_ranks} on {error.failed_hosts}", flush=True)
    if rank == 0:
        loss = float(np.mean((data[0] @ np.asarray(trainer.weights) - data[1]) ** 2))
        print(f"finished {args.steps} steps on {size} ranks: loss {loss:.6f}, saved in {args.checkpoint}",
              flush=True)
    dist.destroy_process_group()


def report(marks: dict[str, float]) -> None:
    """Print how long each part of a recovery took, from the start of the step the failure broke."""
    names, times = list(marks), list(marks.values())
    parts = [f"{name} {1e3 * (t - before):.1f} ms" for name, t, before in zip(names[1:], times[1:], times)]
    print(f"recovery: {', '.join(parts)}; {1e3 * (times[-1] - times[0]):.1f} ms in all", flush=True)


if __name__ == "__main__":
    main()
