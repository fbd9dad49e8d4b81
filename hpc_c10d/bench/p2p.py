"""Point-to-point, OSU style, between rank pairs (0,1), (2,3), ... (an odd last rank sits out):
``latency`` is half a ping-pong round trip; ``bandwidth`` sends a window of nonblocking messages,
then one empty acknowledgement back."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import numpy as np

from .collective_ops import Case, contribution
from .collectives import count_wrong
from .report import Record
from .sweep import Sweep
from .torch_side import as_tensor
from .units import fmt_bytes, sweep

__all__ = ["run", "P2P_OPS", "WINDOW"]

P2P_OPS = ("latency", "bandwidth")
WINDOW = 64  # messages in flight per bandwidth step, as osu_bw


class _Transport(NamedTuple):
    send: Callable
    recv: Callable
    isend: Callable
    irecv: Callable
    wait_all: Callable


def _wait_each(works: list) -> None:
    for work in works:
        work.wait()


def _transport(bench: Sweep, impl: str) -> _Transport:
    if impl == "mpi4py":
        from mpi4py import MPI

        comm = bench.comm
        return _Transport(comm.Send, comm.Recv, comm.Isend, comm.Irecv, MPI.Request.Waitall)
    api = bench.apis[impl][0]
    return _Transport(api.send, api.recv, api.isend, api.irecv, _wait_each)


def _ping(first: Callable, then: Callable) -> None:
    first()
    then()


def _window(post: Callable, wait_all: Callable, reply: Callable) -> None:
    wait_all([post() for _ in range(WINDOW)])
    reply()


def _step(op: str, t: _Transport, sender: bool, data: Any, landing: Any, ack: Any, peer: int) -> Callable:
    send, recv = partial(t.send, data, peer), partial(t.recv, landing, peer)
    if op == "latency":
        return partial(_ping, send, recv) if sender else partial(_ping, recv, send)
    if sender:
        return partial(_window, partial(t.isend, data, peer), t.wait_all, partial(t.recv, ack, peer))
    return partial(_window, partial(t.irecv, landing, peer), t.wait_all, partial(t.send, ack, peer))


def run(bench: Sweep, ops: list[str], sizes: tuple[int, int], factor: int, dtype: np.dtype) -> list[Record]:
    """Sweep ``ops`` (``latency``, ``bandwidth``) over ``sizes`` for every implementation (at least 2 ranks)."""
    from mpi4py import MPI

    peer = bench.rank ^ 1
    paired = peer < bench.size
    sender = bench.rank % 2 == 0
    points = [(op, nbytes) for op in ops for nbytes in sweep(*sizes, factor, dtype.itemsize)]
    bench.progress.total = len(points)
    records = []
    for op, nbytes in points:
        case = Case(bench.rank, bench.size, nbytes // dtype.itemsize, dtype, "sum")
        expected = contribution(case, peer, case.count)
        data = bench.to_device(contribution(case, bench.rank, case.count))
        landing = bench.to_device(np.zeros(case.count, dtype))
        ack = bench.to_device(np.zeros(0, dtype))
        steps, wrong = {}, {}
        for impl in bench.impls:
            tensors = impl != "mpi4py" and bench.apis[impl][1]
            arrays = (as_tensor(data), as_tensor(landing), as_tensor(ack)) if tensors else (data, landing, ack)
            step = _step(op, _transport(bench, impl), sender, *arrays, peer) if paired else (lambda: None)
            landing[...] = 0
            bench.comm.Barrier()
            step()
            receives = paired and (op == "latency" or not sender)
            bad = count_wrong(bench.to_host(landing), expected) if receives else 0
            wrong[impl] = bench.comm.allreduce(bad, op=MPI.SUM)
            steps[impl] = step
        measured = bench.measure(steps, taking_part=paired)
        # a latency step is a round trip (two messages), a bandwidth step WINDOW messages
        per_step = 2 if op == "latency" else WINDOW
        measured = {impl: t._replace(spread=(t.spread[0] / per_step, t.spread[1] / per_step, t.spread[2] / per_step))
                    for impl, t in measured.items()}
        # a latency is one message's time, not a rate: no bandwidth columns
        records += bench.records(measured, wrong, bench="p2p", op=op, bytes=nbytes, count=case.count,
                                 dtype=str(dtype), bus=None if op == "latency" else 1.0)
        bench.progress.step(f"{op} {fmt_bytes(nbytes)}")
    return records
