"""Ranks that call a collective with different shapes, at the default debug level (OFF).

argv[1] is the operation; the last rank's array holds one element more than the others'.
tests/diagnostics/test_faults.py checks how the job ends: which rank reports what, and that nobody hangs.
Each rank prints what it got back, so a rank that returns without an error shows in the output.
"""
import sys
from datetime import timedelta

import numpy as np

import hpc_c10d as dist

op = sys.argv[1]
dist.init_process_group(timeout=timedelta(seconds=5))
rank, size = dist.get_rank(), dist.get_world_size()
n = 5 if rank == size - 1 else 4
for _ in range(3):  # in step first: the mismatch is collective seq 4
    dist.all_reduce(np.ones(4, np.float32))

if op == "broadcast":
    x = np.full(n, rank, np.float32)
    dist.broadcast(x, src=0)
elif op == "all_reduce":
    x = np.ones(n, np.float32)
    dist.all_reduce(x)
elif op == "all_gather_into_tensor":
    x = np.zeros(n * size, np.float32)
    dist.all_gather_into_tensor(x, np.full(n, rank, np.float32))
else:
    raise SystemExit(f"unknown operation {op!r}")
print(f"rank {rank}: {op} returned {x.tolist()}", flush=True)
dist.destroy_process_group()
