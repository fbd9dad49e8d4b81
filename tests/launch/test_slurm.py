"""hpc_c10d under a real SLURM cluster, and the rule that decides which cluster the tests may use.

The tests that submit jobs run only on the cluster designated for them (tests/support/launch.py): the
localhost one after ``bash slurm/local_cluster.sh up && eval "$(bash slurm/local_cluster.sh env)"``,
or any other named with ``HPC_C10D_TEST_SLURM_CLUSTER=<ClusterName>``. Without a designation they
skip, saying how to give one (under ``HPC_C10D_REQUIRE_SLURM=1``, as in CI, they fail instead), so
a login node's production scheduler never gets a test job. Every srun/salloc/sbatch runs under
``timeout``. On the cluster they check the job environment under srun, under MPICH's mpiexec inside
salloc and outside SLURM; the CPU template as documented; the preemptible template stopping every
rank at the same step on ``scancel --signal=USR1`` with a checkpoint and a clean exit, its
requeue-and-resume, and a plain ``scancel`` leaving no requeue request behind; and what
``local_cluster.sh status`` says about a cluster that is not its own.

The rule itself (no designation: no SLURM command at all; a designation: that cluster only) and
``local_cluster.sh up`` naming the process that holds its port run everywhere, with stand-ins.
"""
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from support.launch import (HOW_TO_DESIGNATE, ROOT, SLURM_DESIGNATION, flavour, fresh_env, mpiexec_command,
                            outer_world_size, slurm_cluster_problem, slurm_required, srun_plugin_problem)
from hpc_c10d.extras import install_hint

PROBE = os.path.join(ROOT, "tests", "slurm", "probe.py")
TEMPLATES = os.path.join(ROOT, "slurm")
LOCAL_CLUSTER = os.path.join(TEMPLATES, "local_cluster.sh")
RUN_SUITE = os.path.join(ROOT, "tests", "run_suite.py")


SRUN_MPI = flavour().srun_mpi  # pmi2 for MPICH, pmix for Open MPI


def _cluster_problem():
    if outer_world_size() > 1:
        return "serial test that submits SLURM jobs itself"
    return slurm_cluster_problem() or srun_plugin_problem() or None


_problem = _cluster_problem()
_required = slurm_required() and outer_world_size() == 1  # .ci/run sets HPC_C10D_REQUIRE_SLURM=1
needs_h5py = pytest.mark.skipif(importlib.util.find_spec("h5py") is None,
                                reason=f"h5py is not installed ({install_hint('hdf5')})")


def needs_cluster(test):
    """Run ``test`` on the designated cluster only: skip without one, fail if one is required."""
    test = pytest.mark.usefixtures("_designated_cluster")(test)
    return pytest.mark.skipif(_problem is not None and not _required, reason=_problem or "")(test)


@pytest.fixture
def _designated_cluster():
    if _problem is not None:
        pytest.fail(f"HPC_C10D_REQUIRE_SLURM=1 but {_problem}")


