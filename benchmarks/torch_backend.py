"""torch.distributed on backend "hpc" (hpc_c10d.torch) against gloo and raw mpi4py, and a DDP step:
``mpiexec -n 2 python benchmarks/torch_backend.py [bench options]`` is
``python -m hpc_c10d bench torch [bench options]`` (8 B to 1 MiB all_reduce, DDP step of a 399k MLP)."""

from _library import bench

bench("torch")
