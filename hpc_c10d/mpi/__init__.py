"""The MPI transport: bootstrap, dtype/op tables and the CPU backend over mpi4py."""
