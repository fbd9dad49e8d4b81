"""How tests start jobs of their own: the one place that knows each MPI's launcher and which
SLURM cluster the tests may submit to.

MPI. ``mpiexec()`` is the launcher ($MPIEXEC, else the one beside this Python, else PATH's).
``flavour()`` tells Open MPI from MPICH; ``mpiexec_command(n)`` adds what that launcher needs to
start n ranks on this machine (Open MPI: run as root, more ranks than cores; MPICH: nothing), and
``fresh_env()`` says the same in the environment, for a test that calls ``mpiexec()`` directly.
``launch()`` runs a whole job under ``timeout``. tests/run_suite.py starts its stages with these.
Each Open MPI job gets a session directory of its own (``Flavour.job_env``), inside one this
process removes when it exits: PRRTE names its directory after the launcher's pid and host
(/tmp/ompi.<pid>); a job the tests SIGKILL leaves it behind, and once pids wrap a later launcher
with that pid fails to start ("The PMIx server's listener thread failed to start").

SLURM. The tests submit jobs only to a cluster designated for them, never to whatever ``srun``
happens to reach (on a login node that is the production scheduler):

    eval "$(bash slurm/local_cluster.sh env)"        # the localhost cluster that `up` started
    export HPC_C10D_TEST_SLURM_CLUSTER=<ClusterName>  # any other: the name `scontrol show config` reports

With the designation, ``slurm_cluster_problem()`` checks that the cluster SLURM's commands reach
here (through SLURM_CONF or /etc/slurm) has that name and an idle node; without it, it says how to
designate one. The SLURM tests and run_suite's srun stage skip with that reason, or fail with it
under ``HPC_C10D_REQUIRE_SLURM=1`` (CI, which brings the localhost cluster up).

Several nodes. run_suite's multi-node stages run on a simulated cluster (slurm/sim_cluster.sh:
node namespaces on one machine, as root) only when one is designated, and never bring it up:

    bash slurm/sim_cluster.sh up && eval "$(bash slurm/sim_cluster.sh env)"   # sets HPC_C10D_SIM_CLUSTER

``sim_cluster_problem()`` says why its stages cannot run ('' when they can; a failure instead of a
skip under ``HPC_C10D_REQUIRE_SIM_CLUSTER=1``), ``sim_cluster_command()`` starts its commands. In
those stages ``sim_layout()`` gives (nodes, ranks per node), from HPC_C10D_TEST_NODES and
HPC_C10D_TEST_RANKS_PER_NODE, for tests that check where ranks run; None in every other stage.
"""
import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "PRTE_", "HYDRA_", "MPIR_", "OMPI_", "MPI_LOCAL")

SLURM_DESIGNATION = "HPC_C10D_TEST_SLURM_CLUSTER"
SLURM_REQUIRED = "HPC_C10D_REQUIRE_SLURM"
HOW_TO_DESIGNATE = (
    f"no SLURM cluster is designated for the tests ({SLURM_DESIGNATION} is not set): "
    "`bash slurm/local_cluster.sh up && eval \"$(bash slurm/local_cluster.sh env)\"` starts and designates "
    f"a localhost one; {SLURM_DESIGNATION}=<ClusterName> designates another (the tests submit jobs to it)")


SIM_DESIGNATION = "HPC_C10D_SIM_CLUSTER"  # the state dir of the simulated cluster the tests may use
SIM_REQUIRED = "HPC_C10D_REQUIRE_SIM_CLUSTER"
SIM_SCRIPT = os.path.join(ROOT, "slurm", "sim_cluster.sh")
TEST_NODES = "HPC_C10D_TEST_NODES"  # set by run_suite in its multi-node stages only
TEST_RANKS_PER_NODE = "HPC_C10D_TEST_RANKS_PER_NODE"
HOW_TO_DESIGNATE_SIM = (
    f"no simulated cluster is designated for the multi-node stages ({SIM_DESIGNATION} is not set): as root, "
    "`bash slurm/sim_cluster.sh up && eval \"$(bash slurm/sim_cluster.sh env)\"` starts and designates one")


