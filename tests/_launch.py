"""Start a fresh mpiexec job from a serial test (the tutorial programs, the fault scenarios)."""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "MPI_LOCAL")


def mpiexec():
    """The mpiexec beside this Python (the embedded MPI), else the one on PATH, else None."""
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")


def outer_world_size():
    """The size of the mpiexec job this test runs in (1 when run without one)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        if var in os.environ:
            return int(os.environ[var])
    return 1


def fresh_env(drop=(), **extra):
    """This environment without an enclosing launcher's variables (nor those starting with ``drop``),
    with the checkout first on PYTHONPATH and ``extra`` added: for a process that starts its own job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES + tuple(drop))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def launch(nprocs, argv, timeout_s, env=None, cwd=ROOT):
    """Run ``mpiexec -n nprocs python argv...`` under ``timeout``; return (CompletedProcess, cmd).

    The launcher's variables of an enclosing job are dropped, the checkout goes on PYTHONPATH and
    ``env`` is added. On expiry the process is reported as exit code 124 with what it printed."""
    clean = fresh_env(**(env or {}))
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, *argv]
    if shutil.which("timeout"):
        cmd = ["timeout", str(timeout_s)] + cmd
    try:
        return subprocess.run(cmd, env=clean, cwd=cwd, capture_output=True, text=True, timeout=timeout_s + 30), cmd
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        return subprocess.CompletedProcess(cmd, 124, out, err), cmd


def slurm_cluster_problem():
    """Why no SLURM job can run here ('' when a node is up to take one)."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return "SLURM is not installed (bash slurm/local_cluster.sh up starts a localhost cluster)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed: {exc}"
    return "" if re.search(r"idle|mixed|allocated", states) else f"no SLURM node is up (sinfo: {states.strip()!r})"
