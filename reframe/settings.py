"""ReFrame settings for hpc_c10d's checks: this machine (``--system local``: jobs run here, started
with ``mpiexec``) and a SLURM cluster (``--system slurm``: jobs submitted with ``sbatch``, found
with ``squeue``, which needs no accounting database, started with ``srun --mpi=pmi2``; SLURM_CONF
says which cluster). A site copies one partition and adds its own references (docs/centres.md)."""

site_configuration = {
    "systems": [
        {
            "name": "local",
            "descr": "this machine, jobs under mpiexec",
            "hostnames": [".*"],
            "partitions": [{"name": "default", "scheduler": "local", "launcher": "mpiexec",
                            "environs": ["hpc_c10d"], "max_jobs": 1}],
        },
        {
            "name": "slurm",
            "descr": "a SLURM cluster, jobs under srun",
            "hostnames": [".*"],
            "partitions": [{"name": "default", "scheduler": "squeue", "launcher": "srun",
                            "environs": ["hpc_c10d"], "max_jobs": 1,
                            "env_vars": [["SLURM_MPI_TYPE", "pmi2"]]}],
        },
    ],
    "environments": [
        {"name": "hpc_c10d"},  # the Python environment reframe runs from, hpc_c10d installed there
    ],
}
