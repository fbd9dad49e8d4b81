"""One rank of a run_suite MPI stage: pytest as a child, its JUnit XML, log and exit status per rank.

tests/run_suite.py starts ``python tests/run_suite.py --rank-worker RESULTS_DIR TAG -- PYTEST_ARGS`` under
the launcher, once per rank; that calls ``run``.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from support.process_tree import die_with_parent

# Environment variables that carry the MPI rank, most specific first.
RANK_VARS = (
    "OMPI_COMM_WORLD_RANK",  # Open MPI
    "PMIX_RANK",  # PMIx launchers (Open MPI 5, prterun, srun --mpi=pmix)
    "PMI_RANK",  # MPICH hydra, Intel MPI, MVAPICH
    "MPI_RANKID",
    "SLURM_PROCID",
)


def run(argv: list[str]) -> int:
    """argv: RESULTS_DIR TAG -- PYTEST_ARGS...

    Runs ``python -m pytest PYTEST_ARGS --junitxml=RESULTS_DIR/TAG-rankR.xml`` as a child that inherits
    every file descriptor (the launcher's PMI socket, e.g. PMI_FD, must survive), tees rank 0's output to
    the terminal and to a log, sends the other ranks' output to the log only, and writes the child's exit
    status to RESULTS_DIR/TAG-rankR.rc.
    """
    results_dir, tag = Path(argv[0]), argv[1]
    pytest_args = argv[3:] if len(argv) > 2 and argv[2] == "--" else argv[2:]
    rank = next((os.environ[v] for v in RANK_VARS if os.environ.get(v, "").strip()), None)
    if rank is None:
        rank = f"X{os.getpid()}"
        print(f"run_suite: cannot determine MPI rank (none of {', '.join(RANK_VARS)} set)", file=sys.stderr)
    stem = results_dir / f"{tag}-rank{rank}"
    cmd = [sys.executable, "-m", "pytest", *pytest_args, f"--junitxml={stem}.xml",
           "-o", f"junit_suite_name={tag}-rank{rank}"]
    tee = rank == "0"
    with open(f"{stem}.log", "wb") as log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if tee else log,
                                 stderr=subprocess.STDOUT, close_fds=False, preexec_fn=die_with_parent)

        def forward(signum, _frame):
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, forward)
        if tee:
            assert child.stdout is not None
            for line in iter(child.stdout.readline, b""):
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
                log.write(line)
            log.flush()
        rc = child.wait()
    Path(f"{stem}.rc").write_text(f"{rc}\n")
    return rc if rc >= 0 else 128 - rc
