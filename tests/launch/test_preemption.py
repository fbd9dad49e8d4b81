"""Preemption.should_stop(): one answer per step on every rank, whichever rank saw the signal."""
import os
import signal

import pytest

import hpc_c10d as dist
from support.reference import assert_in_sync

pytestmark = pytest.mark.mpi


def _steps_until_stop(stop, limit=20):
    for step in range(limit):
        if stop.should_stop():
            return step
    return None


@pytest.mark.parametrize("who", ["last", "every"])
def test_a_signal_on_some_ranks_stops_every_rank_at_the_same_step(world, rank, size, who):
    with dist.Preemption(["USR1"]) as stop:
        assert _steps_until_stop(stop, 3) is None and not stop.requested
        if who == "every" or rank == size - 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs before the next bytecode
        assert stop.requested == (who == "every" or rank == size - 1)
        step = _steps_until_stop(stop)
        assert stop.stopped_by == "SIGUSR1"
    steps = [None] * size
    dist.all_gather_object(steps, step)
    assert steps == [0] * size
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # close() gave the default back


def test_a_rank_past_its_time_margin_stops_everyone(world, rank, size, monkeypatch):
    if rank == 0:  # only rank 0 learns that the job ends now
        monkeypatch.setenv("SLURM_JOB_ID", "1")
        monkeypatch.setenv("SLURM_JOB_END_TIME", "1000")
    with dist.Preemption(["USR1"], time_margin=60) as stop:
        assert stop.should_stop() and stop.stopped_by == "time limit"


def test_requeue_outside_slurm_is_refused(world, rank, size, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with dist.Preemption(["USR1"]) as stop:
        assert stop.requeue() is False
    assert_in_sync()


def test_requeue_leaves_a_request_for_the_batch_script(world, rank, size, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("HPC_C10D_REQUEUE_FILE", str(tmp_path / f"requeue-{rank}"))
    with dist.Preemption(["USR1"]) as stop:
        assert stop.requeue() is (rank == 0)
    assert (tmp_path / f"requeue-{rank}").exists() == (rank == 0)
