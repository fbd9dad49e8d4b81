"""Job-environment detection from the variables each launcher sets (as measured under SLURM 22.05,
MPICH's Hydra and Open MPI); tests/launch/test_slurm.py checks the same under a real cluster."""
import pytest

from hpc_c10d.job import jobenv
from hpc_c10d.job.preemption import Preemption, _signals_from

SRUN_TASK = {  # srun -n 4 --mpi=pmi2 on two nodes, task 2
    "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_STEP_NODELIST": "node[07-08]", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "0",
    "PMI_RANK": "2", "PMI_SIZE": "4", "PMI_FD": "5", "PMI_JOBID": "41.0", "SLURM_MPI_TYPE": "pmi2",
}
SRUN_PMIX_TASK = {  # srun -n 2 --mpi=pmix (SLURM 22.05 with libpmix 4, Open MPI 5's wheel), task 1
    "SLURM_JOB_ID": "25", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
    "SLURM_JOB_NODELIST": "vm", "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_MPI_TYPE": "pmix", "PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.25.0",
}
HYDRA_IN_SALLOC = {  # salloc -n 3 mpiexec -n 3, rank 1: the SLURM task variables describe Hydra's proxy
    "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "vm", "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "3",
    "PMI_RANK": "1", "PMI_SIZE": "3", "PMI_FD": "6", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3",
}
BATCH_SHELL = {"SLURM_JOB_ID": "43", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "vm",
               "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "2"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "PMIX_RANK": "3"}
INTEL_HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "PMI_FD": "5",  # impi-rt 2021.19's mpiexec
               "I_MPI_HYDRA_TOPOLIB": "ipl2", "HYDRA_BSTRAP_PROXY_ID": "0"}
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost"}


def test_srun_task():
    job = jobenv.detect(SRUN_TASK)
    assert (job.launcher, job.job_id, job.step_id) == ("srun", "41", "0")
    assert (job.env_rank, job.env_size, job.env_local_rank) == (2, 4, 0)
    assert job.nodes() == ["node07", "node08"] and job.num_nodes == 2 and job.tasks_per_node == [2, 2]
    assert (job.cpus_per_task, job.gpus_per_task, job.visible_gpus) == (8, "1", ["0"])
    assert job.disagreements(2, 4) == []
    assert job.describe() == ("launcher srun; SLURM job 41.0 on 2 node(s) node[07-08]; tasks/node 2(x2); "
                              "cpus/task 8; gpus/task 1; CUDA_VISIBLE_DEVICES 0")


def test_srun_task_with_pmix_is_srun_s():
    """Under srun --mpi=pmix the PMIx variables come from SLURM's own plugin: the launcher is srun
    (it was reported as "pmix", with no size and no local rank)."""
    job = jobenv.detect(SRUN_PMIX_TASK)
    assert (job.launcher, job.job_id, job.step_id) == ("srun", "25", "0")
    assert (job.env_rank, job.env_size, job.env_local_rank) == (1, 2, 1)
    assert job.disagreements(1, 2) == []


def test_srun_task_that_mpi_numbers_differently_is_reported():
    assert jobenv.detect(SRUN_TASK).disagreements(1, 4) == ["srun says rank 2, MPI says 1"]


def test_mpich_mpiexec_inside_an_allocation():
    job = jobenv.detect(HYDRA_IN_SALLOC)
    assert job.launcher == "mpich-hydra" and job.in_slurm_job
    assert (job.env_rank, job.env_size, job.env_local_rank, job.slurm_procid) == (1, 3, 1, 0)
    assert job.tasks_per_node == [3]  # the job's layout, not the proxy step's
    (note,) = job.disagreements(1, 3)
    assert note.startswith("SLURM_PROCID=0 but MPI rank 1: this process was started by mpich-hydra")


def test_intel_mpi_mpiexec_is_told_from_mpich_s():
    """Intel MPI's mpiexec is MPICH's Hydra, setting the same PMI variables and some of its own."""
    job = jobenv.detect(INTEL_HYDRA)
    assert job.launcher == "intel-hydra" and not job.in_slurm_job
    assert (job.env_rank, job.env_size, job.env_local_rank) == (1, 2, 1)


def test_the_batch_shell_is_not_a_task():
    job = jobenv.detect(BATCH_SHELL)
    assert job.launcher == "sbatch-script" and job.env_rank is None and job.env_size is None
    assert job.disagreements(0, 1) == []


def test_open_mpi_and_torchrun_and_nothing():
    job = jobenv.detect(OPEN_MPI)
    assert (job.launcher, job.env_rank, job.env_size, job.env_local_rank) == ("openmpi", 3, 4, 1)
    assert not job.in_slurm_job and job.nodes() == []
    assert jobenv.detect(TORCHRUN).launcher == "torchrun"
    assert jobenv.detect(TORCHRUN).disagreements(0, 1) == ["torchrun says world size 2, MPI says 1",
                                                             "torchrun says rank 1, MPI says 0"]
    assert jobenv.detect({}).describe() == "launcher none"


def test_job_end_time_outside_slurm_and_from_the_environment():
    assert jobenv.job_end_time(jobenv.detect({})) is None
    assert jobenv.job_end_time(jobenv.detect({**BATCH_SHELL, "SLURM_JOB_END_TIME": "1790000000"})) == 1790000000.0


def test_stop_signal_names(monkeypatch):
    import signal

    assert _signals_from(["USR1", "sigterm", 12]) == [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2]
    monkeypatch.setenv("HPC_C10D_STOP_SIGNALS", "USR2")
    assert _signals_from(None) == [signal.SIGUSR2]
    with pytest.raises(ValueError, match="not a signal name"):
        Preemption(["NOPE"])
    with pytest.raises(ValueError, match="time_margin"):
        Preemption(time_margin=-1)
