"""torch programs on hpc_c10d: torch.distributed's own calls on backend ``"hpc"`` (the plugin,
``hpc_c10d.torch``) against gloo over the same ranks and raw mpi4py, the backend's own all-reduce
method against raw mpi4py, then a DDP training step on each (and the same step without DDP)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np

from .report import Record
from .sweep import Sweep
from .torch_side import single_host

__all__ = ["start", "OnGroup", "run_method", "run_ddp", "step_of", "PLUGIN", "GLOO"]

PLUGIN, GLOO = "plugin", "gloo"


class OnGroup:
    """torch.distributed with ``group=`` bound, shaped like the module the sweeps call."""

    def __init__(self, tdist: Any, group: Any) -> None:
        self._tdist, self._group, self.ReduceOp = tdist, group, tdist.ReduceOp

    def __getattr__(self, name: str) -> Callable:
        return partial(getattr(self._tdist, name), group=self._group)


def start(native: str = GLOO) -> tuple[Any, Any]:
    """torch's default group on backend "hpc" (``mpi://``: no port), and a group of torch's own
    ``native`` backend (gloo, or nccl for CUDA) over the same ranks, bootstrapped through its store."""
    import torch
    import torch.distributed as tdist
    from mpi4py import MPI

    import hpc_c10d.torch as plugin

    torch.set_num_threads(1)
    plugin.register()
    tdist.init_process_group(plugin.BACKEND_NAME, init_method="mpi://")
    single_host(MPI.COMM_WORLD)  # gloo on the loopback interface when the job has one host
    return tdist, tdist.new_group(backend=native)


def _mlp(torch: Any) -> Any:
    """256 -> 512 -> 512 -> 10: 399,370 parameters."""
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def step_of(torch: Any, model: Any, x: Any, y: Any) -> Callable[[], None]:
    """One training step of ``model`` (zero_grad, forward, MSE loss, backward, SGD) on ``x``, ``y``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    return step


def _waited(method: Callable[..., Any], *args: Any) -> None:
    method(*args).wait()


def run_method(bench: Sweep, tdist: Any) -> list[Record]:
    """The backend's own method, ``ProcessGroupHPC.allreduce([t], opts).wait()`` with ``asyncOp``
    false (what torch's wrapper and its C++ callers call), against raw mpi4py's ``Allreduce`` on the
    same 8 bytes: the backend's cost per call without torch's Python wrapper. Both are checked first."""
    import torch
    from mpi4py import MPI

    from ..torch.process_group import hpc_backend

    data = np.ones(2, np.float32)
    tensor = torch.from_numpy(data)
    opts = tdist.AllreduceOptions()
    opts.asyncOp = False
    steps: dict[str, Callable[[], Any]] = {PLUGIN: partial(_waited, hpc_backend().allreduce, [tensor], opts),
             "mpi4py": partial(bench.comm.Allreduce, MPI.IN_PLACE, data)}
    wrong = {}
    for name, step in steps.items():
        data[:] = 1
        step()
        wrong[name] = bench.comm.allreduce(int(np.count_nonzero(data != bench.size)), op=MPI.SUM)
    return bench.records(bench.measure(steps), wrong, bench="torch", op="ProcessGroupHPC.allreduce",
                         bytes=data.nbytes, count=data.size, dtype="float32", redop="sum")


def run_ddp(bench: Sweep, gloo: Any, batch: int) -> list[Record]:
    """One training step (zero_grad, forward, MSE, backward, SGD) of the MLP: DDP on the plugin's
    default group, DDP on the gloo group, and no DDP at all (``local``)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = torch.randn(batch, 256), torch.randn(batch, 10)
    models = {PLUGIN: DDP(_mlp(torch)), GLOO: DDP(_mlp(torch), process_group=gloo), "local": _mlp(torch)}
    steps = {name: step_of(torch, model, x, y) for name, model in models.items()}
    bench.batch_s, bench.max_iters = bench.batch_s * 5, 200  # steps take milliseconds
    params = sum(p.numel() for p in models["local"].parameters())
    return bench.records(bench.measure(steps), {}, bench="torch", op=f"DDP step (batch {batch})",
                         bytes=4 * params, count=params, dtype="float32")
