"""``NCCLBackend``: every collective and point-to-point operation on GPU arrays, over NCCL.

Stream semantics are ProcessGroupNCCL's: the communicator's stream waits for the caller's, runs
the operation and records an event that the caller's stream then waits for (blocking) or a
``CUDAWork`` holds (``async_op=True``); the host never blocks. Communicators are made on first use
or when a device is bound. Design: docs/architecture.md, "NCCL transport".
"""

from __future__ import annotations

import atexit
import collections
import logging
import time
from functools import partial
from typing import Any, Callable, Sequence

from ..errors import DistBackendError
from ..transport import Transport, displacements
from ..work import Work
from . import cuda, library
from .buffers import DeviceBuffer, as_device_buffer, contiguous_input
from .comm import Communicator
from .device import device_index
from .dtypes import BYTES, nccl_reduction
from .work import CUDAWork

__all__ = ["NCCLBackend"]

_DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice
_NATIVE_FP8 = (2, 24, 0)  # the first NCCL with float8 datatypes
_PRUNE_PER_CALL = 4  # finished Works released per call (their buffers go back to the allocator)

Enqueue = Callable[[Communicator], None]  # queues NCCL calls on the communicator's stream (its lock held)
# One NCCL call (or device copy) of a group: (handle, stream, PREMUL_SUM ops created) -> ncclResult_t
Step = Callable[[int, int, list], int]


def _overlap(a: DeviceBuffer, b: DeviceBuffer) -> bool:
    return a.ptr < b.end() and b.ptr < a.end() and a.nbytes > 0 and b.nbytes > 0


def _span(blocks: Sequence[DeviceBuffer]) -> DeviceBuffer | None:
    """One buffer over ``blocks`` when they lie back to back in order (``tensor.chunk(n)``)."""
    end = blocks[0].ptr
    for block in blocks:
        if block.ptr != end or block.dtype != blocks[0].dtype or block.device != blocks[0].device:
            return None
        end = block.end()
    first, total = blocks[0], sum(b.size for b in blocks)
    return DeviceBuffer(first.ptr, total, first.dtype, (total,), first.device, [b.owner for b in blocks],
                        first.kind, True, stream_hint=first.stream_hint)


def _collect(errors: list[Exception], call: Callable[[], None]) -> None:
    """Run ``call``; append what it raises to ``errors``."""
    try:
        call()
    except Exception as exc:
        errors.append(exc)