# Stand-ins for SLURM's commands: each answers as the cluster its SLURM_CONF names (a file that
# holds the cluster's name; the node states are in <file>.states), as the real ones do, and logs
# its call. A SLURM_CONF that names no file is a controller that does not answer.
FAKE_SLURM = {
    "scontrol": 'echo "scontrol $*" >>"$FAKE_SLURM_LOG"\n'
                'name=$(cat "$SLURM_CONF" 2>/dev/null) || { echo "Unable to contact slurm controller" >&2; exit 1; }\n'
                'echo "ClusterName             = $name"',
    "sinfo": 'echo "sinfo $*" >>"$FAKE_SLURM_LOG"\ncat "$SLURM_CONF.states"',
    "srun": "exit 0",
}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """The stand-ins first on PATH and no designation; ``.cluster(name, states)`` makes a cluster and
    returns its SLURM_CONF, ``.calls()`` lists the commands run so far."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls"
    log.touch()
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]))
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    monkeypatch.delenv(SLURM_DESIGNATION, raising=False)

    def cluster(name, states="idle"):
        conf = tmp_path / f"{name}.conf"
        conf.write_text(name)
        (tmp_path / f"{name}.conf.states").write_text(f"{states}\n")
        return str(conf)

    return SimpleNamespace(cluster=cluster, calls=lambda: log.read_text().splitlines())


def test_without_a_designation_no_slurm_cluster_is_asked(fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", fake_slurm.cluster("production"))  # idle, and srun reaches it
    assert slurm_cluster_problem() == HOW_TO_DESIGNATE
    assert fake_slurm.calls() == []
    assert SLURM_DESIGNATION in HOW_TO_DESIGNATE and "slurm/local_cluster.sh env" in HOW_TO_DESIGNATE


def test_the_designated_cluster_is_used(fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", fake_slurm.cluster("hpc_c10d", "mixed"))
    monkeypatch.setenv(SLURM_DESIGNATION, "hpc_c10d")
    assert slurm_cluster_problem() == ""
    assert fake_slurm.calls() == ["scontrol show config", "sinfo -h -o %T"]


def test_a_designation_does_not_cover_the_cluster_srun_reaches_instead(fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", fake_slurm.cluster("production"))
    monkeypatch.setenv(SLURM_DESIGNATION, "hpc_c10d")
    problem = slurm_cluster_problem()
    assert "reach cluster 'production'" in problem and "not the designated 'hpc_c10d'" in problem, problem
    assert fake_slurm.calls() == ["scontrol show config"]  # not even its nodes were listed


@pytest.mark.parametrize("conf, states, expected", [
    ("absent", "idle", "the designated SLURM cluster 'hpc_c10d' does not answer: scontrol show config failed: "
                       "Unable to contact slurm controller"),
    ("hpc_c10d", "down\ndrained", "the designated SLURM cluster 'hpc_c10d' has no node up (sinfo: 'down\\ndrained')"),
], ids=["controller-down", "nodes-down"])
def test_a_designated_cluster_that_cannot_take_a_job_is_named(fake_slurm, monkeypatch, tmp_path, conf, states,
                                                              expected):
    fake_slurm.cluster("hpc_c10d", states)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / f"{conf}.conf"))
    monkeypatch.setenv(SLURM_DESIGNATION, "hpc_c10d")
    assert slurm_cluster_problem() == expected


def test_a_designation_without_slurm_installed_says_so(fake_slurm, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(SLURM_DESIGNATION, "hpc_c10d")
    assert slurm_cluster_problem() == (f"{SLURM_DESIGNATION}=hpc_c10d, but SLURM is not installed here "
                                       "(no srun, sinfo, scontrol on PATH)")


def _run_suite_without_stages(tmp_path, *args, **env):
    """run_suite with no pytest stage: only its decision about the srun stage runs."""
    return subprocess.run([sys.executable, RUN_SUITE, "--no-serial", "--sizes", "0", "--net-sizes", "0",
                           "--node-layouts", "", "--results-dir", str(tmp_path), *args], capture_output=True,
                          text=True, timeout=120, env=fresh_env(**env), cwd=ROOT)


@pytest.mark.parametrize("required", ["", "1"], ids=["skipped", "required"])
def test_run_suite_has_no_srun_stage_without_a_designation(fake_slurm, monkeypatch, tmp_path, required):
    monkeypatch.setenv("SLURM_CONF", fake_slurm.cluster("production"))
    proc = _run_suite_without_stages(tmp_path, HPC_C10D_REQUIRE_SLURM=required)
    assert fake_slurm.calls() == []
    if required:
        assert re.search(r"srun n=4 +1 +NOT RUN .*" + re.escape(HOW_TO_DESIGNATE), proc.stdout), proc.stdout
        assert proc.returncode == 1
    else:
        assert f"run_suite: no srun stage: {HOW_TO_DESIGNATE}" in proc.stdout, proc.stdout


def test_run_suite_asked_for_no_srun_stage_needs_no_cluster_even_when_one_is_required(tmp_path):
    """CI's multi-node stage runs with --slurm-sizes '' while HPC_C10D_REQUIRE_SLURM=1 is still set."""
    proc = _run_suite_without_stages(tmp_path, "--slurm-sizes", "", HPC_C10D_REQUIRE_SLURM="1")
    assert "srun n=" not in proc.stdout and "NOT RUN" not in proc.stdout, proc.stdout + proc.stderr


