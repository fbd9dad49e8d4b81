"""MPIStore against torch's TCPStore, per operation and contended:
``mpiexec -n 2 python benchmarks/store.py [bench options]`` is
``python -m hpc_c10d bench stores --compare [bench options]``."""

from _library import bench

bench("stores", "--compare")
