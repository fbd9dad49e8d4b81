"""Raw mpi4py (no hpc_c10d): survive the loss of ranks under ULFM (Open MPI 5, --with-ft ulfm).

Every rank loops Allreduce (SUM of ones) on a Dup of COMM_WORLD with MPI.ERRORS_RETURN. A rank in
ULFM_VICTIMS (comma-separated world ranks, default none) SIGKILLs itself at step ULFM_KILL_STEP;
with ULFM_VICTIMS empty, something outside (a node kill, a link down) is the fault, once every rank
has printed "rank R on HOST pid P: looping". Survivors print the error class and when they saw it,
Revoke, Shrink, and go on for ULFM_AFTER more steps checking that the sum equals the new size;
each survivor prints "rank R: survived ..." with the times (detect: from the last good step to
the error; recover: from the error to the first good allreduce on the shrunken communicator).
Exit 0 on a survivor that finished with correct results, 3 on a wrong sum (an Allreduce that
returned MPI_SUCCESS with a wrong result counts as the fault, is reported as WRONG RESULT, and the
survivor still revokes, shrinks and goes on), 4 on no fault seen within ULFM_SECONDS.

    mpiexec --with-ft ulfm -n 4 python ulfm_survive.py [LOG_DIR]   # with ULFM_VICTIMS=2 ULFM_KILL_STEP=50

ULFM_EXIT=now: end with os._exit, without MPI_Finalize.
"""
import array
import os
import socket
import sys
import time

from mpi4py import MPI

import _ulfm_job
from _ulfm_job import AFTER, KILL_STEP, SECONDS, SIGNAL, VICTIMS


def say(msg):
    _ulfm_job.say(MPI.COMM_WORLD.Get_rank(), msg)


def main():
    world = MPI.COMM_WORLD
    rank, host = world.Get_rank(), socket.gethostname()
    comm = world.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    send, recv = array.array("d", [1.0]), array.array("d", [0.0])
    comm.Allreduce(send, recv, op=MPI.SUM)
    say(f"rank {rank} on {host} pid {os.getpid()}: looping (size {comm.Get_size()})")
    step, last_good, deadline, wrong = 0, time.monotonic(), time.monotonic() + SECONDS, 0
    while True:
        if rank in VICTIMS and step == KILL_STEP:
            say(f"rank {rank}: {SIGNAL.name} myself at step {step}")
            os.kill(os.getpid(), SIGNAL)
        try:
            recv[0] = 0.0
            comm.Allreduce(send, recv, op=MPI.SUM)
        except MPI.Exception as exc:
            seen, seen_wall = time.monotonic(), time.time()
            cls = exc.Get_error_class()
            names = {getattr(MPI, n, None): n for n in ("ERR_PROC_FAILED", "ERR_REVOKED", "ERR_PROC_FAILED_PENDING")}
            say(f"rank {rank}: step {step}: error class {cls} ({names.get(cls, '?')}): {exc.Get_error_string()}"
                f" {seen - last_good:.3f}s after the last good step")
            break
        if recv[0] != comm.Get_size():  # MPI said success, but the result is wrong: count it as the fault
            seen, seen_wall = time.monotonic(), time.time()
            wrong += 1
            say(f"rank {rank}: step {step}: WRONG RESULT with MPI_SUCCESS: sum {recv[0]} != size {comm.Get_size()}"
                f" {seen - last_good:.3f}s after the last good step")
            break
        last_good, step = time.monotonic(), step + 1
        if _ulfm_job.out_of_time(rank, step, last_good, deadline):
            return 4
    detect = seen - last_good
    comm.Revoke()
    t_rev = time.monotonic()
    new = comm.Shrink()
    t_shr = time.monotonic()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    failed = ""
    try:
        g = comm.Get_failed()  # mpi4py 4 / MPI 5 ULFM
        failed = sorted(MPI.Group.Translate_ranks(g, list(range(g.Get_size())), comm.Get_group()))
    except Exception as exc:  # noqa: BLE001
        failed = f"(Get_failed: {exc!r})"
    size = new.Get_size()
    recv[0] = 0.0
    new.Allreduce(send, recv, op=MPI.SUM)
    first, first_wall = time.monotonic(), time.time()
    if recv[0] != size:
        say(f"rank {rank}: first allreduce after shrink gave {recv[0]} != {size}")
        return 3
    for k in range(AFTER):
        recv[0] = 0.0
        new.Allreduce(send, recv, op=MPI.SUM)
        if recv[0] != size:
            say(f"rank {rank}: step {k} after shrink gave {recv[0]} != {size}")
            return 3
    say(f"rank {rank}: survived: new rank {new.Get_rank()} of {size}, failed {failed}, "
        f"detect {detect:.3f}s revoke {t_rev - seen:.3f}s shrink {t_shr - t_rev:.3f}s "
        f"first-allreduce {first - t_shr:.3f}s recover {first - seen:.3f}s total {first - last_good:.3f}s "
        f"error_at {seen_wall:.3f} first_good_at {first_wall:.3f} wrong_results {wrong}")
    new.Free()
    return 3 if wrong else 0


if __name__ == "__main__":
    rc = main()
    if os.environ.get("ULFM_EXIT") == "now":  # skip MPI_Finalize (it can hang on survivors after a failure)
        sys.stdout.flush()
        os._exit(rc)
    sys.exit(rc)
