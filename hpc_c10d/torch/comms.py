"""The MPI communicators behind torch's process groups: the world, and subgroups carved out of it.

torch numbers ranks as its rendezvous said; this plugin checks that they are MPI's, so a group's
``global_ranks_in_group`` are ``COMM_WORLD`` ranks (after ``shrink_group`` of the default group,
ranks of the survivors' world, numbered anew). torch creates a backend only on the group's
members, so subgroups use ``MPI_Comm_create_group`` (collective over the members only).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..job import threads
from ..mpi import bootstrap

__all__ = ["group_communicator", "set_world"]

_world: Any = None  # the world's communicator once the default group was shrunk (else COMM_WORLD)


def set_world(comm: Any) -> None:
    """Carve later groups out of ``comm``, the shrunk default group's (whose ranks are renumbered)."""
    global _world
    _world = comm.Dup()


def _mismatch(what: str, torch_value: int, mpi_value: int) -> ValueError:
    return ValueError(
        f"torch.distributed says this process has {what} {torch_value} but MPI says {mpi_value}: backend "
        "'hpc' needs torch's ranks to be MPI's. Launch with mpiexec/srun and let the plugin rendezvous "
        "(no RANK/WORLD_SIZE/MASTER_ADDR set, or init_method='mpi://'), or set RANK and WORLD_SIZE to "
        "the MPI rank and size")


def group_communicator(global_ranks: Sequence[int], group_rank: int, group_size: int) -> Any:
    """Return a new communicator for the group torch is creating (the world when ``global_ranks``
    is empty), after checking that torch's rank and size agree with MPI's."""
    MPI = bootstrap.initialize()
    world = MPI.COMM_WORLD if _world is None else _world
    if not global_ranks:
        if group_size != world.Get_size():
            raise _mismatch("world size", group_size, world.Get_size())
        if group_rank != world.Get_rank():
            raise _mismatch("rank", group_rank, world.Get_rank())
        comm = world.Dup()
        threads.limit_pools_of(comm)  # as hpc_c10d's own init_process_group does
        return comm
    ranks = list(global_ranks)
    if len(ranks) != group_size or ranks[group_rank] != world.Get_rank():
        raise _mismatch("global rank", ranks[group_rank] if group_rank < len(ranks) else -1, world.Get_rank())
    members = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(members)
    finally:
        members.Free()
