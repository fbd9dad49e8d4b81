"""A rank dies inside ``checkpoint.save`` (tests/failures/test_ulfm.py): the survivors must all get
ProcessFailedError, not a raw MPI error or a hang, and the file must still hold the last save.

    python lost_in_checkpoint.py DIR VICTIM

Every rank saves step 1 into DIR/c.h5; then VICTIM dies where it would write its slab of step 2's
save (the writing turns through the checkpoint's own communicator). Each survivor shrinks, checks
that the file holds step 1 with every rank's slab, and prints ``RESULT <json>``.
"""
import json
import os
import signal
import sys

import numpy as np

import hpc_c10d as dist
from hpc_c10d import checkpoint

folder, victim = sys.argv[1], int(sys.argv[2])
path = os.path.join(folder, "c.h5")
dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
state = {"w": checkpoint.Shard(np.full(4, float(rank))), "step": 1}
checkpoint.save(state, path)
if rank == victim:
    checkpoint._write_mine = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
state["step"] = 2
report = {"world_rank": rank}
try:
    checkpoint.save(state, path)
except dist.ProcessFailedError as error:
    report["failed_ranks"] = error.failed_ranks
    dist.shrink_group(error.failed_ranks)
whole = {"w": np.empty(4 * size), "step": 0}
checkpoint.load(whole, path)  # every rank reads the whole array, as saved at the old size
report.update(step=int(whole["step"]), w=whole["w"].tolist(), size=dist.get_world_size())
print("RESULT " + json.dumps(report), flush=True)
dist.destroy_process_group()
