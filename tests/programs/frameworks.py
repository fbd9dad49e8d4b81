"""The training frameworks our users run, on backend "hpc", under mpiexec or srun:

    mpiexec -n 2 python tests/programs/frameworks.py fabric_ddp     # Lightning Fabric, DDPStrategy
    mpiexec -n 2 python tests/programs/frameworks.py trainer_ddp    # Lightning Trainer, DDPStrategy
    mpiexec -n 2 python tests/programs/frameworks.py fabric_fsdp2   # Fabric, ModelParallelStrategy (FSDP2)
    mpiexec -n 2 python tests/programs/frameworks.py accelerate     # the group made first, then Accelerator

Each rank trains on its share of every batch; every rank also trains a copy of the model alone on
the whole batch, which the distributed model must equal after the last step (what gloo gives,
without opening gloo's ports). Each rank prints ``<scenario> rank R/N: <store> store, parameters
match (<Lightning's cluster environment>)`` with the store torch's default group got (nothing may
listen on ``MASTER_PORT``).
"""
import os
import sys

import torch
import torch.distributed as tdist
from _listening import listening_ports
from mpi4py import MPI

STEPS, ROWS = 3, 4  # steps, rows per rank and step
RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def twins():
    """The model to distribute and its single-process reference, with equal weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    reference.load_state_dict(model.state_dict())
    return model, reference


def data():
    """STEPS batches of ROWS * SIZE rows, the same on every rank."""
    gen = torch.Generator().manual_seed(1)
    return torch.randn(STEPS * ROWS * SIZE, 6, generator=gen), torch.randn(STEPS * ROWS * SIZE, 3, generator=gen)


def train_reference(reference):
    x, y = data()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(STEPS):
        rows = slice(step * ROWS * SIZE, (step + 1) * ROWS * SIZE)
        opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x[rows]), y[rows]).backward()
        opt.step()
    return reference


def mine(step):
    """This rank's rows of a step's batch (a contiguous block per rank)."""
    start = step * ROWS * SIZE + RANK * ROWS
    return slice(start, start + ROWS)


def fabric_run(strategy):
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=SIZE, num_nodes=1, strategy=strategy)
    fabric.launch()
    model, reference = twins()
    model = fabric.setup_module(model)
    opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = data()
    for step in range(STEPS):
        opt.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(x[mine(step)]), y[mine(step)]))
        opt.step()
    return model, reference, type(fabric.strategy.cluster_environment).__name__


def fabric_ddp():
    from lightning.fabric.strategies import DDPStrategy

    return fabric_run(DDPStrategy(process_group_backend="hpc"))


def fabric_fsdp2():
    from lightning.fabric.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    def parallelize(model, mesh):
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh["data_parallel"])
        return fully_shard(model, mesh=mesh["data_parallel"])

    return fabric_run(ModelParallelStrategy(parallelize, data_parallel_size=SIZE, tensor_parallel_size=1,
                                            process_group_backend="hpc"))


def trainer_ddp():
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    model, reference = twins()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x, y = data()
    rows = torch.cat([torch.arange(STEPS * ROWS * SIZE)[mine(step)] for step in range(STEPS)])
    loader = DataLoader(TensorDataset(x[rows], y[rows]), batch_size=ROWS, shuffle=False)  # this rank's share
    trainer = L.Trainer(accelerator="cpu", devices=SIZE, num_nodes=1, strategy=DDPStrategy(process_group_backend="hpc"),
                        max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False)
    trainer.fit(Module(), loader)
    return model, reference, type(trainer.strategy.cluster_environment).__name__


def accelerate():
    """accelerate has no hook for a backend of another package: make the group first."""
    from accelerate import Accelerator

    tdist.init_process_group("hpc")
    accelerator = Accelerator(cpu=True)
    model, reference = twins()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = data()
    for step in range(STEPS):
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x[mine(step)]), y[mine(step)]))
        opt.step()
    assert accelerator.num_processes == SIZE and accelerator.process_index == RANK
    print(f"accelerate rank {RANK}: accelerator.state.backend is {accelerator.state.backend!r}", flush=True)
    return accelerator.unwrap_model(model), reference, "accelerate"


def default_store_kind():
    """MPIStore or TCPStore: what torch's default group got (through a DeferredStore or not)."""
    store = tdist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return getattr(store, "kind", "") or type(store).__name__.replace("TorchMPIStore", "MPIStore")


if __name__ == "__main__":
    scenario = sys.argv[1]
    scenarios = {f.__name__: f for f in (fabric_ddp, fabric_fsdp2, trainer_ddp, accelerate)}
    trained, alone, environment = scenarios[scenario]()
    assert tdist.get_backend() == "hpc", tdist.get_backend()
    kind = default_store_kind()
    port = os.environ.get("MASTER_PORT")  # Lightning sets it; nothing may listen there
    assert port is None or int(port) not in listening_ports(), f"something listens on MASTER_PORT {port}"
    train_reference(alone)
    for got, want in zip(trained.parameters(), alone.parameters()):
        got = got.full_tensor() if hasattr(got, "full_tensor") else got
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)
    print(f"{scenario} rank {RANK}/{SIZE}: {kind} store, parameters match ({environment})", flush=True)


def submitit_task():
    """What one task of a submitit job runs: backend "hpc" from srun's environment alone."""
    from hpc_c10d.job import jobenv

    tdist.init_process_group("hpc")
    x = torch.full((3,), float(tdist.get_rank() + 1))
    tdist.all_reduce(x)
    answer = (tdist.get_rank(), tdist.get_world_size(), jobenv.detect().launcher, x.tolist(), default_store_kind())
    tdist.destroy_process_group()
    return answer
