"""What a framework (Lightning, accelerate) does under mpiexec: MASTER_ADDR and MASTER_PORT set,
rank and world size passed to init_process_group, backend "hpc". The default store must be an
MPIStore and nothing may listen on MASTER_PORT:

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29431 mpiexec -n 2 python tests/programs/torch_framework_store.py

Each rank prints ``rank R/N: <store kind>, nothing listens on MASTER_PORT, all_reduce ok``.
"""
import os

import torch
import torch.distributed as tdist
from _listening import listening_ports
from mpi4py import MPI


rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
tdist.init_process_group("hpc", rank=rank, world_size=size)  # env://, as the frameworks call it
store = tdist.distributed_c10d._get_default_store()
while hasattr(store, "underlying_store"):
    store = store.underlying_store
kind = getattr(store, "kind", type(store).__name__)
port = int(os.environ["MASTER_PORT"])
listening = port in listening_ports()
x = torch.full((4,), float(rank + 1))
tdist.all_reduce(x)
assert x.eq(size * (size + 1) / 2).all(), x
tdist.destroy_process_group()
print(f"rank {rank}/{size}: {kind}, {'SOMETHING LISTENS' if listening else 'nothing listens'} on MASTER_PORT, "
      "all_reduce ok", flush=True)