@dataclass(frozen=True)
class Flavour:
    """What one MPI's launcher needs from a test that starts jobs on this machine."""

    name: str  # 'openmpi', 'mpich', 'intelmpi' or 'unknown'
    flags: tuple[str, ...] = ()  # mpiexec options: start any number of ranks here
    env: dict[str, str] = field(default_factory=dict)  # the same, for mpiexec calls without the flags
    network_path: dict[str, str] = field(default_factory=dict)  # one-sided operations as between nodes
    launcher: str = "mpich-hydra"  # what hpc_c10d.job.jobenv calls a job its mpiexec started
    srun_mpi: str = "pmi2"  # the srun --mpi plugin its processes join one world through
    session_base_var: str = ""  # where the launcher is told the base of its per-job session directory

    def job_env(self) -> dict[str, str]:
        """``env``, and for a launcher that keeps a session directory, a new base of its own for it."""
        if not self.session_base_var:
            return dict(self.env)
        return {**self.env, self.session_base_var: tempfile.mkdtemp(prefix="job-", dir=_sessions_dir())}


@functools.cache
def _sessions_dir():
    """A directory for this process's jobs' session directories, removed when the process exits."""
    path = tempfile.mkdtemp(prefix="hpc_c10d-jobs-")
    atexit.register(shutil.rmtree, path, True)
    return path


_MPICH_NETWORK_PATH = {"MPIR_CVAR_NOLOCAL": "1"}
FLAVOURS = {
    "openmpi": Flavour(
        "openmpi", ("--oversubscribe",),
        {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
         "OMPI_MCA_rmaps_base_oversubscribe": "1",  # Open MPI 4
         "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"},  # Open MPI 5
        {"OMPI_MCA_osc": "rdma", "OMPI_MCA_btl": "tcp,self"}, "openmpi", "pmix",
        "PRTE_MCA_prte_tmpdir_base"),  # Open MPI 5: PRRTE's daemons are told it too
    "mpich": Flavour("mpich", network_path=_MPICH_NETWORK_PATH),
    # Intel MPI's network path: libfabric's TCP provider for every message (Debian's libfabric1 serves)
    "intelmpi": Flavour("intelmpi", network_path={"I_MPI_FABRICS": "ofi", "FI_PROVIDER": "tcp"},
                        launcher="intel-hydra"),
    "unknown": Flavour("unknown", network_path=_MPICH_NETWORK_PATH),
}


def beside_python(program):
    """``program`` beside this Python (a virtual environment's bin/), else on PATH, else None."""
    return shutil.which(program, path=os.path.dirname(sys.executable)) or shutil.which(program)


def mpiexec():
    """The MPI launcher: $MPIEXEC, else mpiexec (or mpirun) beside this Python or on PATH; None if none."""
    return os.environ.get("MPIEXEC") or beside_python("mpiexec") or beside_python("mpirun")


