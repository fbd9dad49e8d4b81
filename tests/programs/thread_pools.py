"""Each rank's thread pools before and after init_process_group: rank 0 prints them as one JSON list
(tests/core/test_threads.py).

With --torch, torch is imported after init (its OpenMP pool starts from the variables set there);
with --plugin, torch.distributed's init_process_group on backend "hpc" starts the job instead."""
import json
import os
import sys

import threadpoolctl
from mpi4py import MPI

import hpc_c10d as dist


def pools():
    return {info["internal_api"]: info["num_threads"] for info in threadpoolctl.threadpool_info()}


before = pools()
if "--plugin" in sys.argv:
    import torch.distributed as tdist

    import hpc_c10d.torch as plugin

    plugin.register()
    tdist.init_process_group(plugin.BACKEND_NAME, init_method="mpi://")
    rank = tdist.get_rank()
else:
    dist.init_process_group()
    rank = dist.get_rank()
record = {"rank": rank, "mask": sorted(os.sched_getaffinity(0)), "before": before, "after": pools()}
if "--torch" in sys.argv:
    import torch

    record["torch"] = torch.get_num_threads()
records = MPI.COMM_WORLD.gather(record)
if rank == 0:
    print(json.dumps(records), flush=True)
if "--plugin" in sys.argv:
    tdist.destroy_process_group()
else:
    dist.destroy_process_group()
