"""HDF5 checkpoint bandwidth, all ranks through hpc_c10d.checkpoint against one process with h5py:
``mpiexec -n 2 python benchmarks/checkpoint.py [--size 256M --dir /scratch/me]`` is
``python -m hpc_c10d bench checkpoint [options]``."""

from _library import bench

bench("checkpoint")