class NCCLBackend(Transport):
    """GPU collectives of one group; one NCCL communicator per CUDA device the group uses."""

    device = "cuda"

    def __init__(self, comm: Any, timeout: Any = None) -> None:
        self._nccl = library.load()
        self._mpi = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._timeout = timeout
        self._timeout_s = None if timeout is None else timeout.total_seconds()
        self._comms: dict[int, Communicator] = {}
        self._pairs: dict[tuple[int, int], Communicator] = {}  # (device, peer): before the group's exists
        self._pending: collections.deque[CUDAWork] = collections.deque()
        # device -> events of retired Works, to record again
        self._spare_events: collections.defaultdict[int, list] = collections.defaultdict(list)
        _open[self] = None

    # ---- arrays ---------------------------------------------------------------------------
    @staticmethod
    def adapt_input(x: Any, name: str) -> DeviceBuffer:
        return contiguous_input(as_device_buffer(x, name))

    @staticmethod
    def adapt_output(x: Any, name: str, writable: bool = True) -> DeviceBuffer:
        buf = as_device_buffer(x, name)
        if not buf.contiguous:
            raise ValueError(f"`{name}` must be C-contiguous because the result is written into it in place; "
                             "pass a contiguous array (cupy.ascontiguousarray / tensor.contiguous()) and copy back")
        if writable and buf.readonly:
            raise ValueError(f"`{name}` is read-only, but the result is written into it in place")
        return buf

    # ---- communicators --------------------------------------------------------------------
    def _bind(self, device_id: Any) -> None:
        """Create the group's communicator on ``device_id`` now (collective over the group)."""
        self._connect(device_index(device_id))

    def _connect(self, device: int) -> Communicator:
        """The group's communicator on ``device``; creating it is collective over the group."""
        comm = self._comms.get(device)
        if comm is None:
            comm = self._comms[device] = Communicator.from_mpi(self._nccl, self._mpi, device,
                                                               f"a group of {self._size} on cuda:{device}",
                                                               self._timeout_s)
        return comm

    def _splittable(self) -> bool:
        """Whether this rank can split the group's communicator: NCCL has ``ncclCommSplit`` and the
        group has one communicator, live, with no asynchronous error pending (a split of that one
        fails on this rank while the others wait in it). Only an agreement of every rank acts on it."""
        if len(self._comms) != 1 or not self._nccl.has_split:
            return False
        comm = next(iter(self._comms.values()))
        return comm.state == "live" and comm.async_error() is None

    def _split(self, color: int | None, key: int, size: int) -> Communicator | None:
        """Collective over the group, once every rank found it ``_splittable``: split its
        communicator (None for a rank with no colour)."""
        return next(iter(self._comms.values())).split(color, key, size)

    def _adopt(self, comm: Communicator) -> None:
        """Use ``comm`` (split from the parent group's) as this group's communicator on its device."""
        self._comms[comm.device] = comm

    def _pair(self, device: int, peer: int) -> tuple[Communicator, int]:
        """(communicator, peer's rank in it) for point-to-point with ``peer``."""
        comm = self._comms.get(device)
        if comm is not None:
            return comm, peer
        pair = self._pairs.get((device, peer))
        if pair is None:
            lo, hi = sorted((self._rank, peer))
            group = self._mpi.Get_group().Incl([lo, hi])
            mpi_pair = self._mpi.Create_group(group, tag=7)
            group.Free()
            try:
                pair = Communicator.from_mpi(self._nccl, mpi_pair, device, f"ranks {lo} and {hi} on cuda:{device}",
                                             self._timeout_s)
            finally:
                mpi_pair.Free()
            self._pairs[(device, peer)] = pair
        return pair, 0 if peer < self._rank else 1

    # ---- launching ------------------------------------------------------------------------
    def _launch(self, name: str, comm: Communicator, anchor: DeviceBuffer, enqueue: Enqueue, async_op: bool,
                outputs: list, keep: Any) -> CUDAWork | None:
        """Run ``enqueue`` on ``comm``'s stream, ordered after the caller's stream; track it.

        If a call fails part-way through a group, the calls NCCL already launched still run: the
        Work is tracked all the same (keeping the buffers alive) and the caller's stream waits
        for it, then the error is raised.
        """
        failure: Exception | None = None
        try:
            caller = cuda.caller_stream(anchor)
            with comm.lock, cuda.device_guard(comm.device):
                comm.refuse_unless_live(name)
                comm.ready.record(caller)
                comm.stream.wait_event(comm.ready)
                try:
                    enqueue(comm)
                except Exception as exc:
                    failure = exc
                try:
                    done = self._spare_events[comm.device].pop()
                except IndexError:  # none to spare (another thread may just have taken the last)
                    done = cuda.new_event()
                done.record(comm.stream)
            work = CUDAWork(done, comm, outputs, keep, name, anchor)
            self._track(work)
            if failure is None and async_op:
                return work
            caller.wait_event(done)
        except cuda.runtime_error() as exc:  # a failing event or stream call is the job's DistBackendError too
            raise cuda.cuda_error(exc) from exc
        if failure is not None:
            work._exception = failure
            raise failure
        return None

    def _track(self, work: CUDAWork) -> None:
        """Keep ``work`` until the GPU has passed it; retire a few that it has (their events serve
        again: a finished Work never looks at its event)."""
        pending = self._pending
        for _ in range(_PRUNE_PER_CALL):
            try:
                oldest = pending.popleft()  # taken first: another thread pruning cannot take it too
            except IndexError:
                break
            if not oldest._passed():
                pending.appendleft(oldest)
                break
            oldest._retire()
            self._spare_events[oldest._comm.device].append(oldest._event)
        pending.append(work)

    def _group(self, calls: list[Step], what: str) -> Enqueue:
        """One enqueue step running ``calls`` between ncclGroupStart and ncclGroupEnd (a single
        NCCL call runs alone). PREMUL_SUM ops are destroyed once the group has been queued.

        The group is closed and the ops destroyed even when a call fails; the first failure is
        the one raised (with any later ones in its message)."""
        nccl = self._nccl

        def enqueue(comm: Communicator) -> None:
            handle, stream = comm.handle, comm.stream.ptr
            created: list[int] = []
            errors: list[Exception] = []
            grouped = len(calls) > 1
            if grouped:
                nccl.check(nccl.ncclGroupStart(), "ncclGroupStart")
            try:
                for call in calls:
                    comm.run(call(handle, stream, created), what)
            except Exception as exc:
                errors.append(exc)
            if grouped:
                _collect(errors, lambda: comm.run(nccl.ncclGroupEnd(), f"ncclGroupEnd ({what})"))
            for op in created:
                _collect(errors, partial(nccl.check, nccl.ncclRedOpDestroy(op, handle), "ncclRedOpDestroy"))
            if len(errors) == 1:
                raise errors[0]
            if errors:
                raise DistBackendError("; then ".join(map(str, errors))) from errors[0]

        return enqueue

    def _copy(self, dst: DeviceBuffer, src: DeviceBuffer) -> Step:
        """A step that copies ``src`` into ``dst`` on the stream (0 for success, like NCCL's calls)."""
        memcpy = cuda.cupy().cuda.runtime.memcpyAsync

        def copy(handle: int, stream: int, created: list) -> int:
            memcpy(dst.ptr, src.ptr, src.nbytes, _DEVICE_TO_DEVICE, stream)
            return 0

        return copy

    def _device(self, buffers: Sequence[DeviceBuffer], name: str) -> int:
        devices = {b.device for b in buffers}
        if len(devices) != 1:
            raise ValueError(f"{name}: every array must be on one CUDA device, got {sorted(devices)}")
        return devices.pop()

    def _reduced(self, name: str, op: Any, buf: DeviceBuffer, call: Callable[..., int]) -> Step:
        """A reduction step: ``call(handle, stream, count, datatype, nccl_op)`` for ``buf``'s
        elements, with a PREMUL_SUM op made for the call (the group destroys it)."""
        red = nccl_reduction(op, buf.dtype, name, self._nccl.version >= _NATIVE_FP8)
        count, nccl, factor = buf.size * red.width, self._nccl, red.factor
        if factor is None:
            return lambda handle, stream, created: call(handle, stream, count, red.datatype, red.op)

        def premul(handle: int, stream: int, created: list) -> int:
            created.append(nccl.premul_sum(factor, red.datatype, handle))
            return call(handle, stream, count, red.datatype, created[-1])

        return premul

    # ---- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op, async_op, user):
        nccl = self._nccl
        step = self._reduced("all_reduce", op, buf, lambda handle, stream, count, datatype, nccl_op: (
            nccl.ncclAllReduce(buf.ptr, buf.ptr, count, datatype, nccl_op, handle, stream)))
        return self._launch("all_reduce", self._connect(buf.device), buf, self._group([step], "ncclAllReduce"),
                            async_op, [user], buf)

    def broadcast(self, buf, root, async_op, user):
        nccl = self._nccl
        step = self._moving(lambda handle, stream: nccl.ncclBroadcast(
            buf.ptr, buf.ptr, buf.nbytes, BYTES, root, handle, stream))
        return self._launch("broadcast", self._connect(buf.device), buf, self._group([step], "ncclBroadcast"),
                            async_op, [user], buf)

    def reduce(self, buf, root, op, async_op, user):
        nccl = self._nccl
        step = self._reduced("reduce", op, buf, lambda handle, stream, count, datatype, nccl_op: (
            nccl.ncclReduce(buf.ptr, buf.ptr, count, datatype, nccl_op, root, handle, stream)))
        return self._launch("reduce", self._connect(buf.device), buf, self._group([step], "ncclReduce"),
                            async_op, [user], buf)

    @staticmethod
    def _moving(call: Callable[[int, int], int]) -> Step:
        """A step that moves bytes (no reduction, so no PREMUL_SUM op to make)."""
        return lambda handle, stream, created: call(handle, stream)

    def _staged(self, buf: DeviceBuffer) -> DeviceBuffer:
        """A fresh device buffer shaped like ``buf``."""
        cp = cuda.cupy()
        with cuda.device_guard(buf.device):
            staging = cp.empty(buf.nbytes, dtype=cp.uint8)
        return DeviceBuffer(staging.data.ptr, buf.size, buf.dtype, buf.shape, buf.device, staging, "cupy", True)

    def _unaliased(self, inp: DeviceBuffer, outs: Sequence[DeviceBuffer], in_place_ptr: int,
                   steps: list) -> DeviceBuffer:
        """``inp``, or a copy of it (queued in ``steps``) when it overlaps an output anywhere but
        at NCCL's in-place position ``in_place_ptr``."""
        if inp.ptr != in_place_ptr and any(_overlap(out, inp) for out in outs):
            staged = self._staged(inp)
            steps.append(self._copy(staged, inp))
            return staged
        return inp

    def allgather(self, out, inp, async_op, user):
        device = self._device([out, inp], "all_gather_into_tensor")
        steps: list[Step] = []
        send = self._unaliased(inp, [out], out.ptr + self._rank * inp.nbytes, steps)
        nccl = self._nccl
        steps.append(self._moving(lambda handle, stream: nccl.ncclAllGather(
            send.ptr, out.ptr, send.nbytes, BYTES, handle, stream)))
        return self._launch("all_gather_into_tensor", self._connect(device), out,
                            self._group(steps, "ncclAllGather"), async_op, [user], (out, inp, send))

    def allgather_list(self, outs, inp, async_op, user):
        span = _span(outs)
        if span is not None and not _overlap(span, inp):
            return self.allgather(span, inp, async_op, user)
        device = self._device([inp, *outs], "all_gather")
        nccl = self._nccl
        steps = [self._moving(partial(nccl.ncclBroadcast, inp.ptr, o.ptr, o.nbytes, BYTES, r))  # then (handle, stream)
                 for r, o in enumerate(outs)]
        return self._launch("all_gather", self._connect(device), inp, self._group(steps, "ncclBroadcast"),
                            async_op, user, (outs, inp))

    def _exchange(self, name: str, comm: Communicator, anchor: DeviceBuffer, sends: dict[int, DeviceBuffer],
                  recvs: dict[int, DeviceBuffer], async_op: bool, outputs: list, keep: Any,
                  steps: Sequence[Step] = ()) -> CUDAWork | None:
        """Launch one group: ``steps``, then ``sends[peer]`` to each peer and ``recvs[peer]`` from
        each; this rank's own block is a device copy.

        Only this rank can see that its own blocks differ in size, so that does not stop the
        launch (its peers would wait for it in NCCL): its blocks to and from the other ranks are
        exchanged, its own output block is left as it was, and ValueError is raised after."""
        nccl, me, steps, problem = self._nccl, self._rank, list(steps), ""
        if me in sends and me in recvs:
            own_in, own_out = sends.pop(me), recvs.pop(me)
            if own_in.nbytes == own_out.nbytes:
                steps.append(self._copy(own_out, own_in))
            else:
                problem = (f"{name}: the block this rank sends itself ({own_in.size} elements) must match the block "
                           f"it receives ({own_out.size}); the blocks to and from the other ranks were exchanged, "
                           "this rank's own output block was left as it was")
        steps += [self._transfer(nccl.ncclSend, buf, peer) for peer, buf in sends.items()]
        steps += [self._transfer(nccl.ncclRecv, buf, peer) for peer, buf in recvs.items()]
        work = self._launch(name, comm, anchor, self._group(steps, "ncclSend/ncclRecv"), async_op, outputs, keep)
        if problem:
            raise ValueError(problem)
        return work

    def _transfer(self, call: Callable[..., int], buf: DeviceBuffer, peer: int) -> Step:
        """A step that sends ``buf`` to ``peer`` (``call`` is ncclSend) or receives it (ncclRecv)."""
        return self._moving(lambda handle, stream: call(buf.ptr, buf.nbytes, BYTES, peer, handle, stream))

    def gather_list(self, outs, inp, root, async_op, user):
        device = self._device([inp, *(outs or ())], "gather")
        recvs = dict(enumerate(outs)) if self._rank == root else {}
        return self._exchange("gather", self._connect(device), inp, {root: inp}, recvs, async_op, user, (outs, inp))

    def scatter_list(self, out, inps, root, async_op, user):
        device = self._device([out, *(inps or ())], "scatter")
        sends = dict(enumerate(inps)) if self._rank == root else {}
        return self._exchange("scatter", self._connect(device), out, sends, {root: out}, async_op, [user],
                              (out, inps))

    def _reduce_scatter_steps(self, out: DeviceBuffer, send: DeviceBuffer, op: Any, steps: list) -> Enqueue:
        nccl = self._nccl
        steps.append(self._reduced("reduce_scatter", op, out, lambda handle, stream, count, datatype, nccl_op: (
            nccl.ncclReduceScatter(send.ptr, out.ptr, count, datatype, nccl_op, handle, stream))))
        return self._group(steps, "ncclReduceScatter")

    def reduce_scatter(self, out, inp, op, async_op, user):
        device = self._device([out, inp], "reduce_scatter_tensor")
        steps: list[Step] = []
        send = self._unaliased(inp, [out], out.ptr - self._rank * out.nbytes, steps)
        enqueue = self._reduce_scatter_steps(out, send, op, steps)
        return self._launch("reduce_scatter", self._connect(device), out, enqueue, async_op, [user], (out, inp, send))

    def reduce_scatter_list(self, out, inps, op, async_op, user):
        span = _span(inps)
        if span is not None and not _overlap(span, out):
            return self.reduce_scatter(out, span, op, async_op, user)
        device = self._device([out, *inps], "reduce_scatter")
        total = sum(i.size for i in inps)
        staging = self._staged(DeviceBuffer(0, total, out.dtype, (total,), device, None, "cupy", True))
        steps = [self._copy(block, i) for block, i in zip(self._blocks(staging, [i.size for i in inps]).values(), inps)]
        enqueue = self._reduce_scatter_steps(out, staging, op, steps)
        return self._launch("reduce_scatter", self._connect(device), out, enqueue, async_op, [user],
                            (out, inps, staging))

    def _blocks(self, buf: DeviceBuffer, counts: Sequence[int] | None) -> dict[int, DeviceBuffer]:
        """``buf`` cut into per-rank blocks of ``counts`` elements (equal blocks when None)."""
        if counts is None:
            counts = [buf.size // self._size] * self._size
        item = buf.dtype.itemsize
        return {r: DeviceBuffer(buf.ptr + offset * item, count, buf.dtype, (count,), buf.device, None, buf.kind,
                                True)
                for r, (count, offset) in enumerate(zip(counts, displacements(counts)))}

    def alltoall(self, out, inp, out_counts, in_counts, async_op, user):
        device = self._device([out, inp], "all_to_all_single")
        steps: list[Step] = []
        send = self._unaliased(inp, [out], -1, steps)
        return self._exchange("all_to_all_single", self._connect(device), out, self._blocks(send, in_counts),
                              self._blocks(out, out_counts), async_op, [user], (out, inp, send), steps)

    def alltoall_list(self, outs, inps, async_op, user):
        device = self._device([*outs, *inps], "all_to_all")
        steps: list[Step] = []
        sends = {r: self._unaliased(i, outs, -1, steps) for r, i in enumerate(inps)}
        return self._exchange("all_to_all", self._connect(device), outs[0], dict(sends), dict(enumerate(outs)),
                              async_op, user, (outs, inps, sends), steps)

    def _finish_queued(self) -> None:
        """Block the host until this rank's operations queued on the group's own communicators have
        finished (within the group's timeout; NCCL's asynchronous error ends the wait). A pending
        send or receive on a two-rank communicator is not waited for: torch's barrier does not wait
        for one either, and its peer may be about to enter this barrier before posting its match."""
        ours = {id(comm) for comm in self._comms.values()}
        for work in list(self._pending):
            if id(work._comm) in ours:
                work.block_host()

    def barrier(self, async_op):
        """The group's MPI barrier, with the same MPI calls as the CPU transport's (a blocking MPI
        collective never matches a nonblocking one), bounded like it under backend "hpc"; the
        group waits for its queued GPU work first (``_finish_queued``)."""
        if async_op:
            return Work([self._mpi.Ibarrier()], [])
        if self.finish_within is None:
            self._mpi.Barrier()
        else:
            request = self._mpi.Ibarrier()
            if not request.Test():
                self.finish_within(request, None)
        return None

    # ---- point-to-point -------------------------------------------------------------------
    def _refuse_self(self, peer: int, name: str) -> None:
        """ValueError for a lone send or receive to this rank itself: NCCL matches those only within
        one group (``batch_isend_irecv``), and alone the send would wait for a receive queued behind it."""
        if peer == self._rank:
            raise ValueError(f"{name}: the NCCL backend cannot {name} to or from this rank itself on its own; "
                             "pair the isend and irecv in one batch_isend_irecv")

    def send(self, buf, peer, tag, async_op, user):
        self._refuse_self(peer, "send")
        comm, rank = self._pair(buf.device, peer)
        return self._exchange("send", comm, buf, {rank: buf}, {}, async_op, [user], buf)

    def recv(self, buf, peer, tag, async_op, user):
        if peer is None:
            raise ValueError("the NCCL backend cannot receive from any source: pass src")
        self._refuse_self(peer, "recv")
        comm, rank = self._pair(buf.device, peer)
        work = self._exchange("recv", comm, buf, {}, {rank: buf}, async_op, [user], buf)
        return work if async_op else peer

    def batch_p2p(self, ops: Sequence[tuple[bool, DeviceBuffer, int, Any]]) -> list[CUDAWork]:
        """Every (is_send, buffer, peer, user) in one NCCL group, on the group's communicator
        (created by this call if needed: then every rank of the group must call it, as in torch)."""
        device = self._device([buf for _, buf, _, _ in ops], "batch_isend_irecv")
        nccl = self._nccl
        steps = [self._transfer(nccl.ncclSend if is_send else nccl.ncclRecv, buf, peer)
                 for is_send, buf, peer, _ in ops]
        work = self._launch("batch_isend_irecv", self._connect(device), ops[0][1],
                            self._group(steps, "ncclSend/ncclRecv"), True, [user for _, _, _, user in ops], ops)
        assert work is not None  # async_op=True: _launch hands back the Work
        return [work] * len(ops)

    # ---- health and lifetime --------------------------------------------------------------
    def _communicators(self) -> list[Communicator]:
        """The group's communicators, then its two-rank ones by (device, peer), which for every rank
        is the order of (device, lower rank, higher rank): the same order on every rank, so
        destroying them (an intra-node collective in NCCL) makes no cycle."""
        return [*(self._comms[d] for d in sorted(self._comms)), *(self._pairs[key] for key in sorted(self._pairs))]

    def _overdue(self, limit_s: float) -> CUDAWork | None:
        """The oldest GPU operation still running after ``limit_s`` seconds, if any (the watchdog
        thread calls it)."""
        for work in list(self._pending):
            if not work._passed():
                return work if work.age() > limit_s else None
        return None

    def _async_failure(self) -> str | None:
        """The first of this group's communicators that NCCL reports an asynchronous error for (a
        peer died, a network failed), described with the error; None while all are healthy."""
        for comm in self._communicators():
            error = comm.async_error(wait=False)  # the watchdog thread asks: never wait on the owner's lock
            if error is not None and comm.state == "live":
                return f"the NCCL communicator on cuda:{comm.device} of {comm.size} rank(s): {error}"
        return None

    def abort(self) -> None:
        """Abort every NCCL communicator of this group (operations in flight end with an error)."""
        errors: list[Exception] = []
        for comm in self._communicators():
            _collect(errors, comm.abort)
        if errors:
            raise DistBackendError("; ".join(map(str, errors)))

    def _finished(self, wait_s: float | None) -> bool:
        """Wait up to ``wait_s`` seconds (None: for ever) for this rank's operations; True if every
        one finished without a CUDA error."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        for work in self._pending:
            while not work._passed():
                if work._comm.async_error() is not None or (deadline is not None and time.monotonic() > deadline):
                    return False
                time.sleep(_CLOSE_POLL_S)
        return all(work._exception is None for work in self._pending)

    def close(self, wait_s: float | None = None, destroy: bool = True) -> None:
        """Free every communicator, after waiting up to ``wait_s`` seconds (by default the group's
        timeout) for this rank's operations. With ``destroy`` and every operation finished they
        are destroyed; otherwise aborted (local and immediate), and Works still running fail."""
        _open.pop(self, None)
        graceful = self._finished(self._timeout_s if wait_s is None else wait_s) and destroy
        errors: list[Exception] = []
        for comm in self._communicators():
            _collect(errors, comm.destroy if graceful else comm.abort)
        for work in self._pending:
            if not work._passed() and work._exception is None:
                work._exception = DistBackendError(f"{work.op_name} on cuda:{work._comm.device} had not finished "
                                                   "when its group was closed; its communicator was aborted")
            work._retire()
        self._comms.clear()
        self._pairs.clear()
        self._pending.clear()
        if errors:
            raise DistBackendError("; ".join(map(str, errors)))


_logger = logging.getLogger("hpc_c10d")  # the package's (diagnostics/logs.py adds the rank to its records)
_EXIT_WAIT_S = 10.0  # at interpreter exit, how long operations still queued get before NCCL is aborted
_CLOSE_POLL_S = 1e-3
_open: dict[NCCLBackend, None] = {}  # backends not closed yet, oldest first


def _close_at_exit() -> None:
    """Tear NCCL down before CUDA and MPI go away (NCCL's threads outliving CUDA's shutdown hang
    or crash the exit), warning as torch does when the program never destroyed its groups. Queued
    operations get a bounded wait first, so peers waiting on this rank's part still get it."""
    left = [backend for backend in reversed(_open) if backend._communicators()]  # subgroups first
    if not left:
        return
    _logger.warning("destroy_process_group() was not called before the program ended, which can leave GPU "
                   "operations unfinished and resources held: aborting the NCCL communicators of %d group(s) "
                   "now, after up to %g s for their queued operations. Call destroy_process_group() at the end "
                   "of the program.", len(left), _EXIT_WAIT_S)
    for backend in left:  # aborted, not destroyed: ncclCommDestroy waits for the node's other ranks
        try:
            backend.close(min(_EXIT_WAIT_S, backend._timeout_s or _EXIT_WAIT_S), destroy=False)
        except DistBackendError as exc:
            _logger.warning("closing NCCL at exit: %s", exc)


atexit.register(_close_at_exit)  # before MPI's finalisation, registered when MPI started
