"""Lightning (Fabric DDP, Trainer DDP, FSDP2 through ModelParallelStrategy) and accelerate on backend
"hpc", under mpiexec and srun: parameters equal to one process training alone on the whole batch,
torch's default store an MPIStore, and nothing listening on the MASTER_PORT Lightning sets.

Serial tests that start their own jobs (tests/programs/frameworks.py). They need the versions the
``frameworks`` extra pins, and skip saying so without them; CI's frameworks stage installs it.
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from support.launch import (ROOT, flavour, fresh_env, job_sizes, mpiexec, mpiexec_command, outer_world_size,
                            slurm_cluster_problem, slurm_required)

PROGRAM = os.path.join(ROOT, "tests", "programs", "frameworks.py")
LIGHTNING = ["fabric_ddp", "trainer_ddp", "fabric_fsdp2"]
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")

pytestmark = [
    pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts its own jobs"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


def _needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed (pip install '.[frameworks]')")


def _check(proc, scenario, nprocs, environment):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    found = sorted(re.findall(rf"{scenario} rank (\d+)/(\d+): (\w+) store, parameters match \((\w+)\)",
                              proc.stdout))
    assert found == [(str(r), str(nprocs), "MPIStore", environment) for r in range(nprocs)], proc.stdout


def _under_mpiexec(scenario, nprocs):
    cmd = ["timeout", "240", *mpiexec_command(nprocs), sys.executable, PROGRAM, scenario]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=270, cwd=ROOT,
                          env=fresh_env(drop=_RENDEZVOUS))


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
@_needs("lightning")
@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
@pytest.mark.parametrize("scenario", LIGHTNING)
@pytest.mark.long
def test_lightning_under_mpiexec(scenario, nprocs):
    _check(_under_mpiexec(scenario, nprocs), scenario, nprocs, "MPIEnvironment")


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
@_needs("accelerate")
@pytest.mark.parametrize("nprocs", job_sizes(2, 3))
@pytest.mark.long
def test_accelerate_on_a_group_made_first(nprocs):
    proc = _under_mpiexec("accelerate", nprocs)
    _check(proc, "accelerate", nprocs, "accelerate")
    assert "accelerator.state.backend is 'gloo'" in proc.stdout  # what docs/frameworks.md warns of


_slurm_problem = slurm_cluster_problem() if outer_world_size() == 1 else "serial test that submits a job"


@pytest.mark.skipif(bool(_slurm_problem) and not slurm_required(), reason=_slurm_problem or "")
@_needs("lightning")
@pytest.mark.parametrize("nprocs", [3])
@pytest.mark.parametrize("scenario", LIGHTNING[:2])
@pytest.mark.long
def test_lightning_under_srun(scenario, nprocs):
    """Lightning picks its SLURMEnvironment here, which sets MASTER_ADDR/MASTER_PORT too. At 3 ranks only,
    and Fabric's and the Trainer's DDP only: what the launcher changes depends on neither the size nor
    the strategy (FSDP2 runs under mpiexec above)."""
    assert not _slurm_problem, f"HPC_C10D_REQUIRE_SLURM=1 but {_slurm_problem}"
    conf = {"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    cmd = ["timeout", "240", "srun", "-n", str(nprocs), f"--ntasks-per-node={nprocs}", "--overcommit",
           f"--mpi={flavour().srun_mpi}", sys.executable, PROGRAM, scenario]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=270, cwd=ROOT,
                          env=fresh_env(drop=("SLURM_", *_RENDEZVOUS), PATH=path, **conf))
    _check(proc, scenario, nprocs, "SLURMEnvironment")


@pytest.mark.skipif(bool(_slurm_problem) and not slurm_required(), reason=_slurm_problem or "")
@_needs("submitit")
def test_a_submitit_job_runs_backend_hpc_on_every_task(tmp_path, monkeypatch):
    assert not _slurm_problem, f"HPC_C10D_REQUIRE_SLURM=1 but {_slurm_problem}"
    import submitit

    programs = os.path.dirname(PROGRAM)
    monkeypatch.syspath_prepend(programs)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([programs, ROOT, os.environ.get("PYTHONPATH", "")]))
    for name in _RENDEZVOUS:
        monkeypatch.delenv(name, raising=False)
    import frameworks

    executor = submitit.AutoExecutor(folder=str(tmp_path))
    assert executor.cluster == "slurm"
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=5,
                               slurm_srun_args=[f"--mpi={flavour().srun_mpi}", "--overcommit"])
    job = executor.submit(frameworks.submitit_task)
    answers = sorted(job.results())
    assert answers == [(r, 2, "srun", [3.0, 3.0, 3.0], "MPIStore") for r in range(2)], answers


def _recipes():
    """(file name, how it is run, code) of each recipe in docs/frameworks.md."""
    with open(os.path.join(ROOT, "docs", "frameworks.md")) as f:
        blocks = re.findall(r"```python\n(# (\S+\.py):\s+(\S+).*?\n.*?)```", f.read(), re.S)
    return [(name, how, code) for code, name, how in blocks]


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec next to the Python interpreter or on PATH")
@_needs("lightning")
@_needs("accelerate")
@pytest.mark.parametrize("name, how, code", [r for r in _recipes() if r[1] == "mpiexec"], ids=lambda v: str(v)[:20])
@pytest.mark.long
def test_the_docs_recipes_run_as_written(name, how, code, tmp_path):
    (tmp_path / name).write_text(code)
    cmd = ["timeout", "240", *mpiexec_command(2), sys.executable, name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=270, cwd=tmp_path,
                          env=fresh_env(drop=_RENDEZVOUS))
    assert proc.returncode == 0, f"{name}\n{proc.stdout}\n{proc.stderr[-3000:]}"


@pytest.mark.skipif(bool(_slurm_problem) and not slurm_required(), reason=_slurm_problem or "")
@_needs("submitit")
def test_the_docs_submitit_recipe_runs_as_written(tmp_path):
    assert not _slurm_problem, f"HPC_C10D_REQUIRE_SLURM=1 but {_slurm_problem}"
    (name, how, code), = [r for r in _recipes() if r[1] == "python"]
    (tmp_path / name).write_text(code.replace("--mpi=pmi2", f"--mpi={flavour().srun_mpi}"))
    proc = subprocess.run(["timeout", "240", sys.executable, name], capture_output=True, text=True, timeout=270,
                          cwd=tmp_path, env=fresh_env(drop=_RENDEZVOUS))
    assert proc.returncode == 0 and "[(0, [2.0, 2.0, 2.0, 2.0]), (1, [2.0, 2.0, 2.0, 2.0])]" in proc.stdout, \
        f"{proc.stdout}\n{proc.stderr[-3000:]}"
