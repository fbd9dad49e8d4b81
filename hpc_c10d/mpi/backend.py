"""``MPIBackend``: every collective and point-to-point operation on numpy buffers over mpi4py.

Blocking calls use MPI's blocking collectives; ``async_op=True`` the nonblocking ones, with a
``Work`` that keeps every buffer alive. List collectives stage small messages (``staging.py``) and
take larger ones where the blocks lie (``scattered.py``); ``reduce_scatter`` from a list reads one
contiguous buffer (a reduction takes nothing else): a view when the blocks lie back to back, else
a kept staging buffer. Design: docs/architecture.md, "Decisions" (List-shaped collectives).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ..arrays import as_input, as_output
from ..reduce_op import RedOpType
from ..transport import Transport, displacements
from ..work import ReceiveWork, Work
from .failures import failure_of, mpi_failure, short_receive
from .ops import REDUCTIONS, mpi_datatype, reduction
from .scattered import address, apart, lay_out, place
from .staging import SEND_STAGE_MAX_BYTES, STAGE_MAX_BYTES, Staging, landing_for, pack, take, unpack

__all__ = ["MPIBackend"]

_IN_PLACE = MPI.IN_PLACE
_LEAF_CALLS = {  # (operation, staged at the root) -> the MPI calls of a rank other than the root
    ("gather", True): ("Gather", "Igather"), ("gather", False): ("Gatherv", "Igatherv"),
    ("scatter", True): ("Scatter", "Iscatter"), ("scatter", False): ("Scatterv", "Iscatterv"),
}


def _op_and_factor(op: Any) -> tuple[RedOpType, Any]:
    if type(op) is RedOpType:
        return op, None
    factor = op.factor
    if factor is not None and hasattr(factor, "item"):
        factor = factor.item()
    return op.op, factor


def _may_alias(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` may share memory (two arrays that own their memory never do)."""
    return (a.base is not None or b.base is not None or a is b) and np.may_share_memory(a, b)


def _scaled(buf: np.ndarray, factor: Any) -> np.ndarray:
    return np.multiply(buf, factor).astype(buf.dtype, copy=False)


def _average(buf: np.ndarray, size: int) -> None:
    if buf.dtype.kind in "iu":  # truncate toward zero, as NCCL's integer AVG does
        np.divide(buf, size, out=buf, casting="unsafe")
    else:
        np.divide(buf, size, out=buf)


def _after_exchange(sent: Staging | None, landed: Staging | None, outs: Sequence[np.ndarray]) -> None:
    """After a staged all_to_all: give the send buffer back, copy the receive buffer out."""
    if sent is not None:
        sent.release()
    if landed is not None:
        unpack(landed, outs)


