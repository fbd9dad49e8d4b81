"""The job environment: who launched this process and what the batch system says about the job.

MPI is the truth for rank and world size; the launcher's variables serve diagnostics and what MPI
cannot tell (job id, node list, tasks per node, CPUs and GPUs per task, the time limit), and
``JobEnv.disagreements`` names where they differ from MPI. ``detect()`` reads only the
environment. Design: docs/architecture.md, "The job".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["JobEnv", "detect", "job_end_time"]

#: the launcher's own rank and size variables, innermost launcher first.
_RANK_SOURCES = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich-hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", None),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
)


_INTEL_HYDRA = ("I_MPI_HYDRA_", "HYDRA_BSTRAP_")  # what Intel MPI's Hydra sets in its processes, MPICH's not


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class JobEnv:
    """What the environment says about this process's job (None: not said)."""

    launcher: str  # "srun", "mpich-hydra", "intel-hydra", "openmpi", "pmix", "torchrun", "sbatch-script" or "none"
    in_slurm_job: bool
    job_id: str | None = None
    step_id: str | None = None
    env_rank: int | None = None  # the launcher's rank variable, for diagnostics only
    env_size: int | None = None
    env_local_rank: int | None = None
    slurm_procid: int | None = None
    node_list: str | None = None  # compressed, as SLURM writes it ("n[01-04]")
    num_nodes: int | None = None
    tasks_per_node: list[int] = field(default_factory=list)  # per node of the step (or job)
    cpus_per_task: int | None = None
    gpus_per_task: str | None = None
    visible_gpus: list[str] | None = None  # CUDA_VISIBLE_DEVICES, split
    end_time: float | None = None  # epoch seconds, when the environment carries it

    def nodes(self) -> list[str]:
        """The node list expanded ("n[01-02]" -> ["n01", "n02"]), with python-hostlist."""
        if not self.node_list:
            return []
        import hostlist

        return hostlist.expand_hostlist(self.node_list)

    def disagreements(self, mpi_rank: int, mpi_size: int) -> list[str]:
        """Where the launcher's variables contradict MPI (whose answer hpc_c10d uses)."""
        found = []
        if self.env_size is not None and self.env_size != mpi_size:
            found.append(f"{self.launcher} says world size {self.env_size}, MPI says {mpi_size}")
        if self.env_rank is not None and self.env_rank != mpi_rank:
            found.append(f"{self.launcher} says rank {self.env_rank}, MPI says {mpi_rank}")
        if self.slurm_procid is not None and self.slurm_procid != mpi_rank and self.launcher != "srun":
            found.append(f"SLURM_PROCID={self.slurm_procid} but MPI rank {mpi_rank}: this process was "
                         f"started by {self.launcher}, not srun, so SLURM's task variables do not apply")
        return found

    def describe(self) -> str:
        """One line for logs and ``python -m hpc_c10d info``."""
        parts = [f"launcher {self.launcher}"]
        if self.in_slurm_job:
            step = f".{self.step_id}" if self.step_id is not None else ""
            nodes = f"{self.num_nodes or '?'} node(s) {self.node_list or ''}".rstrip()
            parts.append(f"SLURM job {self.job_id}{step} on {nodes}")
            if self.tasks_per_node:
                parts.append(f"tasks/node {_compress(self.tasks_per_node)}")
            if self.cpus_per_task:
                parts.append(f"cpus/task {self.cpus_per_task}")
            if self.gpus_per_task:
                parts.append(f"gpus/task {self.gpus_per_task}")
        if self.visible_gpus is not None:
            parts.append(f"CUDA_VISIBLE_DEVICES {','.join(self.visible_gpus) or '(none)'}")
        if self.end_time is not None:
            parts.append(f"ends {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.end_time))}")
        return "; ".join(parts)


def _compress(counts: list[int]) -> str:
    """[2, 2, 2, 1] -> "2(x3),1", SLURM's own notation."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ",".join(f"{c}(x{n})" if n > 1 else str(c) for c, n in runs)


def _launcher(env: Mapping[str, str]) -> tuple[str, str | None, str | None, str | None]:
    """The innermost launcher and its rank, size and local-rank variables."""
    for name, rank, size, local in _RANK_SOURCES:
        if rank in env:
            if name == "mpich-hydra" and "MPI_LOCALRANKID" not in env and "SLURM_STEP_ID" in env:
                continue  # PMI_RANK from srun's own PMI-2 plugin, not from Hydra
            if name == "pmix" and env.get("PMIX_NAMESPACE", "").startswith("slurm."):
                continue  # PMIX_RANK from srun's own PMIx plugin (--mpi=pmix), not from a PMIx launcher
            if name == "slurm" and "SLURM_STEP_ID" not in env:
                return "sbatch-script", None, None, None  # the batch shell: one process, no task of a step
            if name == "slurm":
                name = "srun"
            if name == "mpich-hydra" and any(key.startswith(_INTEL_HYDRA) for key in env):
                name = "intel-hydra"  # Intel MPI's mpiexec: MPICH's Hydra, with variables of its own
            return name, env.get(rank), env.get(size), env.get(local) if local else None
    return "none", None, None, None


def detect(env: Mapping[str, str] | None = None) -> JobEnv:
    """Read the job environment (``os.environ`` unless given)."""
    env = os.environ if env is None else env
    launcher, rank, size, local = _launcher(env)
    in_slurm = "SLURM_JOB_ID" in env
    if launcher == "srun":
        step_layout = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        num_nodes = _int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES"))
    else:
        step_layout, nodes = env.get("SLURM_TASKS_PER_NODE"), env.get("SLURM_JOB_NODELIST")
        num_nodes = _int(env.get("SLURM_JOB_NUM_NODES"))
    tasks: list[int] = []
    if step_layout:
        import hostlist

        tasks = hostlist.parse_slurm_tasks_per_node(step_layout)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return JobEnv(
        launcher=launcher,
        in_slurm_job=in_slurm,
        job_id=env.get("SLURM_JOB_ID"),
        step_id=env.get("SLURM_STEP_ID"),
        env_rank=_int(rank),
        env_size=_int(size),
        env_local_rank=_int(local),
        slurm_procid=_int(env.get("SLURM_PROCID")),
        node_list=nodes,
        num_nodes=num_nodes,
        tasks_per_node=tasks,
        cpus_per_task=_int(env.get("SLURM_CPUS_PER_TASK")),
        gpus_per_task=env.get("SLURM_GPUS_PER_TASK"),
        visible_gpus=None if visible is None else [d for d in visible.split(",") if d],
        end_time=_int(env.get("SLURM_JOB_END_TIME")),
    )


def job_end_time(job: JobEnv | None = None, timeout_s: float = 10.0) -> float | None:
    """When the SLURM job reaches its time limit (epoch seconds); None outside SLURM or unlimited.

    From ``SLURM_JOB_END_TIME`` when set, else one ``squeue`` call (bounded by ``timeout_s``)."""
    job = detect() if job is None else job
    if not job.in_slurm_job:
        return None
    if job.end_time is not None:
        return float(job.end_time)
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        out = subprocess.run([squeue, "-h", "-j", str(job.job_id), "-o", "%e"], capture_output=True,
                             text=True, timeout=timeout_s).stdout.strip()
        return time.mktime(time.strptime(out, "%Y-%m-%dT%H:%M:%S"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # unlimited ("N/A"), or SLURM did not answer in time