@functools.lru_cache(maxsize=None)
def identify(launcher):
    """(flavour name, the version line of ``launcher --version``) for an MPI launcher."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return "unknown", f"({exc})"
    text = out.stdout + out.stderr
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    version = next((line for line in lines if line.startswith("Version:")), lines[0] if lines else "")
    if any(s in text for s in ("Open MPI", "OpenRTE", "PRRTE", "prterun")):
        return "openmpi", version
    if "Intel(R) MPI" in text:
        return "intelmpi", version
    if any(s in text for s in ("HYDRA", "MPICH")):
        return "mpich", version
    return "unknown", version


def flavour(launcher=None):
    """The Flavour of ``launcher`` (default ``mpiexec()``); 'unknown' when there is none."""
    launcher = launcher or mpiexec()
    return FLAVOURS[identify(launcher)[0] if launcher else "unknown"]


def mpiexec_command(nprocs, launcher=None):
    """``[mpiexec, <its flags>, -n, nprocs]``: the start of a command line for an nprocs-rank job;
    RuntimeError when there is no launcher at all."""
    launcher = launcher or mpiexec()
    if launcher is None:
        raise RuntimeError("no MPI launcher: no mpiexec or mpirun beside this Python or on PATH, and $MPIEXEC is "
                           "not set (the mpich extra brings one; a site MPI: load its module)")
    return [launcher, *flavour(launcher).flags, "-n", str(nprocs)]


JOB_SIZE = "HPC_C10D_TEST_JOB_SIZE"


def job_sizes(*sizes):
    """The world sizes a test that starts jobs of its own runs them at: ``sizes``, or with
    HPC_C10D_TEST_JOB_SIZE=N only the one nearest N (CI's Open MPI stage: each such test once)."""
    wanted = os.environ.get(JOB_SIZE, "").strip()
    return [min(sizes, key=lambda n: (abs(n - int(wanted)), n))] if wanted else list(sizes)


def outer_world_size():
    """The size of the mpiexec job this test runs in (1 when run without one)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        if var in os.environ:
            return int(os.environ[var])
    return 1


def fresh_env(drop=(), **extra):
    """The environment for a process that starts its own job: this one without an enclosing
    launcher's variables (nor those starting with ``drop``), with what this machine's mpiexec needs
    (``Flavour.job_env``: under Open MPI a new session directory base at each call), the checkout
    first on PYTHONPATH, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES + tuple(drop))}
    env.update(flavour().job_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def launch(nprocs, argv, timeout_s, env=None, cwd=ROOT, flags=()):
    """Run ``mpiexec [flags] -n nprocs python argv...`` under ``timeout``; return (CompletedProcess, cmd).

    The launcher's variables of an enclosing job are dropped, the checkout goes on PYTHONPATH and
    ``env`` is added. On expiry the process is reported as exit code 124 with what it printed."""
    clean = fresh_env(**(env or {}))
    cmd = [*mpiexec_command(nprocs)[:-2], *flags, "-n", str(nprocs), sys.executable, *argv]
    if shutil.which("timeout"):
        cmd = ["timeout", str(timeout_s)] + cmd
    try:
        return subprocess.run(cmd, env=clean, cwd=cwd, capture_output=True, text=True, timeout=timeout_s + 30), cmd
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        return subprocess.CompletedProcess(cmd, 124, out, err), cmd


def slurm_required():
    """Whether a missing SLURM cluster is a failure rather than a skip (``HPC_C10D_REQUIRE_SLURM=1``)."""
    return os.environ.get(SLURM_REQUIRED) == "1"


def _ask_slurm(*cmd):
    """(stdout, '') of a SLURM command, or ('', why it failed)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"{cmd[0]} failed: {exc}"
    if proc.returncode != 0:
        return "", f"{' '.join(cmd)} failed: {(proc.stderr or proc.stdout).strip()}"
    return proc.stdout, ""


def _cluster_reached():
    """(the ClusterName of the SLURM controller this environment reaches, '') or ('', why none answers)."""
    config, failure = _ask_slurm("scontrol", "show", "config")
    if failure:
        return "", failure
    name = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.MULTILINE)
    return (name.group(1), "") if name else ("", "scontrol show config names no ClusterName")


def slurm_cluster_problem():
    """Why the tests may not submit SLURM jobs here ('' when the designated cluster can take one)."""
    designated = os.environ.get(SLURM_DESIGNATION, "").strip()
    if not designated:
        return HOW_TO_DESIGNATE
    missing = [c for c in ("srun", "sinfo", "scontrol") if shutil.which(c) is None]
    if missing:
        return f"{SLURM_DESIGNATION}={designated}, but SLURM is not installed here (no {', '.join(missing)} on PATH)"
    reached, failure = _cluster_reached()
    if failure:
        return f"the designated SLURM cluster {designated!r} does not answer: {failure}"
    if reached != designated:
        where = os.environ.get("SLURM_CONF", "the default slurm.conf")
        return (f"SLURM's commands here reach cluster {reached!r} (through {where}), not the designated "
                f"{designated!r}; the tests submit jobs to the designated cluster only")
    states, failure = _ask_slurm("sinfo", "-h", "-o", "%T")
    if failure:
        return failure
    if not re.search(r"idle|mixed|allocated", states):
        return f"the designated SLURM cluster {designated!r} has no node up (sinfo: {states.strip()!r})"
    return ""


def srun_plugin_problem(plugin=None):
    """Why srun cannot join this MPI's processes here ('' when it can): ``srun --mpi=list`` must
    offer ``plugin`` (default: the flavour's, pmi2 for MPICH, pmix for Open MPI)."""
    plugin = plugin or flavour().srun_mpi
    try:
        proc = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=15,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"srun --mpi=list failed: {exc}"
    if not re.search(rf"^\s*{plugin}\s*$", proc.stdout + proc.stderr, re.MULTILINE):
        return (f"{flavour().name} jobs need srun --mpi={plugin}, which this SLURM does not offer (srun --mpi=list); "
                "for pmix, Debian's SLURM needs libpmix-dev (slurm/local_cluster.sh up installs it)")
    return ""


def sim_layout():
    """(nodes, ranks per node) of the multi-node stage this process runs in, or None outside one."""
    try:
        nodes, per_node = int(os.environ[TEST_NODES]), int(os.environ[TEST_RANKS_PER_NODE])
    except (KeyError, ValueError):
        return None
    return (nodes, per_node) if nodes > 0 and per_node > 0 else None


def sim_cluster_required():
    """Whether a missing simulated cluster fails the multi-node stages rather than skipping them."""
    return os.environ.get(SIM_REQUIRED) == "1"


def sim_cluster_env():
    """This environment with HPC_C10D_SIM_DIR pointing sim_cluster.sh at the designated cluster."""
    env = dict(os.environ)
    designated = env.get(SIM_DESIGNATION, "").strip()
    if designated:
        env["HPC_C10D_SIM_DIR"] = designated
    return env


def sim_cluster_command(*args):
    """``bash slurm/sim_cluster.sh ARGS...``, e.g. ``("mpiexec", "-n", "4", "-ppn", "2", "--", ...)``; run it
    with ``env=sim_cluster_env()`` (and under ``timeout``)."""
    return ["bash", SIM_SCRIPT, *args]


def sim_cluster_settings():
    """The designated cluster's cluster.env (SIM_PREFIX, SIM_NODES, ...) as a dict, quotes taken off."""
    with open(os.path.join(sim_cluster_env()["HPC_C10D_SIM_DIR"], "cluster.env")) as f:
        return {key: value.strip("'\"") for key, value in (line.strip().split("=", 1) for line in f if "=" in line)}


def sim_job(launch, argv, timeout=120, **extra):
    """Run ``sim_cluster.sh LAUNCH... -- python ARGV`` on the designated cluster under ``timeout``
    (the job's environment: this one with ``extra``); return the CompletedProcess."""
    env = fresh_env(HPC_C10D_SIM_MPIEXEC=mpiexec() or "", **extra)
    env["HPC_C10D_SIM_DIR"] = sim_cluster_env()["HPC_C10D_SIM_DIR"]
    cmd = ["timeout", "-k", "10", str(timeout), *sim_cluster_command(*launch, "--", sys.executable, *argv)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


def sim_cluster_problem(nodes=2):
    """Why jobs on ``nodes`` nodes of the designated simulated cluster cannot run here ('' when they can)."""
    designated = os.environ.get(SIM_DESIGNATION, "").strip()
    if not designated:
        return HOW_TO_DESIGNATE_SIM
    if os.geteuid() != 0:
        return f"{SIM_DESIGNATION}={designated}, but entering its nodes needs root"
    try:
        proc = subprocess.run(sim_cluster_command("status"), capture_output=True, text=True, timeout=60,
                              env=sim_cluster_env(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the designated simulated cluster {designated} does not answer: {exc}"
    if proc.returncode != 0:
        why = " ".join((proc.stdout + proc.stderr).split())
        return f"the designated simulated cluster {designated} is not up: {why}"
    found = re.search(r"up, (\d+) nodes", proc.stdout)
    if not found or int(found.group(1)) < nodes:
        return (f"the designated simulated cluster {designated} has {found.group(1) if found else '?'} nodes, "
                f"fewer than {nodes} (`bash slurm/sim_cluster.sh down && "
                f"bash slurm/sim_cluster.sh up --nodes {nodes}`)")
    return ""


def sim_test_layout():
    """(nodes, ranks per node) of the jobs the serial multi-node tests start on the designated cluster:
    ``sim_layout()`` where its variables are set, else every node of the cluster, 2 ranks a node on
    2 nodes and 1 on more (CI: 2x2 and 4x1). Rank r runs on node ``r // ranks_per_node + 1``."""
    layout = sim_layout()
    if layout is None:
        nodes = int(sim_cluster_settings()["SIM_NODES"])
        layout = (nodes, 2 if nodes == 2 else 1)
    return layout
