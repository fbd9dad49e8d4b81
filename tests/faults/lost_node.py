"""ulfm_survive.py's job on hpc_c10d: all_reduce in a loop until ranks are lost, then shrink_group.

Same settings and log lines as ulfm_survive.py (ULFM_VICTIMS, ULFM_KILL_STEP, ULFM_SECONDS,
ULFM_AFTER, ULFM_PAUSE; LOG_DIR as argv[1]; "looping", then "survived: new rank R of N, failed
[...]"), so tests/failures/test_ulfm_multinode.py runs either. A survivor catches ProcessFailedError,
shrinks the default group and checks ULFM_AFTER more sums; a rank on the smaller side of a cut
gets DistBackendError instead, prints "cut off" and exits 5.
"""
import os
import signal
import socket
import sys
import time

import numpy as np

import _ulfm_job
import hpc_c10d as dist
from _ulfm_job import AFTER, KILL_STEP, SECONDS, VICTIMS

dist.init_process_group()
RANK = dist.get_rank()


def say(msg):
    _ulfm_job.say(RANK, msg)


def total(size):
    ones = np.ones(4)
    dist.all_reduce(ones)
    return int(ones[0]) == size


def main():
    total(dist.get_world_size())
    say(f"rank {RANK} on {socket.gethostname()} pid {os.getpid()}: looping (size {dist.get_world_size()})")
    step, last_good, deadline = 0, time.monotonic(), time.monotonic() + SECONDS
    while True:
        if RANK in VICTIMS and step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            assert total(dist.get_world_size()), "a wrong sum"
        except dist.ProcessFailedError as error:
            seen, lost = time.monotonic(), error
            break
        except dist.DistBackendError as error:
            say(f"rank {RANK}: cut off: {error}")
            return 5
        last_good, step = time.monotonic(), step + 1
        if _ulfm_job.out_of_time(RANK, step, last_good, deadline):
            return 4
    dist.shrink_group(lost.failed_ranks)
    shrunk = time.monotonic()
    size = dist.get_world_size()
    wrong = sum(not total(size) for _ in range(AFTER))
    say(f"rank {RANK}: survived: new rank {dist.get_rank()} of {size}, failed {lost.failed_ranks}, "
        f"detect {seen - last_good:.3f}s shrink {shrunk - seen:.3f}s hosts {lost.failed_hosts} "
        f"wrong_results {wrong}")
    dist.destroy_process_group()
    return 3 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
