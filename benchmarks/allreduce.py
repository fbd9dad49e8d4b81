"""all_reduce through hpc_c10d, raw mpi4py and torch.distributed (gloo), interleaved:
``mpiexec -n 2 python benchmarks/allreduce.py [bench options]`` is
``python -m hpc_c10d bench collectives --ops all_reduce --compare -b 8:16M [bench options]``."""

from _library import bench

bench("collectives", "--ops", "all_reduce", "--compare", "-b", "8:16M")
