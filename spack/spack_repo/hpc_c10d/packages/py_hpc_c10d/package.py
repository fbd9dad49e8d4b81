# Spack recipe for hpc_c10d. Lives in the project's own package repository:
#     spack repo add <checkout>/spack
#     spack install py-hpc-c10d

import os

from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.python import PythonPackage

from spack.package import *


class PyHpcC10d(PythonPackage, CudaPackage):
    """hpc_c10d offers the torch.distributed (c10d) programming interface on
    top of plain MPI through mpi4py, so PyTorch-style distributed code can run
    with whatever MPI library an HPC site provides."""

    homepage = "https://github.com/hpc-c10d/hpc_c10d"
    git = "https://github.com/hpc-c10d/hpc_c10d.git"

    version("main", branch="main")

    variant("hdf5", default=False, description="Checkpoint I/O through parallel HDF5 (h5py)")

    # [build-system] in pyproject.toml: setuptools>=68 with setuptools.build_meta
    depends_on("python@3.10:", type=("build", "run"))
    depends_on("py-setuptools@68:", type="build")

    # [project] dependencies
    depends_on("py-numpy@1.24:", type=("build", "run"))
    depends_on("py-mpi4py@4:", type=("build", "run"))
    depends_on("py-ml-dtypes@0.3:", type=("build", "run"))
    depends_on("py-python-hostlist@1.21:", type=("build", "run"))
    depends_on("py-threadpoolctl@3.1:", type=("build", "run"))
    # Any MPI provider; mpiexec must be on PATH at run time.
    depends_on("mpi", type=("build", "run"))

    # Optional extras
    depends_on("py-h5py +mpi", when="+hdf5", type=("build", "run"))

    # GPU path: CuPy arrays and NCCL, built for the same GPU architectures.
    conflicts("+cuda cuda_arch=none", msg="+cuda needs a cuda_arch value, e.g. cuda_arch=90")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(
            f"py-cupy +cuda cuda_arch={_arch}",
            when=f"+cuda cuda_arch={_arch}",
            type=("build", "run"),
        )
        depends_on(f"nccl +cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")

    import_modules = [
        "hpc_c10d",
        "hpc_c10d.checkpoint",
        "hpc_c10d.diagnostics",
        "hpc_c10d.job",
        "hpc_c10d.mpi",
        "hpc_c10d.nccl",
        "hpc_c10d.store",
    ]

    def setup_run_environment(self, env):
        # The NCCL transport then loads Spack's NCCL, not the first libnccl the loader finds.
        if self.spec.satisfies("+cuda"):
            env.set(
                "HPC_C10D_NCCL_LIBRARY", join_path(self.spec["nccl"].prefix.lib, "libnccl.so.2")
            )

    def test_two_ranks(self):
        """all_reduce of np.ones(3) over two MPI ranks gives 2.0"""
        mpiexec_path = self.spec["mpi"].prefix.bin.mpiexec
        if os.path.exists(mpiexec_path):
            mpiexec = Executable(mpiexec_path)
        else:
            mpiexec = which("mpiexec", "mpirun", required=True)

        # Open MPI refuses to run as root and to oversubscribe small CI machines.
        extra_env = {}
        if self.spec.satisfies("^openmpi"):
            extra_env = {
                "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1",
                "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
            }

        script = (
            "import numpy as np; import hpc_c10d as d; d.init_process_group(); "
            "x = np.ones(3); d.all_reduce(x); assert x[0] == 2, x; "
            "print('rank', d.get_rank(), 'ok'); d.destroy_process_group()"
        )
        out = mpiexec(
            "-n",
            "2",
            self.spec["python"].command.path,
            "-c",
            script,
            output=str,
            error=str,
            extra_env=extra_env,
        )
        assert out.count(" ok") == 2, out
