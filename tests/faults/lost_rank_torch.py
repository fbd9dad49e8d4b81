"""lost_rank.py's ``default`` scenario on torch.distributed with backend "hpc" (tests/failures/test_ulfm.py).

    python lost_rank_torch.py VICTIM STEP

World rank VICTIM SIGKILLs itself before step STEP; the survivors catch torch's DistBackendError
(with ``failed_ranks``), call torch's own ``dist.shrink_group``, check that a group made after it
works, and finish every step with checked results. Each survivor prints ``RESULT <json>``.
"""
import json
import os
import signal
import sys

import torch
import torch.distributed as dist

STEPS = 10
victim, fail_at = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("hpc")
world_rank = dist.get_rank()
members = list(range(dist.get_world_size()))  # the original world ranks still in the job
report = {"world_rank": world_rank, "failed_ranks": None, "error": None}
k = 0
while k < STEPS:
    if k == fail_at and world_rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.full((6,), float(world_rank + 1 + k))
    try:
        dist.all_reduce(t)
        gathered = torch.empty(len(members), dtype=torch.int64)
        dist.all_gather_into_tensor(gathered, torch.tensor([world_rank]))
    except dist.DistBackendError as error:
        report.update(failed_ranks=error.failed_ranks, error=type(error).__name__)
        dist.shrink_group(error.failed_ranks)
        members = [r for i, r in enumerate(members) if i not in error.failed_ranks]
        continue
    assert torch.equal(t, torch.full((6,), float(sum(r + 1 + k for r in members)))), (t, members)
    assert gathered.tolist() == members, (gathered, members)
    k += 1
pair = dist.new_group([0, 1])  # carved out of the survivors' world, renumbered 0..n-1
one = torch.ones(3)
if dist.get_rank() < 2:
    dist.all_reduce(one, group=pair)
report.update(steps=k, size=dist.get_world_size(), rank=dist.get_rank(), pair=one.tolist(),
              ranks=dist.get_process_group_ranks(dist.group.WORLD))
print("RESULT " + json.dumps(report), flush=True)
dist.destroy_process_group()
