"""MPI errors come back as DistBackendError naming the rank and the operation; group timeouts' defaults.

Under mpiexec (``-m mpi``): every group's communicator returns MPI's errors to hpc_c10d, and a
blocking receive whose message does not fit its tensor (truncated, or shorter: MPI allows that,
torch does not) raises on the receiving rank only, leaving the ranks in step. Serial: where a
group's timeout comes from (``timeout=``, ``HPC_C10D_TIMEOUT``, torch's default). Mismatched
collectives are whole jobs of their own, in tests/diagnostics/test_faults.py.
"""
import re
from datetime import timedelta

import numpy as np
import pytest
from mpi4py import MPI

import hpc_c10d as dist
from support.reference import assert_in_sync
from hpc_c10d.timeouts import check_timeout, default_pg_timeout

P2P_CAUSE = "the sending and receiving ranks may disagree on the shape or dtype"


@pytest.mark.mpi
def test_every_group_returns_mpi_errors_to_hpc_c10d(world, rank, size):
    """Set on the world's communicator in init_process_group (whatever the application chose for
    its own, e.g. MPI4PY_RC_ERRORS=fatal), and inherited by every group made from it."""
    mine, _ = dist.new_subgroups(1)
    local = dist.new_group([rank], use_local_synchronization=True)
    groups = [world, dist.new_group(), mine, local, dist.split_group(world, [list(range(size))])]
    for group in groups:
        handler = group.comm.Get_errhandler()
        try:
            assert handler == MPI.ERRORS_RETURN, group
        finally:
            handler.Free()
    for group in groups[1:]:
        dist.destroy_process_group(group)


def _send_to_rank_1(rank, sent, received):
    """Rank 0 sends ``sent`` float32 elements, rank 1 receives into ``received``; return its error."""
    group = dist.new_group()
    try:
        if rank == 0:
            dist.send(np.ones(sent, np.float32), dst=1, group=group)
        elif rank == 1:
            with pytest.raises(dist.DistBackendError) as caught:
                dist.recv(np.zeros(received, np.float32), src=0, group=group)
            return str(caught.value), group.group_name
        return None, group.group_name
    finally:
        assert_in_sync()
        dist.destroy_process_group(group)


@pytest.mark.mpi
def test_the_ranks_disagree_hint_comes_only_with_error_classes_that_can_mean_it(world):
    """A truncation (MPICH: MPI_ERR_OTHER where a collective compares sizes) can mean the ranks
    disagree; an invalid tag, rank or communicator is this rank's own (it said so for "Invalid tag")."""
    from hpc_c10d.mpi.failures import mpi_failure

    for error_class in (MPI.ERR_TRUNCATE, MPI.ERR_OTHER, MPI.ERR_IN_STATUS):
        assert "may disagree" in str(mpi_failure(MPI.Exception(error_class))), error_class
    for error_class in (MPI.ERR_TAG, MPI.ERR_RANK, MPI.ERR_COMM, MPI.ERR_COUNT):
        message = str(mpi_failure(MPI.Exception(error_class)))
        assert " failed in MPI: " in message and "disagree" not in message, message


@pytest.mark.mpi(min_size=2)
def test_a_truncated_blocking_recv_raises_on_the_receiver(rank):
    message, name = _send_to_rank_1(rank, sent=5, received=4)
    if rank == 1:
        assert re.fullmatch(rf"\[rank 1\] recv seq 1 of group {name} float32\[4\] failed in MPI: .+; {P2P_CAUSE}",
                            message), message


@pytest.mark.mpi(min_size=2)
def test_a_short_message_into_a_blocking_recv_raises_on_the_receiver(rank):
    message, name = _send_to_rank_1(rank, sent=4, received=5)
    if rank == 1:
        assert message == (f"[rank 1] recv seq 1 of group {name} float32[5] received 4 elements, "
                           f"but the tensor holds 5; {P2P_CAUSE}")


@pytest.mark.mpi
def test_groups_made_without_timeout_take_the_default_groups(world):
    explicit = timedelta(seconds=7)
    inherited, chosen = dist.new_group(), dist.new_group(timeout=explicit)
    try:
        assert (inherited._timeout, chosen._timeout) == (world._timeout, explicit)
    finally:
        dist.destroy_process_group(inherited)
        dist.destroy_process_group(chosen)


def test_hpc_c10d_timeout_sets_the_default_and_timeout_wins(monkeypatch):
    monkeypatch.delenv("HPC_C10D_TIMEOUT", raising=False)
    assert check_timeout(None) == default_pg_timeout == timedelta(minutes=30)
    monkeypatch.setenv("HPC_C10D_TIMEOUT", " 2.5 ")
    assert check_timeout(None) == timedelta(seconds=2.5)
    assert check_timeout(timedelta(seconds=9)) == timedelta(seconds=9)
    assert dist.default_pg_timeout == timedelta(minutes=30), "torch's constant stays what torch code compares with"
    with pytest.raises(TypeError, match="datetime.timedelta"):
        check_timeout(2.5)
