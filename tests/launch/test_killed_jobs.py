"""A job the tests SIGKILL leaves nothing where a later job could trip over it.

Open MPI 5's launcher (PRRTE) keeps a session directory named after its pid and host
(/tmp/ompi.<pid>, its daemons' /tmp/prted.<pid>) and removes it when it exits. SIGKILLed, it leaves
the directory, and once pids wrap a launcher that gets the same pid on that host fails before any
rank starts ("The PMIx server's listener thread failed to start"): a 2-core CI machine wraps its
32768 pids several times a run, and the ULFM and checkpoint tests SIGKILL launchers on purpose.
tests/support/launch.py gives every job a session directory base of its own, removed when the test
process exits; this checks that a job started the way the tests start jobs uses it, even when
SIGKILLed.

A serial test that starts a job itself; Open MPI only (MPICH's Hydra keeps no such directory).
"""
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from support import launch
from support.launch import fresh_env, mpiexec, mpiexec_command, outer_world_size

pytestmark = [
    pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself; run without mpiexec"),
    pytest.mark.skipif(mpiexec() is None or launch.flavour().name != "openmpi",
                       reason="only Open MPI's launcher keeps a per-job session directory named after its pid "
                              "(the suite's Open MPI stage runs these)"),
]
SESSION_VAR = launch.FLAVOURS["openmpi"].session_base_var  # PRRTE's, as support.launch sets it
REPORT = "import os, time; print('session', os.environ['PMIX_SERVER_TMPDIR'], flush=True); time.sleep(300)"


def test_a_sigkilled_job_leaves_its_session_directory_only_in_its_own_base():
    env = fresh_env()
    base = env[SESSION_VAR]
    assert os.path.isdir(base) and os.listdir(base) == []
    assert fresh_env()[SESSION_VAR] != base  # each job its own
    job = subprocess.Popen(["timeout", "120", *mpiexec_command(2), sys.executable, "-c", REPORT], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           stdin=subprocess.DEVNULL)
    printed = []
    try:
        for line in job.stdout:  # until a rank says where its launcher's session directory is
            printed.append(line)
            if line.startswith("session "):
                break
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        printed.append(job.communicate(timeout=60)[0])
    session = next((line.split(" ", 1)[1].strip() for line in printed if line.startswith("session ")), "")
    assert os.path.dirname(session) == base, "".join(printed)
    assert os.path.isdir(session)  # what the SIGKILLed launcher left: in the job's own base ...
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), os.path.basename(session)))  # ... not in /tmp
