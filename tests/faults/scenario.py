"""One misbehaving job per scenario (argv[1]); the tests in tests/diagnostics/ (test_faults.py,
test_watchdog.py, test_flight_recorder.py) run them and check the outcome.

  straggler   timeout 3 s; every rank but the last enters a barrier, the last sleeps
  raises      the last rank raises ValueError while the others wait in all_reduce
  monitored   the last rank never reaches monitored_barrier (timeout 2 s)
  usr2        rank 0 sends itself SIGUSR2 while waiting in a barrier for the slow last rank
  mismatch    (run with HPC_C10D_DEBUG=DETAIL) the last rank all_reduces a longer array
  disagree    no timeout= (HPC_C10D_TIMEOUT sets it); the last rank enters a barrier, the others all_reduce
  finished    rank 0 all_reduces alone; the others are done and wait in destroy_process_group
  refuses     no timeout= (HPC_C10D_TIMEOUT sets it); a blocking gather of 8 MB per rank whose
              destination, rank 0, refuses its empty gather_list; then an all_reduce on the world
"""
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import numpy as np

import hpc_c10d as dist

scenario = sys.argv[1]
dist.init_process_group(timeout=None if scenario in ("disagree", "refuses") else timedelta(seconds=3))
rank, size = dist.get_rank(), dist.get_world_size()
last = rank == size - 1
for _ in range(3):  # some history for the flight recorder
    dist.all_reduce(np.ones(4, np.float32))
print(f"rank {rank}: warmed up", flush=True)

if scenario == "straggler":
    if last:
        time.sleep(120)
    dist.barrier()
elif scenario == "raises":
    if last:
        raise ValueError("a bad batch on the last rank")
    dist.all_reduce(np.ones(8, np.float32))
elif scenario == "monitored":
    if not last:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=2))
        except dist.DistBackendError as exc:
            print(f"rank {rank}: monitored_barrier: {exc}", flush=True)
    dist.barrier()  # the last rank joins here: everyone leaves
elif scenario == "usr2":
    if rank == 0:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR2)).start()
    if last:
        time.sleep(2.5)
    dist.barrier()
elif scenario == "mismatch":
    try:
        dist.all_reduce(np.ones(5 if last else 4, np.float32))
    except dist.DistError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
    x = np.ones(4, np.float32)
    dist.all_reduce(x)  # still in step, nothing mixed in
    print(f"rank {rank}: then all_reduce gave {x.tolist()}", flush=True)
elif scenario == "disagree":
    if last:
        dist.barrier()
    else:
        dist.all_reduce(np.ones(8, np.float32))
elif scenario == "refuses":
    try:
        dist.gather(np.ones(1_000_000), gather_list=[], dst=0)
    except Exception as exc:  # noqa: B902 - each rank says what it got
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
    try:
        dist.all_reduce(np.ones(2))
    except Exception as exc:  # noqa: B902
        print(f"rank {rank}: then {type(exc).__name__}: {exc}", flush=True)
elif scenario == "finished":
    if rank == 0:
        dist.all_reduce(np.ones(8, np.float32))
else:
    raise SystemExit(f"unknown scenario {scenario!r}")
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
