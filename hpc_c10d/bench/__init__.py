"""``python -m hpc_c10d bench``: an OSU/nccl-tests-style instrument for this library and this machine.

Sub-benchmarks: ``collectives`` (size sweeps with nccl-tests' algorithm and bus bandwidth and a
checking pass that counts wrong elements), ``torch`` (torch.distributed on backend "hpc" against
gloo, and a DDP step), ``p2p`` (latency and bandwidth between rank pairs), ``stores`` (MPIStore, and
TCPStore), ``startup`` (init and first collective, swept over world sizes) and ``checkpoint`` (HDF5).
``--compare`` runs raw mpi4py and torch.distributed in the same rounds.
"""

from .cli import main
from .options import parser

__all__ = ["main", "parser"]
