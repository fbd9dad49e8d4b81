"""A job that loses a rank mid-loop and goes on without it (tests/failures/test_ulfm.py runs it).

    python lost_rank.py SCENARIO VICTIM STEP

The rank VICTIM (of the world) SIGKILLs itself before collective step STEP; the survivors catch
``ProcessFailedError``, shrink and finish all STEPS steps, checking every result against numpy.
Scenarios: ``default`` (blocking collectives on the default group, which is shrunk), ``async``
(``async_op=True`` and ``wait``), ``subgroup`` (a group of every rank made by ``new_group``, shrunk
with ``group=``), ``alive`` (no rank dies: VICTIM stops calling collectives and the others shrink
the default group without it; any MPI), ``abort`` (nobody dies: at STEP the others ask for
``SHRINK_ABORT``, which an MPI without ULFM refuses before sending anything, and all go on). Each
survivor prints one line ``RESULT <json>``.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import hpc_c10d as dist

STEPS = 12
scenario, victim, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group()
me = dist.get_rank()
group = dist.new_group() if scenario == "subgroup" else None
members = list(range(dist.get_world_size()))  # the world ranks in the group, in group order
report = {"world_rank": me, "failed_ranks": None, "hosts": None, "detect_s": None, "shrink_s": None}


def step(k):
    """Three collectives whose results every member checks: sum, broadcast, gather."""
    mine = np.full(5, me + 1 + k, np.float64)
    work = dist.all_reduce(mine, group=group, async_op=scenario == "async")
    if work is not None:
        work.wait()
    assert np.array_equal(mine, np.full(5, sum(r + 1 + k for r in members))), (mine, members)
    root = np.full(3, me * 10 + k, np.int32)
    dist.broadcast(root, group_src=0, group=group)
    assert np.array_equal(root, np.full(3, members[0] * 10 + k)), root
    every = np.empty(2 * len(members), np.int64)
    dist.all_gather_into_tensor(every, np.full(2, me, np.int64), group=group)
    assert np.array_equal(every, np.repeat(members, 2)), every


k, failed_at = 0, None
while k < STEPS:
    if scenario == "abort" and k == fail_at and report["failed_ranks"] is None:
        report["failed_ranks"] = []  # nobody dies: the others ask to abort and are refused, locally
        if me != victim:
            try:
                dist.shrink_group([victim], shrink_flags=dist.SHRINK_ABORT)
            except RuntimeError as refused:
                print(f"REFUSED {refused}", flush=True)
    if k == fail_at and me == victim and report["failed_ranks"] is None:
        if scenario == "alive":
            break  # stays alive, excluded, and calls nothing more on the group
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario == "alive" and k == fail_at and report["failed_ranks"] is None:
        lost = [members.index(victim)]
        report["failed_ranks"] = lost
        failed_at = time.monotonic()
    else:
        try:
            started = time.monotonic()
            step(k)
            k += 1
            continue
        except dist.ProcessFailedError as error:
            failed_at = time.monotonic()
            report.update(failed_ranks=error.failed_ranks, hosts=error.failed_hosts, detect_s=failed_at - started)
            lost = error.failed_ranks
            try:  # the group is revoked: any later call fails the same way
                dist.barrier(group=group)
            except dist.ProcessFailedError as again:
                report["again"] = again.failed_ranks
    group = dist.shrink_group(lost, group=group)
    report["shrink_s"] = time.monotonic() - failed_at
    members = [r for i, r in enumerate(members) if i not in lost]
    if scenario != "subgroup":  # the default group was shrunk: world ranks renumbered 0..n-1
        group, me, members = None, dist.get_rank(), list(range(dist.get_world_size()))
if scenario == "alive" and report["world_rank"] == victim:
    sys.exit(0)  # its atexit frees the old world's store with the others' (collective)
report.update(steps=k, size=dist.get_world_size(group), rank=dist.get_rank(group))
print("RESULT " + json.dumps(report), flush=True)
dist.destroy_process_group()
