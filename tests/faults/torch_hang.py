"""A torch program on backend "hpc" whose last rank never joins a collective (argv[1] says which);
tests/torch_backend/test_torch_backend_hangs.py checks what every other rank's error says.

  blocking    the group's timeout is 3 s; the last rank sleeps while the others all_reduce
  ddp         DDP over a small model; the last rank skips backward, so the others' gradient
              all_reduce (asynchronous, awaited through its future by DDP) never completes

Each rank prints ``rank R: <error type>: <message>`` for the error it gets; all leave 10 s after
the scenario began, without MPI_Finalize (the pending operation could never complete), so no rank's
exit cuts another's report short.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as tdist

from hpc_c10d.torch import BACKEND_NAME, register

scenario = sys.argv[1]
register()
tdist.init_process_group(BACKEND_NAME, init_method="mpi://", timeout=timedelta(seconds=3))
rank, size = tdist.get_rank(), tdist.get_world_size()
last = rank == size - 1
for _ in range(3):  # some history for the flight recorder
    tdist.all_reduce(torch.ones(4))
print(f"rank {rank}: warmed up", flush=True)
leave = time.monotonic() + 10

try:
    if scenario == "blocking":
        if last:
            time.sleep(10)
        else:
            tdist.all_reduce(torch.ones(5))
    elif scenario == "ddp":
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
        loss = model(torch.ones(4, 8)).sum()
        if last:
            time.sleep(10)
        else:
            loss.backward()
    print(f"rank {rank}: no error", flush=True)
except Exception as exc:  # what the test reads
    print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
time.sleep(max(0.0, leave - time.monotonic()))
os._exit(0)
