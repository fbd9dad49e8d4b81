"""hpc_c10d under a real SLURM cluster (slurm/local_cluster.sh brings one up on localhost).

Serial tests that submit jobs themselves; every srun/salloc/sbatch runs under ``timeout``. They
skip with a reason when no SLURM cluster answers, so a laptop still runs the suite. What they
check: the job environment under srun, under MPICH's mpiexec inside salloc and outside SLURM;
the CPU template as documented; the preemptible template stopping every rank at the same step
on ``scancel --signal=USR1``, with a checkpoint and a clean exit, and its requeue-and-resume.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from _launch import ROOT, fresh_env, mpiexec, outer_world_size, slurm_cluster_problem

h5py = pytest.importorskip("h5py", reason="h5py is not installed (pip install 'hpc-c10d[hdf5]')")
PROBE = os.path.join(ROOT, "tests", "slurm", "probe.py")
TEMPLATES = os.path.join(ROOT, "slurm")


def _cluster_problem():
    if outer_world_size() > 1:
        return "serial test that submits SLURM jobs itself"
    return slurm_cluster_problem() or None


_problem = _cluster_problem()
_required = os.environ.get("HPC_C10D_REQUIRE_SLURM") == "1" and outer_world_size() == 1  # .ci/run sets it
pytestmark = pytest.mark.skipif(_problem is not None and not _required, reason=_problem or "")


@pytest.fixture(autouse=True)
def _cluster_is_up():
    if _problem is not None:
        pytest.fail(f"HPC_C10D_REQUIRE_SLURM=1 but {_problem}")


def _env(**extra):
    """This Python's bin first on PATH (so `python` in job scripts is this one), the checkout importable,
    and none of an enclosing launcher's or job's variables."""
    conf = {"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return fresh_env(drop=("SLURM_",), PATH=path, **conf, **extra)


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


def test_job_environment_under_srun(tmp_path):
    records = _probe(["srun", "-n", "3", "--overcommit", "--mpi=pmi2"], tmp_path)
    assert [r["mpi_rank"] for r in records] == [0, 1, 2] and {r["mpi_size"] for r in records} == {3}
    for r in records:
        assert r["launcher"] == "srun" and r["in_slurm_job"] and r["job_id"] and r["step_id"] is not None, r
        assert r["env_rank"] == r["mpi_rank"] and r["env_size"] == 3 and r["slurm_procid"] == r["mpi_rank"], r
        assert r["env_local_rank"] == r["local_rank"], r
        assert r["tasks_per_node"] == [3] and r["num_nodes"] == 1, r
        assert r["disagreements"] == [], r


def test_job_environment_under_mpiexec_inside_salloc(tmp_path):
    """MPICH's mpiexec inside an allocation: SLURM_PROCID is 0 on every rank; MPI decides."""
    records = _probe(["salloc", "-n", "3", "--overcommit", "timeout", "90", mpiexec(), "-n", "3"], tmp_path)
    assert [r["mpi_rank"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["launcher"] == "mpich-hydra" and r["in_slurm_job"] and r["job_id"], r
        assert r["env_rank"] == r["mpi_rank"] and r["slurm_procid"] == 0, r
        notes = r["disagreements"]
        if r["mpi_rank"] == 0:
            assert notes == [], r
        else:
            assert len(notes) == 1 and f"SLURM_PROCID=0 but MPI rank {r['mpi_rank']}" in notes[0], r


def test_srun_without_an_mpi_plugin_is_told_how_to_fix_the_launch(tmp_path):
    proc = _run(["srun", "-n", "2", "--overcommit", "--mpi=none", sys.executable, "-c",
                 "import hpc_c10d as d; d.init_process_group()"], env=_env(), cwd=ROOT)
    assert proc.returncode != 0
    assert proc.stderr.count("srun started 2 processes, but MPI sees each one as a world of 1") == 2, proc.stderr
    assert "add --mpi=pmi2" in proc.stderr


def test_bench_runs_under_srun(tmp_path):
    """The benchmark CLI under srun: a collective sweep checked against numpy, and the start-up
    sweep launching its jobs with srun itself."""
    out = tmp_path / "coll.json"
    proc = _run(["srun", "-n", "2", "--overcommit", "--mpi=pmi2", sys.executable, "-m", "hpc_c10d", "bench",
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


def test_job_environment_outside_slurm(tmp_path):
    records = _probe([mpiexec(), "-n", "2"], tmp_path)
    assert [r["mpi_rank"] for r in records] == [0, 1]
    for r in records:
        assert r["launcher"] == "mpich-hydra" and not r["in_slurm_job"] and r["job_id"] is None, r
        assert r["disagreements"] == [], r


def _submit(template, *args, env, cwd):
    """Start `sbatch --wait` (returns with the job's exit status); return (process, job id)."""
    cmd = ["timeout", "600", "sbatch", "--wait", "--parsable", os.path.join(TEMPLATES, template), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    job_id = proc.stdout.readline().strip().split(";")[0]
    assert job_id.isdigit(), (job_id, proc.stderr.read() if proc.poll() is not None else "")
    return proc, job_id


def _finish(proc, timeout_s=300):
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, err


@pytest.fixture
def job_dir(tmp_path):
    """A submission directory with the examples in it, as a user's project would have."""
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    return tmp_path


def _output(job_dir, name, job_id):
    path = job_dir / f"{name}-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_cpu_template_runs_as_documented(job_dir):
    proc, job_id = _submit("cpu_job.sbatch", "--steps", "20", env=_env(), cwd=job_dir)
    rc, err = _finish(proc)
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


def _stopped_steps(out):
    return {int(r): int(s) for r, s in re.findall(r"rank (\d+): stopped after step (\d+) \(SIGUSR1\)", out)}


def _preempt(job_dir, steps, env, timeout_s):
    """Submit the preemptible template, send its tasks SIGUSR1 at step 20, wait for the job to end;
    return (job id, exit status, output)."""
    proc, job_id = _submit("preemptible.sbatch", "--steps", str(steps), "--step-seconds", "0.05", env=env, cwd=job_dir)
    try:
        _wait_for(lambda: "step 20:" in _output(job_dir, "hpc_c10d-preemptible", job_id), 120, "step 20")
        _run(["scancel", "--signal=USR1", job_id], timeout_s=30)
        rc, err = _finish(proc, timeout_s)
    finally:
        if proc.poll() is None:
            subprocess.run(["scancel", job_id], timeout=30)
            proc.kill()
    out = _output(job_dir, "hpc_c10d-preemptible", job_id)
    assert rc == 0, f"{err}\n{out}"
    return job_id, out


def test_preemptible_template_stops_every_rank_at_the_same_step(job_dir):
    job_id, out = _preempt(job_dir, 100000, _env(REQUEUE="0", CHECKPOINT="ckpt/state.h5"), 300)
    stopped = _stopped_steps(out)
    assert sorted(stopped) == [0, 1, 2, 3], out
    assert len(set(stopped.values())) == 1, stopped  # the same step on every rank
    with h5py.File(job_dir / "ckpt" / "state.h5", "r") as saved:
        assert int(saved["step"][()]) == stopped[0] and saved["momentum"].shape == (16,)
    assert "requeue" not in out


def test_preemptible_template_requeues_and_resumes(job_dir):
    job_id, out = _preempt(job_dir, 300, _env(CHECKPOINT="ckpt/state.h5"), 400)
    stopped = _stopped_steps(out)
    assert sorted(stopped) == [0, 1, 2, 3] and len(set(stopped.values())) == 1, out
    assert f"requeued job {job_id}" in out and f"job {job_id}, restart 1" in out, out
    assert f"resuming from ckpt/state.h5 at step {stopped[0]}" in out, out
    assert sorted(int(r) for r in re.findall(r"rank (\d+): finished 300 steps", out)) == [0, 1, 2, 3], out