class MPIBackend(Transport):
    """Collectives over one MPI intracommunicator (the group's own, never COMM_WORLD itself)."""

    device = "cpu"

    def __init__(self, comm: MPI.Intracomm, timeout: Any = None) -> None:
        self._comm = comm
        self._failure = failure_of(comm)  # what this transport's Works raise for an MPI error
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()

    adapt_input = staticmethod(as_input)
    adapt_output = staticmethod(as_output)

    def _issue(self, blocking, nonblocking, args, async_op, user, finish=None, keep=None):
        """Every operation's one way to MPI: ``nonblocking(*args)`` in a ``Work`` keeping ``keep``
        alive, or a blocking call (MPI's, or the nonblocking one handed to ``finish_within``, set for
        backend "hpc" under torch, whose blocking calls end within a timeout); ``finish`` runs after
        completion (a staged copy out, AVG's division). One call deep on purpose: each call level
        costs ~0.1 µs, a tenth of a small all_reduce's whole overhead (``allreduce`` inlines it)."""
        try:  # free in CPython 3.11+ while nothing raises
            if async_op:
                return Work([nonblocking(*args)], user, finish, keep, self._failure, self.watch)
            if self.finish_within is None:
                blocking(*args)
            else:
                request = nonblocking(*args)
                if not request.Test():  # most small ones are done at once: no call then
                    self.finish_within(request, args)
        except MPI.Exception as exc:
            raise mpi_failure(exc, self._comm) from exc
        if finish is not None:
            finish()
        return None

    def _reduction(self, buf, op, name):
        """(Reduction, PREMUL_SUM factor or None, what averages the result afterwards or None)."""
        if type(op) is RedOpType:  # the common case: a cached table entry, no closure
            red = REDUCTIONS[op].get(buf.dtype) or reduction(op, buf.dtype, name)
            if not red.average:
                return red, None, None
        op, factor = _op_and_factor(op)
        red = reduction(op, buf.dtype, name)
        average = (lambda: _average(buf, self._size)) if red.average else None
        return red, factor, average

    def allreduce(self, buf, op, async_op, user):
        if type(op) is RedOpType:  # the hot path: a cached table entry, no closure, no scaling
            red = REDUCTIONS[op].get(buf.dtype) or reduction(op, buf.dtype, "all_reduce")
            if not red.average:  # _issue inlined: 0.2 µs of a 1.0 µs call at 1 rank (bench torch, timeit)
                recv = (buf, red.datatype)
                try:
                    if async_op:
                        return Work([self._comm.Iallreduce(_IN_PLACE, recv, red.op)], [user], None, buf, self._failure,
                                    self.watch)
                    if self.finish_within is None:
                        self._comm.Allreduce(_IN_PLACE, recv, red.op)
                    else:
                        request = self._comm.Iallreduce(_IN_PLACE, recv, red.op)
                        if not request.Test():
                            self.finish_within(request, buf)
                except MPI.Exception as exc:
                    raise mpi_failure(exc, self._comm) from exc
                return None
        red, factor, average = self._reduction(buf, op, "all_reduce")
        send = _IN_PLACE if factor is None else (_scaled(buf, factor), red.datatype)
        args = (send, (buf, red.datatype), red.op)
        return self._issue(self._comm.Allreduce, self._comm.Iallreduce, args, async_op,
                           [user], average, (buf, send))

    def broadcast(self, buf, root, async_op, user):
        comm = self._comm
        return self._issue(comm.Bcast, comm.Ibcast, ((buf, mpi_datatype(buf.dtype)), root), async_op, [user],
                           None, buf)

    def reduce(self, buf, root, op, async_op, user):
        if type(op) is RedOpType:  # the hot path, as in allreduce
            red = REDUCTIONS[op].get(buf.dtype) or reduction(op, buf.dtype, "reduce")
            if not red.average:
                data = (buf, red.datatype)
                call = (_IN_PLACE, data, red.op, root) if self._rank == root else (data, None, red.op, root)
                return self._issue(self._comm.Reduce, self._comm.Ireduce, call, async_op, [user], None, buf)
        red, factor, average = self._reduction(buf, op, "reduce")
        mine = (buf, red.datatype)
        send = mine if factor is None else (_scaled(buf, factor), red.datatype)
        if self._rank == root:
            args: tuple[Any, ...] = (_IN_PLACE if factor is None else send, mine, red.op, root)
        else:
            args, average = (send, None, red.op, root), None
        return self._issue(self._comm.Reduce, self._comm.Ireduce, args, async_op,
                           [user], average, (buf, send))

    def allgather(self, out, inp, async_op, user):
        datatype = mpi_datatype(out.dtype)
        send: tuple[Any, MPI.Datatype] | MPI.InPlaceType = (inp, datatype)
        if _may_alias(out, inp):  # FSDP-style: the input is this rank's block of out
            block = out.reshape(-1)[self._rank * inp.size:(self._rank + 1) * inp.size]
            same = block.__array_interface__["data"][0] == inp.__array_interface__["data"][0]
            send = _IN_PLACE if same else (inp.copy(), datatype)
        args = (send, (out, datatype))
        return self._issue(self._comm.Allgather, self._comm.Iallgather, args, async_op,
                           [user], None, (out, inp))

    def allgather_list(self, outs, inp, async_op, user):
        datatype = mpi_datatype(inp.dtype)
        if inp.nbytes * self._size <= STAGE_MAX_BYTES:  # small: see staging.py
            kept = take(inp.dtype, outs[0].shape, self._size)
            args: tuple[Any, ...] = ((inp, datatype), (kept.whole, datatype))
            return self._issue(self._comm.Allgather, self._comm.Iallgather, args, async_op, user,
                               partial(kept.release, outs), inp)
        blocks, in_place = place(outs, inp, self._rank)
        if blocks is not None:  # into the blocks where they lie
            args = (_IN_PLACE if in_place else (inp, datatype), blocks)
            return self._issue(self._comm.Allgatherv, self._comm.Iallgatherv, args, async_op,
                               user, None, (outs, inp))
        counts = [o.size for o in outs]  # see place(): staged
        landing, staged = landing_for(outs, inp.dtype, [inp])
        args = ((inp, datatype), (landing, counts, displacements(counts), datatype))
        return self._issue(self._comm.Allgatherv, self._comm.Iallgatherv, args, async_op,
                           user, staged and partial(unpack, staged, outs), (outs, inp, landing))

    def _leaf(self, op, mine, root, staged, async_op, user, keep):
        """A rank other than the root of a gather or scatter: it sends or receives only ``mine``,
        with the collective the root calls (the plain one where the root stages the list)."""
        blocking, nonblocking = (getattr(self._comm, name) for name in _LEAF_CALLS[op, staged])
        args = (mine, None, root) if op == "gather" else (None, mine, root)
        return self._issue(blocking, nonblocking, args, async_op, user, None, keep)

    def gather_list(self, outs, inp, root, async_op, user):
        datatype = mpi_datatype(inp.dtype)
        send: Any = (inp, datatype)
        small = inp.nbytes * self._size <= STAGE_MAX_BYTES  # the same answer on every rank
        if self._rank != root:
            return self._leaf("gather", send, root, small, async_op, user, inp)
        if small:  # see staging.py
            kept = take(inp.dtype, outs[0].shape, self._size)
            args = (send, (kept.whole, datatype), root)
            return self._issue(self._comm.Gather, self._comm.Igather, args, async_op, user,
                               partial(kept.release, outs), inp)
        staged = None
        recv, in_place = place(outs, inp, root)
        if recv is not None:  # into the blocks where they lie
            send = _IN_PLACE if in_place else send
        else:  # see place(): staged
            counts = [o.size for o in outs]
            landing, staged = landing_for(outs, inp.dtype, [inp])
            recv = (landing, counts, displacements(counts), datatype)
        return self._issue(self._comm.Gatherv, self._comm.Igatherv, (send, recv, root), async_op,
                           user, staged and partial(unpack, staged, outs), (outs, inp, recv))

    def scatter_list(self, out, inps, root, async_op, user):
        datatype = mpi_datatype(out.dtype)
        recv: Any = (out, datatype)
        small = out.nbytes * self._size <= SEND_STAGE_MAX_BYTES  # the same answer on every rank
        if self._rank != root:
            return self._leaf("scatter", recv, root, small, async_op, [user], out)
        if small:  # see staging.py
            kept = take(out.dtype, inps[0].shape, self._size)
            kept.fill_from(inps)
            args = ((kept.whole, datatype), recv, root)
            return self._issue(self._comm.Scatter, self._comm.Iscatter, args, async_op, [user], kept.release, out)
        staged = None
        send, in_place = place(inps, out, root)
        if send is not None:  # from the blocks where they lie
            recv = _IN_PLACE if in_place else recv
        else:  # see place(): staged
            packed, staged = pack(inps, out.dtype, [out])
            counts = [i.size for i in inps]
            send = (packed, counts, displacements(counts), datatype)
        return self._issue(self._comm.Scatterv, self._comm.Iscatterv, (send, recv, root), async_op,
                           [user], staged and staged.release, (out, inps, send))

    def reduce_scatter(self, out, inp, op, async_op, user):
        red, factor, average = self._reduction(out, op, "reduce_scatter")
        send = inp if factor is None else _scaled(inp, factor)
        if send is inp and _may_alias(out, inp):  # MPI forbids aliased buffers
            send = inp.copy()
        args = ((send, red.datatype), (out, red.datatype), red.op)
        return self._issue(self._comm.Reduce_scatter_block, self._comm.Ireduce_scatter_block,
                           args, async_op, [user], average, (out, inp, send))

    def reduce_scatter_list(self, out, inps, op, async_op, user):
        red, factor, average = self._reduction(out, op, "reduce_scatter")
        packed, staged = pack(inps, out.dtype, [out])  # one contiguous buffer: see the module docstring
        if factor is not None:
            packed = _scaled(packed, factor)
        counts = [i.size for i in inps]
        args = ((packed, red.datatype), (out, red.datatype), counts, red.op)
        finish = average if staged is None else partial(staged.release, None, average)
        return self._issue(self._comm.Reduce_scatter, self._comm.Ireduce_scatter, args,
                           async_op, [user], finish, (out, packed))

    def alltoall(self, out, inp, out_counts, in_counts, async_op, user):
        datatype = mpi_datatype(out.dtype)
        if out_counts is None and in_counts is None:
            return self._issue(self._comm.Alltoall, self._comm.Ialltoall, ((inp, datatype), (out, datatype)),
                               async_op, [user], None, (out, inp))
        blocks = ((inp, in_counts, displacements(in_counts), datatype),
                  (out, out_counts, displacements(out_counts), datatype))
        return self._issue(self._comm.Alltoallv, self._comm.Ialltoallv, blocks, async_op,
                           [user], None, (out, inp))

    def alltoall_list(self, outs, inps, async_op, user):
        """One ``Alltoallw`` on every rank, whatever each decides for its own blocks: large ones
        where they lie unless an output overlaps an input or another output, small ones (and
        overlapping or far-apart ones) through kept staging buffers (see staging.py)."""
        dtype = outs[0].dtype if outs else inps[0].dtype
        in_counts = [i.size for i in inps]
        out_counts = [o.size for o in outs]
        send = recv = sent = landed = None
        if (sum(in_counts) + sum(out_counts)) * dtype.itemsize > STAGE_MAX_BYTES:
            in_starts, out_starts = [address(i) for i in inps], [address(o) for o in outs]
            if apart(inps, in_starts, outs, out_starts):
                send, recv = lay_out(inps, in_starts), lay_out(outs, out_starts)
        if send is None:
            packed, sent = pack(inps, dtype, outs)
            send = (packed, [d * dtype.itemsize for d in displacements(in_counts)])
        if recv is None:
            landing, landed = landing_for(outs, dtype, inps)
            recv = (landing, [d * dtype.itemsize for d in displacements(out_counts)])
        types = [mpi_datatype(dtype)] * self._size
        exchange = ((send[0], in_counts, send[1], types), (recv[0], out_counts, recv[1], types))
        finish = None if sent is None and landed is None else partial(_after_exchange, sent, landed, outs)
        return self._issue(self._comm.Alltoallw, self._comm.Ialltoallw, exchange, async_op,
                           user, finish, (outs, inps, send[0], recv[0]))

    def barrier(self, async_op):
        return self._issue(self._comm.Barrier, self._comm.Ibarrier, (), async_op, [])

    def send(self, buf, peer, tag, async_op, user):
        data = (buf, mpi_datatype(buf.dtype))
        try:  # _issue, inlined: the hot path
            if async_op:
                return Work([self._comm.Isend(data, peer, tag)], [user], None, buf, self._failure, self.watch)
            self._comm.Send(data, peer, tag)
        except MPI.Exception as exc:
            raise mpi_failure(exc, self._comm) from exc
        return None

    def recv(self, buf, peer, tag, async_op, user):
        source = MPI.ANY_SOURCE if peer is None else peer
        status = MPI.Status()
        datatype = mpi_datatype(buf.dtype)
        try:
            if async_op:
                return ReceiveWork(self._comm.Irecv((buf, datatype), source, tag), [user], buf, status, self._failure,
                                   self.watch)
            self._comm.Recv((buf, datatype), source, tag, status)
        except MPI.Exception as exc:
            raise mpi_failure(exc, self._comm) from exc
        received = status.Get_count(datatype)
        if received != buf.size:  # a shorter message leaves the rest of buf as it was
            raise short_receive(received, buf.size)
        return status.Get_source()