def test_local_cluster_up_names_the_process_that_holds_its_port(tmp_path):
    """Checked before anything is installed or started: the port, who holds it, the way out."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(["timeout", "60", "bash", LOCAL_CLUSTER, "up"], capture_output=True, text=True,
                              timeout=90, env={**os.environ, "HPC_C10D_SLURM_DIR": str(tmp_path),
                                               "HPC_C10D_SLURM_CTLD_PORT": str(port)})
    assert proc.returncode == 1, proc.stderr
    with open(f"/proc/{os.getpid()}/comm") as comm:
        holder = f"pid {os.getpid()} ({comm.read().strip()})"
    assert f"ERROR: port {port} (slurmctld) is taken by {holder}, which this script did not start" in proc.stderr
    assert "HPC_C10D_SLURM_CTLD_PORT=7817 HPC_C10D_SLURM_SLURMD_PORT=7818 bash" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.pid")) and "starting" not in proc.stderr, proc.stderr


def _alive(pid):
    """Whether ``pid`` runs (a zombie of ours does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_local_cluster_down_stops_what_its_jobs_left_running(tmp_path):
    """Stand-ins of a step daemon with a rank under it and of an srun client, both of this cluster, and
    an srun of another one: with no daemon to cancel through, ``down`` still stops exactly the first two."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name in ("slurmstepd", "srun"):
        (bin_dir / name).write_text("#!/bin/sh\nsleep 300 &\nwait\n")  # a 'rank' under each
        (bin_dir / name).chmod(0o755)
    ours = {"SLURM_CONF": str(state / "slurm.conf")}
    started = [subprocess.Popen([str(bin_dir / name)], env={**os.environ, **conf}, start_new_session=True)
               for name, conf in (("slurmstepd", ours), ("srun", ours), ("srun", {"SLURM_CONF": "/elsewhere"}))]
    try:
        deadline = time.monotonic() + 10
        ranks = []
        while time.monotonic() < deadline and len(ranks) < 3:  # each stand-in's sleep has started
            sessions = ",".join(str(stand_in.pid) for stand_in in started)
            found = subprocess.run(["pgrep", "-x", "sleep", "-s", sessions], capture_output=True, text=True)
            ranks = [int(pid) for pid in found.stdout.split()]
            time.sleep(0.05)
        assert len(ranks) == 3
        proc = subprocess.run(["timeout", "60", "bash", LOCAL_CLUSTER, "down"], capture_output=True, text=True,
                              timeout=90, env={**os.environ, "HPC_C10D_SLURM_DIR": str(state)})
        assert proc.returncode == 0, proc.stderr
        for stand_in in started[:2]:
            stand_in.wait(timeout=10)
        assert started[2].poll() is None and sum(_alive(r) for r in ranks) == 1, proc.stderr
        assert f"slurmstepd (pid {started[0].pid})" in proc.stderr and f"srun (pid {started[1].pid})" in proc.stderr
        assert f"(pid {started[2].pid})" not in proc.stderr, proc.stderr
        assert proc.stderr.rstrip().endswith("stopped the jobs' processes: down"), proc.stderr
    finally:
        for stand_in in started:
            with contextlib.suppress(ProcessLookupError):  # stopped by `down`, with its whole group
                os.killpg(stand_in.pid, signal.SIGKILL)
            stand_in.wait()


def _left_by_the_templates():
    """What the job templates write into the submission directory, read from the templates."""
    left = ["requeue-7"]
    for template in sorted(os.listdir(TEMPLATES)):
        if template.endswith(".sbatch"):
            with open(os.path.join(TEMPLATES, template)) as script:
                text = script.read()
            assert "#SBATCH --output=%x-%j.out" in text, template
            left.append(re.search(r"#SBATCH --job-name=(\S+)", text).group(1) + "-7.out")
            left += re.findall(r'CHECKPOINT="\$\{CHECKPOINT:-(\S+)\}"', text)
    return left


def test_what_the_templates_leave_in_a_checkout_is_ignored_by_git():
    left = _left_by_the_templates()
    assert "checkpoints/preemptible.h5" in left and "hpc_c10d-cpu-7.out" in left, left
    try:
        proc = subprocess.run(["git", "check-ignore", "--no-index", *left], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if proc.returncode == 128:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    assert proc.stdout.split() == left, proc.stdout + proc.stderr


def _env(**extra):
    """This Python's bin first on PATH (so `python` in job scripts is this one), the checkout importable,
    and none of an enclosing launcher's or job's variables."""
    conf = {"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return fresh_env(drop=("SLURM_",), PATH=path, SLURM_MPI_TYPE=SRUN_MPI, **conf, **extra)  # the templates' srun


def _run(cmd, timeout_s=120, **kwargs):
    proc = subprocess.run(["timeout", str(timeout_s), *cmd], capture_output=True, text=True,
                          timeout=timeout_s + 30, **kwargs)
    assert proc.returncode != 124, f"{cmd} hung past {timeout_s} s\n{proc.stdout}\n{proc.stderr}"
    return proc


def _probe(launch, tmp_path):
    """Run the probe under ``launch`` (a command prefix); return its records by MPI rank."""
    proc = _run([*launch, sys.executable, PROBE, str(tmp_path)], env=_env(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    records = [json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")]
    return sorted(records, key=lambda r: r["mpi_rank"])


@needs_cluster
def test_job_environment_under_srun(tmp_path):
    records = _probe(["srun", "-n", "3", "--overcommit", f"--mpi={SRUN_MPI}"], tmp_path)
    assert [r["mpi_rank"] for r in records] == [0, 1, 2] and {r["mpi_size"] for r in records} == {3}
    for r in records:
        assert r["launcher"] == "srun" and r["in_slurm_job"] and r["job_id"] and r["step_id"] is not None, r
        assert r["env_rank"] == r["mpi_rank"] and r["env_size"] == 3 and r["slurm_procid"] == r["mpi_rank"], r
        assert r["env_local_rank"] == r["local_rank"], r
        assert r["tasks_per_node"] == [3] and r["num_nodes"] == 1, r
        assert r["disagreements"] == [], r


@needs_cluster
def test_job_environment_under_mpiexec_inside_salloc(tmp_path):
    """mpiexec inside an allocation: MPI decides. MPICH's Hydra starts its proxy with srun, so
    SLURM_PROCID is 0 on every rank (a disagreement on all but rank 0); Open MPI's prterun starts
    the ranks of a one-node job itself, so SLURM_PROCID is not set."""
    records = _probe(["salloc", "-n", "3", "--overcommit", "timeout", "90", *mpiexec_command(3)], tmp_path)
    assert [r["mpi_rank"] for r in records] == [0, 1, 2]
    hydra = flavour().name == "mpich"
    for r in records:
        assert r["launcher"] == flavour().launcher and r["in_slurm_job"] and r["job_id"], r
        assert r["env_rank"] == r["mpi_rank"] and r["slurm_procid"] == (0 if hydra else None), r
        notes = r["disagreements"]
        if r["mpi_rank"] == 0 or not hydra:
            assert notes == [], r
        else:
            assert len(notes) == 1 and f"SLURM_PROCID=0 but MPI rank {r['mpi_rank']}" in notes[0], r


@needs_cluster
def test_srun_without_an_mpi_plugin_is_told_how_to_fix_the_launch(tmp_path):
    proc = _run(["srun", "-n", "2", "--overcommit", "--mpi=none", sys.executable, "-c",
                 "import hpc_c10d as d; d.init_process_group()"], env=_env(), cwd=ROOT)
    assert proc.returncode != 0
    assert proc.stderr.count("srun started 2 processes, but MPI sees each one as a world of 1") == 2, proc.stderr
    assert "add --mpi=pmi2" in proc.stderr


@needs_cluster
def test_bench_runs_under_srun(tmp_path):
    """The benchmark CLI under srun: a collective sweep checked against numpy, and the start-up
    sweep launching its jobs with srun itself."""
    out = tmp_path / "coll.json"
    proc = _run(["srun", "-n", "2", "--overcommit", f"--mpi={SRUN_MPI}", sys.executable, "-m", "hpc_c10d", "bench",
                 "collectives", "--ops", "all_reduce,all_to_all", "-b", "8:64", "-f", "8", "-r", "2", "-n", "3", "-q",
                 "--compare", "mpi4py", "--json", str(out)], env=_env(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    results = json.loads(out.read_text())["results"]
    assert len(results) == 8 and all(r["ranks"] == 2 and r["wrong"] == 0 and r["us_max"] > 0 for r in results)
    out = tmp_path / "startup.json"
    proc = _run([sys.executable, "-m", "hpc_c10d", "bench", "startup", "--launcher", "srun", "--ranks", "2",
                 "--repeats", "1", "-q", "--json", str(out)], env=_env(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    results = json.loads(out.read_text())["results"]
    assert {r["op"] for r in results} >= {"init + first all_reduce", "launch to exit"}
    assert all(r["ranks"] == 2 and r["us_max"] > 0 and not r["note"] for r in results)


@needs_cluster
def test_job_environment_outside_slurm(tmp_path):
    records = _probe(mpiexec_command(2), tmp_path)
    assert [r["mpi_rank"] for r in records] == [0, 1]
    for r in records:
        assert r["launcher"] == flavour().launcher and not r["in_slurm_job"] and r["job_id"] is None, r
        assert r["disagreements"] == [], r


def _submit(template, *args, env, cwd):
    """``sbatch`` the template; return its job id."""
    proc = _run(["sbatch", "--parsable", os.path.join(TEMPLATES, template), *args], env=env, cwd=cwd)
    job_id = proc.stdout.strip().split(";")[0]
    assert proc.returncode == 0 and job_id.isdigit(), f"{proc.stdout}\n{proc.stderr}"
    return job_id


_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@contextlib.contextmanager
def _cancelled_on_failure(job_id, env):
    """Cancel the job if the block fails (a wait that timed out): no test leaves a job running."""
    try:
        yield
    except AssertionError:
        subprocess.run(["scancel", job_id], timeout=30, env=env)
        raise


def _finish(job_id, env, timeout_s=300):
    """Wait until the job has ended, asking scontrol every 0.5 s (``sbatch --wait`` asks after 2, 10,
    then every 32 s); return its exit status (1 for a job ended without one, as a cancelled one),
    and what scontrol said of it last."""
    shown, state = "", ""

    def ended():
        nonlocal shown, state
        shown = _run(["scontrol", "show", "job", "--oneliner", job_id], env=env).stdout
        found = re.search(r"\bJobState=(\S+)", shown)
        assert found, f"scontrol no longer knows job {job_id} (MinJobAge passed?): {shown}"
        state = found.group(1)
        return state in _ENDED

    with _cancelled_on_failure(job_id, env):
        _wait_for(ended, timeout_s, f"job {job_id} to end")
    status, by_signal = re.search(r"\bExitCode=(\d+):(\d+)", shown).groups()
    return int(status) or int(by_signal) or int(state != "COMPLETED"), shown


@pytest.fixture
def job_dir(tmp_path):
    """A submission directory with the examples in it, as a user's project would have."""
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    return tmp_path


def _output(job_dir, name, job_id):
    path = job_dir / f"{name}-{job_id}.out"
    return path.read_text() if path.exists() else ""


@needs_cluster
@pytest.mark.long
def test_cpu_template_runs_as_documented(job_dir):
    job_id = _submit("cpu_job.sbatch", "--steps", "20", env=_env(), cwd=job_dir)
    rc, err = _finish(job_id, _env())
    out = _output(job_dir, "hpc_c10d-cpu", job_id)
    assert rc == 0, f"{err}\n{out}"
    assert f"launcher srun; SLURM job {job_id}.0 on 1 node(s)" in out, out
    assert "world size       4 on 1 node(s)" in out, out
    assert "training on 4 rank(s)" in out and "replicas identical: True" in out, out


def _wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _stopped_steps(out, signal="SIGUSR1"):
    return {int(r): int(s) for r, s in re.findall(rf"rank (\d+): stopped after step (\d+) \({signal}\)", out)}


def _preempt(job_dir, steps, env, timeout_s, scancel=("--signal=USR1",)):
    """Submit the preemptible template, ``scancel`` it at step 20 (its tasks get SIGUSR1), wait for the
    job to end; return (job id, exit status, output)."""
    job_id = _submit("preemptible.sbatch", "--steps", str(steps), "--step-seconds", "0.05", env=env, cwd=job_dir)
    with _cancelled_on_failure(job_id, env):
        _wait_for(lambda: "step 20:" in _output(job_dir, "hpc_c10d-preemptible", job_id), 120, "step 20")
        _run(["scancel", *scancel, job_id], timeout_s=30)
    rc, err = _finish(job_id, env, timeout_s)
    return job_id, rc, f"{err}\n{_output(job_dir, 'hpc_c10d-preemptible', job_id)}"


@needs_cluster
@needs_h5py
def test_preemptible_template_stops_every_rank_at_the_same_step(job_dir):
    import h5py

    job_id, rc, out = _preempt(job_dir, 100000, _env(REQUEUE="0", CHECKPOINT="ckpt/state.h5"), 300)
    assert rc == 0, out
    stopped = _stopped_steps(out)
    assert sorted(stopped) == [0, 1, 2, 3], out
    assert len(set(stopped.values())) == 1, stopped  # the same step on every rank
    with h5py.File(job_dir / "ckpt" / "state.h5", "r") as saved:
        assert int(saved["step"][()]) == stopped[0] and saved["momentum"].shape == (16,)
    assert "requeue" not in out


@needs_cluster
@needs_h5py
@pytest.mark.long
def test_preemptible_template_cancelled_leaves_no_requeue_request(job_dir):
    """A plain scancel sends SIGTERM to the batch script too: the ranks still save and ask for a
    requeue, and the script, once srun is back, removes the request and ends without a requeue."""
    job_id, rc, out = _preempt(job_dir, 100000, _env(CHECKPOINT="ckpt/state.h5"), 300, scancel=())
    assert rc != 0, out  # the job was cancelled
    assert sorted(_stopped_steps(out, "SIGTERM")) == [0, 1, 2, 3] and "requeue requested" in out, out
    assert (job_dir / "ckpt" / "state.h5").is_file()
    assert not list(job_dir.glob("requeue-*")) and "requeueing job" not in out, out


@needs_cluster
@needs_h5py
@pytest.mark.long
def test_preemptible_template_requeues_and_resumes(job_dir):
    job_id, rc, out = _preempt(job_dir, 150, _env(CHECKPOINT="ckpt/state.h5"), 400)
    assert rc == 0, out
    stopped = _stopped_steps(out)
    assert sorted(stopped) == [0, 1, 2, 3] and len(set(stopped.values())) == 1, out
    assert f"requeueing job {job_id}" in out and f"job {job_id}, restart 1" in out, out
    assert f"resuming from ckpt/state.h5 at step {stopped[0]}" in out, out
    assert sorted(int(r) for r in re.findall(r"rank (\d+): finished 150 steps", out)) == [0, 1, 2, 3], out
    assert not list(job_dir.glob("requeue-*"))


@needs_cluster
def test_local_cluster_status_tells_another_cluster_from_its_own(tmp_path):
    """The designated cluster, seen from a local_cluster.sh state dir that runs nothing."""
    proc = subprocess.run(["bash", LOCAL_CLUSTER, "status"], capture_output=True, text=True, timeout=60,
                          env=_env(HPC_C10D_SLURM_DIR=str(tmp_path)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    designated = os.environ[SLURM_DESIGNATION]
    assert proc.stdout.startswith("our cluster: down\nanother SLURM cluster answers srun here (that one is not ours): "
                                  f"ClusterName={designated}, config "), proc.stdout
