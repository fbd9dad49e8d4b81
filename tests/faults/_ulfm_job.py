"""What ulfm_survive.py (raw mpi4py) and lost_node.py (hpc_c10d) share: the job's settings from the
environment, and the log line each rank prints and appends to its file (imports no MPI)."""
import os
import signal
import sys
import time

VICTIMS = {int(r) for r in os.environ.get("ULFM_VICTIMS", "").split(",") if r.strip()}
KILL_STEP = int(os.environ.get("ULFM_KILL_STEP", "50"))
AFTER = int(os.environ.get("ULFM_AFTER", "50"))
SECONDS = float(os.environ.get("ULFM_SECONDS", "120"))
PAUSE = float(os.environ.get("ULFM_PAUSE", "0.005"))
SIGNAL = getattr(signal, "SIG" + os.environ.get("ULFM_SIGNAL", "KILL"))  # STOP: a hung rank, not a dead one

# argv[1] (else ULFM_LOG_DIR): also append each line to <dir>/rank<R>.log, so that what the ranks of a
# cut-off node print still lands on the shared file system (their launcher daemon cannot forward it)
LOG_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("ULFM_LOG_DIR", "")


def say(rank, msg):
    """Print ``msg`` with the time, and append it to rank ``rank``'s file in LOG_DIR."""
    line = f"[{time.time():.3f}] {msg}"
    print(line, flush=True)
    if LOG_DIR:
        with open(os.path.join(LOG_DIR, f"rank{rank}.log"), "a") as f:
            f.write(line + "\n")


def out_of_time(rank, step, now, deadline):
    """After good step ``step``: True (and said) past the deadline with no fault seen, else pause."""
    if now > deadline:
        say(rank, f"rank {rank}: no fault within {SECONDS}s ({step} steps)")
        return True
    time.sleep(PAUSE)
    return False
