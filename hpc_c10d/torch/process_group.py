"""``ProcessGroupHPC``: what torch gets for backend ``"hpc"``.

A per-device ``Backend`` in torch's own ``ProcessGroup`` from torch 2.14, a ``ProcessGroup``
subclass before. Each method unpacks torch's tensor lists and options and enters hpc_c10d's
validating ``ProcessGroup`` methods (the numpy API's own path) on numpy views of the tensors; a
blocking CPU call waits there, at most its timeout (``_finish_within``). Design:
docs/architecture.md, "torch.distributed backend plugin".
"""

from __future__ import annotations

import functools
import time
import weakref
from datetime import timedelta
from functools import partial
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions, BarrierOptions,
    BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions, ScatterOptions,
)
from torch._C._distributed_c10d import Backend as _TorchBackend  # Python may subclass it from 2.14

from ..backend import BackendConfig
from ..diagnostics import flight_recorder
from ..errors import ProcessFailedError as _ProcessFailedError
from ..lifecycle import adopt, disown, instrument
from ..pg_methods import one_tensor
from ..process_group import ProcessGroup as _HPCGroup
from ..shrink import drop
from ..work import Work, combine_works, spin
from .devices import BACKEND_NAME, devices
from .ops import PLAIN_OPS, as_view, as_views, to_hpc_op
from .rendezvous import close_stores
from .sparse import all_reduce_sparse
from .torch_nccl import TorchNCCL, bfloat16_premul_as_sum, torch_nccl
from .version import has_shrink_helpers, python_backends
from .work import TorchWork, wait_within

__all__ = ["ProcessGroupHPC", "ProcessFailedError", "PER_DEVICE_BACKEND", "hpc_backend"]


#: True where "hpc" is a per-device ``Backend`` in torch's own ``ProcessGroup`` (torch >= 2.14),
#: False where it is a ``ProcessGroup`` subclass that torch uses as the whole group.
PER_DEVICE_BACKEND = python_backends()
_Base: Any = _TorchBackend if PER_DEVICE_BACKEND else dist.ProcessGroup


class ProcessFailedError(_ProcessFailedError, dist.DistBackendError):
    """hpc_c10d's ProcessFailedError as torch's DistBackendError, for backend "hpc"."""

_P2P_NAMES = ("send", "recv")
_NO_TIME = timedelta(0)  # torch's options carry -1 ms for "the group's timeout"
_SUM = dist.ReduceOp.RedOpType.SUM
# Defaults for callers that pass no options; never mutated here.
_ALLREDUCE = AllreduceOptions()
_ALLREDUCE_COALESCED = AllreduceCoalescedOptions()
_BROADCAST = BroadcastOptions()
_REDUCE = ReduceOptions()
_ALLGATHER = AllgatherOptions()
_GATHER = GatherOptions()
_SCATTER = ScatterOptions()
_REDUCE_SCATTER = ReduceScatterOptions()
_ALLTOALL = AllToAllOptions()
_BARRIER = BarrierOptions()


def device_config() -> BackendConfig:
    """The per-device transports: MPI for CPU tensors, hpc_c10d's NCCL transport for CUDA ones
    when it is installed (without it, a CUDA tensor gets hpc_c10d's 'no backend for cuda' error)."""
    return BackendConfig(",".join(f"{d}:{'mpi' if d == 'cpu' else 'nccl'}" for d in devices()))


def _tensor(tensors: Sequence[Any], name: str) -> Any:
    """The one tensor of a per-process list, as a numpy view where possible."""
    return as_view(one_tensor(tensors, name))


def _list(lists: Sequence[Any], name: str) -> Any:
    """The one list of a per-process list of lists, as numpy views where possible."""
    return as_views(one_tensor(lists, name))


def _on_cuda(pick: Callable[[tuple], Any],
             premul: tuple[int, int, bool] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Send a method's calls on CUDA tensors to torch's ProcessGroupNCCL, where the group has one
    (its method of the same name); ``pick`` finds the tensor whose device decides. A reduction
    names in ``premul`` where its options and inputs are, and whether it reduces in place
    (``bfloat16_premul_as_sum``)."""
    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        name = method.__name__

        @functools.wraps(method)
        def forwarding(self: ProcessGroupHPC, *args: Any, **kwargs: Any) -> Any:
            cuda = self._cuda
            if cuda is not None:
                tensor = pick(args)
                if tensor.is_cuda:
                    return self._on_torch_nccl(cuda, name, tensor, args, kwargs, premul)
            return method(self, *args, **kwargs)

        return forwarding
    return decorate


_first = _on_cuda(lambda args: args[0][0])  # the first tensor of the first list
_second = _on_cuda(lambda args: args[1][0])  # the first input tensor, after the outputs
_output = _on_cuda(lambda args: args[0])  # one output tensor
_reduced_in_place = _on_cuda(lambda args: args[0][0], premul=(1, 0, True))  # (tensors, opts)
_reduce_scattered = _on_cuda(lambda args: args[0][0], premul=(2, 1, False))  # (outputs, input lists, opts)
_reduce_scattered_base = _on_cuda(lambda args: args[0], premul=(2, 1, False))  # (output, input, opts)


def _root_tensor(opts: Any, name: str) -> int:
    if opts.rootTensor != 0:
        raise ValueError(f"{name}: rootTensor must be 0 (one tensor per process), got {opts.rootTensor}")
    return opts.rootRank


class _HeldByTorch(_HPCGroup):
    """hpc_c10d's group behind a per-device "hpc" Backend. torch's own ProcessGroup holds the
    group's description, given after the backend is made, so it is read from there."""

    _torch_group: Any = None  # a weak reference to that ProcessGroup, once known

    @property
    def _desc(self) -> str:
        group = self._torch_group() if self._torch_group is not None else None
        return group.group_desc if group is not None else self._given_desc

    @_desc.setter
    def _desc(self, desc: str) -> None:
        self._given_desc = desc


_Group = _HeldByTorch if PER_DEVICE_BACKEND else _HPCGroup


class ProcessGroupHPC(_Base):
    """torch's backend "hpc": collectives on an MPI communicator through hpc_c10d (a per-device
    ``Backend`` on torch >= 2.14, else a ``ProcessGroup``; ``hpc_backend(group)`` finds it)."""

    def __init__(self, comm: Any, global_ranks: Sequence[int], group_name: str, timeout: timedelta,
                 store: Any = None) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        ranks = list(global_ranks) or list(range(comm.Get_size()))
        self._comm = comm
        self._opts: Any = _BARRIER  # the options of the latest call (a blocking one's timeout is read from them)
        self._inner = _Group(comm, ranks, group_name, device_config(), BACKEND_NAME, timeout,
                             finish_within=self._finish_within)
        self._inner._process_failed_error = ProcessFailedError  # type: ignore[attr-defined]
        self._inner._backend_error = dist.DistBackendError  # type: ignore[attr-defined]
        self._is_world = not global_ranks
        adopt(self._inner, self._is_world)  # the watchdog, the dumps and the refusal notices see the group
        instrument(self._inner, detail=dist.get_debug_level() == dist.DebugLevel.DETAIL,
                   mismatch=dist.DistBackendError)
        self._finished = TorchWork(None, [])  # see _finished_work
        # CUDA tensors: torch's own ProcessGroupNCCL over the group's MPI store, else hpc_c10d's transport
        self._cuda = torch_nccl(store, comm.Get_rank(), comm.Get_size(), global_ranks, group_name, timeout)
        self._inner._gpu_watch = self._cuda

    @property
    def cuda_path(self) -> str:
        """Where the group's CUDA tensors go: ``"nccl"`` (torch's ProcessGroupNCCL) or ``"hpc"``
        (hpc_c10d's NCCL transport)."""
        return "hpc" if self._cuda is None else "nccl"

    # ---- identity (torch's functional collectives look groups up by name) ----------------------
    def name(self) -> str:
        """Return the backend name, ``"hpc"``."""
        return BACKEND_NAME

    _get_backend_name = name
    getBackendName = name  # noqa: N815 - what torch's C++ side (DDP's logger) asks a Python group

    # ---- the per-device backend torch's Python code asks for (this group serves every device) --
    supports_splitting = supports_coalescing = supports_time_estimate = False

    @property
    def supports_shrinking(self) -> bool:
        """True where the plugin serves torch's ``shrink_group`` (torch/shrink.py)."""
        return has_shrink_helpers()

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device(d) for d in devices()]

    def _get_backend(self, device: torch.device) -> ProcessGroupHPC:
        """This group itself for a device type it serves; torch's error for any other."""
        kind = torch.device(device).type
        if kind not in devices():
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    def _held_by(self, group: Any) -> ProcessGroupHPC:
        """Note torch's ProcessGroup that holds this backend (torch >= 2.14), which describes the
        group, and return the backend."""
        cast(_HeldByTorch, self._inner)._torch_group = weakref.ref(group)
        return self

    def set_timeout(self, timeout: timedelta) -> None:
        """Make ``timeout`` the group's default for later operations (torch >= 2.14's
        ``dist.set_timeout``; before, torch's ``_set_pg_timeout`` serves gloo and NCCL alone)."""
        self._inner._timeout = timeout

    _set_default_timeout = set_timeout

    group_name = property(lambda self: self._inner.group_name, doc="The name torch registered the group under.")
    group_desc = property(lambda self: self._inner.group_desc, doc="torch's description of the group.")

    def _set_group_name(self, name: str) -> None:
        self._inner._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._inner._desc = desc

    @property
    def comm(self) -> Any:
        """The group's mpi4py communicator."""
        return self._comm

    def __repr__(self) -> str:
        return f"<ProcessGroupHPC {self.group_name!r} rank {self.rank()}/{self.size()}>"

    # ---- collectives -----------------------------------------------------------------------
    @_reduced_in_place
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = _ALLREDUCE) -> TorchWork:
        """All-reduce one tensor in place."""
        tensor = as_view(tensors[0]) if len(tensors) == 1 else _tensor(tensors, "allreduce")  # _tensor, inlined
        if type(tensor) is not np.ndarray and tensor.is_sparse:
            return self._all_reduce_sparse(tensor, opts)
        op = opts.reduceOp
        kind = PLAIN_OPS.get(hash(op))  # to_hpc_op's table, read here: a call costs ~0.1 us
        self._opts = opts  # _issued and _finished_work, inlined: the hot path
        work = self._inner._all_reduce(tensor, to_hpc_op(op) if kind is None else kind, opts.asyncOp)
        if work is not None:
            return self._pending(work, tensors, opts, "all_reduce")
        finished = self._finished
        finished._outputs = tensors
        return finished

    def _all_reduce_sparse(self, tensor: torch.Tensor, opts: Any) -> TorchWork:
        if opts.reduceOp.op != _SUM:
            raise RuntimeError(f"allreduce of a sparse tensor supports ReduceOp.SUM only, got {opts.reduceOp.op}")
        all_reduce_sparse(self._comm, tensor, self._limit(opts), f"allreduce (sparse) in group {self.group_name!r}")
        return TorchWork(None, [tensor])

    @_first
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = _ALLREDUCE_COALESCED) -> TorchWork:
        """All-reduce each tensor in place."""
        op = to_hpc_op(opts.reduceOp)
        works = [self._inner._all_reduce(as_view(t), op, True) for t in tensors]
        return self._coalesced(works, tensors, opts, "allreduce_coalesced")

    @_first
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = _BROADCAST) -> TorchWork:
        """Broadcast one tensor from group rank ``opts.rootRank``."""
        return self._issued(opts, tensors, self._inner._broadcast, _tensor(tensors, "broadcast"),
                            _root_tensor(opts, "broadcast"))

    @_reduced_in_place
    def reduce(self, tensors: list[torch.Tensor], opts: Any = _REDUCE) -> TorchWork:
        """Reduce one tensor onto group rank ``opts.rootRank``."""
        return self._issued(opts, tensors, self._inner._reduce, _tensor(tensors, "reduce"),
                            _root_tensor(opts, "reduce"), to_hpc_op(opts.reduceOp))

    @_second
    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = _ALLGATHER) -> TorchWork:
        """Gather every rank's tensor into a list on every rank."""
        return self._issued(opts, output_tensors, self._inner._all_gather, _list(output_tensors, "allgather"),
                            _tensor(input_tensors, "allgather"))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                            opts: Any = _ALLGATHER) -> TorchWork:
        """Gather input j of every rank r into ``output_lists[r][j]``."""
        work = self._inner.allgather_coalesced([as_views(outs) for outs in output_lists], as_views(input_tensors))
        return self._started(work, output_lists, opts, "allgather_coalesced")

    @_output
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = _ALLGATHER) -> TorchWork:
        """Gather every rank's tensor into one output tensor (input may be this rank's block of it)."""
        return self._issued(opts, [output], self._inner._all_gather_into_tensor, as_view(output), as_view(input))

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = _ALLGATHER) -> TorchWork:
        """``_allgather_base`` for each (output, input) pair."""
        pairs = self._pairs(outputs, inputs, "allgather_into_tensor_coalesced")
        if self._cuda is not None and pairs and pairs[0][0].is_cuda:
            return self._together_on_cuda([("_allgather_base", (o, i, opts)) for o, i in pairs], pairs[0][0])
        works = [self._inner._all_gather_into_tensor(as_view(o), as_view(i), True) for o, i in pairs]
        return self._coalesced(works, outputs, opts, "allgather_into_tensor_coalesced")

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @_second
    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = _GATHER) -> TorchWork:
        """Gather every rank's tensor into a list on group rank ``opts.rootRank``."""
        outputs = _list(output_tensors, "gather") if output_tensors else None
        return self._issued(opts, output_tensors, self._inner._gather, _tensor(input_tensors, "gather"), outputs,
                            opts.rootRank)

    @_first
    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = _SCATTER) -> TorchWork:
        """Scatter a list from group rank ``opts.rootRank``, one tensor per rank."""
        inputs = _list(input_tensors, "scatter") if input_tensors else None
        return self._issued(opts, output_tensors, self._inner._scatter, _tensor(output_tensors, "scatter"), inputs,
                            opts.rootRank)

    @_reduce_scattered
    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = _REDUCE_SCATTER) -> TorchWork:
        """Reduce a list of tensors, one per rank, and give each rank its own."""
        output = _tensor(output_tensors, "reduce_scatter")
        return self._issued(opts, output_tensors, self._inner._reduce_scatter, output,
                            _list(input_tensors, "reduce_scatter"), to_hpc_op(opts.reduceOp))

    @_reduce_scattered_base
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = _REDUCE_SCATTER) -> TorchWork:
        """Reduce one tensor over the group and give each rank its block."""
        return self._issued(opts, [output], self._inner._reduce_scatter_tensor, as_view(output), as_view(input),
                            to_hpc_op(opts.reduceOp))

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = _REDUCE_SCATTER) -> TorchWork:
        """``_reduce_scatter_base`` for each (output, input) pair."""
        op = to_hpc_op(opts.reduceOp)
        pairs = self._pairs(outputs, inputs, "reduce_scatter_tensor_coalesced")
        if self._cuda is not None and pairs and pairs[0][0].is_cuda:
            return self._together_on_cuda([("_reduce_scatter_base", (o, i, opts)) for o, i in pairs], pairs[0][0])
        works = [self._inner._reduce_scatter_tensor(as_view(o), as_view(i), op, True) for o, i in pairs]
        return self._coalesced(works, outputs, opts, "reduce_scatter_tensor_coalesced")

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @_output
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = _ALLTOALL) -> TorchWork:
        """Exchange blocks of one tensor (split along dim 0) with every rank."""
        return self._issued(opts, [output], self._inner._all_to_all_single, as_view(output), as_view(input),
                            output_split_sizes, input_split_sizes)

    all_to_all_single = alltoall_base

    @_first
    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = _ALLTOALL) -> TorchWork:
        """Send ``input_tensors[i]`` to rank i and receive ``output_tensors[i]`` from it."""
        return self._issued(opts, output_tensors, self._inner._all_to_all, as_views(output_tensors),
                            as_views(input_tensors))

    def barrier(self, opts: Any = _BARRIER) -> TorchWork:
        """Wait until every rank of the group arrives (after the group's CUDA operations, where
        torch's NCCL ran any: its barrier, as on backend "nccl")."""
        cuda = self._cuda
        if cuda is not None and cuda.used:
            return cuda.backend.barrier(opts)
        return self._issued(opts, [], self._inner._barrier)

    # ---- point to point (always nonblocking, as torch's backends are) -------------------------
    @_first
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> TorchWork:  # noqa: N803 - torch's names
        """Start sending one tensor to group rank ``dstRank``."""
        return self._p2p(self._inner._send(_tensor(tensors, "send"), dstRank, tag, True), tensors)

    @_first
    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> TorchWork:  # noqa: N803
        """Start receiving one tensor from group rank ``srcRank``."""
        return self._p2p(self._inner._recv(_tensor(tensors, "recv"), srcRank, tag, True), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> TorchWork:
        """Start receiving one tensor from whichever rank sends first (``_source_rank()`` says which)."""
        return self._p2p(self._inner._recv(_tensor(tensors, "recv"), None, tag, True), tensors)

    def batch_p2p(self, ops: list[tuple[bool, torch.Tensor, int, int]]) -> list[TorchWork]:
        """Start every (is_send, tensor, group peer, tag) together: on CUDA tensors one NCCL group,
        so a ring of sends and receives cannot wait on itself (torch's ``batch_isend_irecv``)."""
        if self._cuda is not None and ops and ops[0][1].is_cuda:
            calls = [("send" if is_send else "recv", ([t], peer, tag)) for is_send, t, peer, tag in ops]
            return [self._together_on_cuda(calls, ops[0][1])] * len(ops)
        works = self._inner._batch_p2p([(is_send, as_view(t), peer, tag) for is_send, t, peer, tag in ops])
        return [self._p2p(work, [t]) for work, (_, t, _, _) in zip(works, ops)]

    # ---- lifetime --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Free the group's communicator, and for the default group the rendezvous store
        (``destroy_process_group`` calls this)."""
        if self._inner._comm is not None:
            if self._cuda is not None:
                self._cuda.shutdown()
            disown(self._inner)
            self._inner._destroy()
            if self._is_world:
                close_stores()

    abort = shutdown

    def _leave(self) -> None:
        """Drop the group without communicating on it (``shrink_group``: it may hold dead ranks)."""
        if self._inner._comm is not None:
            if self._cuda is not None:
                self._cuda.abort()
            disown(self._inner)
            drop(self._inner)

    # ---- helpers ---------------------------------------------------------------------------
    def _on_torch_nccl(self, cuda: TorchNCCL, name: str, tensor: torch.Tensor, args: tuple, kwargs: dict,
                       premul: tuple[int, int, bool] | None) -> Any:
        """Call torch's NCCL's method ``name`` (a bfloat16 PREMUL_SUM as SUM of scaled inputs,
        which torch 2.11's gets wrong) and return its work."""
        call = getattr(cuda.backend, name)
        rewritten = None if premul is None else bfloat16_premul_as_sum(args, *premul)
        if rewritten is None:
            return self._forwarded(cuda, name, tensor, call(*args, **kwargs))
        scaled, opts, op = rewritten
        try:
            return self._forwarded(cuda, name, tensor, call(*scaled, **kwargs))
        finally:
            opts.reduceOp = op

    def _forwarded(self, cuda: TorchNCCL, name: str, tensor: torch.Tensor, work: Any) -> Any:
        """Note an operation handed to torch's NCCL, and return its ``work``: the group's count of
        operations (dumps compare ranks by it) goes up, and the watchdog sees it as the latest."""
        if name in _P2P_NAMES:
            self._inner._p2p_seq += 1
        else:
            self._inner._seq += 1
        cuda.latest = (work, name, time.monotonic(), tensor.get_device())
        cuda.used = True
        return work

    def _together_on_cuda(self, calls: list[tuple[str, tuple]], tensor: torch.Tensor) -> Any:
        """Run ``calls`` (method name, arguments) of torch's NCCL as one coalesced group (one
        NCCL group call), and return its one work."""
        cuda = cast(TorchNCCL, self._cuda)
        backend = cuda.backend
        backend._start_coalescing()
        for name, args in calls:
            getattr(backend, name)(*args)
        return self._forwarded(cuda, calls[0][0], tensor, backend._end_coalescing())

    @staticmethod
    def _pairs(outputs: list, inputs: list, name: str) -> list:
        if len(outputs) != len(inputs):
            raise ValueError(f"{name}: {len(outputs)} outputs for {len(inputs)} inputs")
        return list(zip(outputs, inputs))

    def _p2p(self, work: Work, tensors: list) -> TorchWork:
        return TorchWork(work, tensors, self._group_timeout if work._mpi_requests else None)

    def _group_timeout(self) -> timedelta:
        return self._inner._timeout

    def _coalesced(self, works: list, outputs: list, opts: Any, name: str) -> TorchWork:
        return self._started(combine_works(works, outputs), outputs, opts, name)

    def _limit(self, opts: Any) -> timedelta:
        """How long a CPU operation may wait: the options' timeout, else the group's."""
        return opts.timeout if opts.timeout >= _NO_TIME else self._inner._timeout

    def _issued(self, opts: Any, outputs: list, operation: Callable[..., Any], *args: Any) -> TorchWork:
        """Run one of the shared group's operations, blocking or not as ``opts`` say, and return torch's handle.

        A blocking CPU call waits inside the operation (``_finish_within``); a blocking GPU call
        orders the caller's stream after it, without a host wait, as torch's NCCL does.
        """
        self._opts = opts
        work = operation(*args, opts.asyncOp)
        if work is None:
            return self._finished_work(outputs)
        return self._pending(work, outputs, opts, operation.__name__.lstrip("_"))

    def _pending(self, work: Work, outputs: list, opts: Any, op: str) -> TorchWork:
        """torch's handle for an operation started nonblocking (its wait bounded by the options' or
        the group's timeout on MPI; GPU work orders the caller's stream)."""
        if not work._mpi_requests:
            return TorchWork(work, outputs)
        return TorchWork(work, outputs, partial(self._limit, opts),
                         partial(self._describe, op, self._inner._seq, outputs))

    def _describe(self, op: str, seq: int, outputs: list) -> str:
        """The operation as the flight recorder says it (``all_reduce seq 3 of group 0 float32[4]``),
        with the first output's dtype and shape."""
        first = outputs[0] if outputs else None
        first = first[0] if isinstance(first, list) and first else first
        shape, dtype = (list(first.shape), str(first.dtype).removeprefix("torch.")) if isinstance(
            first, torch.Tensor) else (None, None)
        return flight_recorder.InFlight(0, op, self._inner._name, None, None, seq, shape, dtype).describe()

    def _finish_within(self, request: Any, keep: Any = None) -> None:
        """The CPU transport's wait for a blocking call's request: at most the call's timeout (the
        options', else the group's), then torch's DistBackendError naming the operation, as gloo;
        sooner where another rank refused the call (the refusal notices)."""
        if request.Test() or spin(request.Test):
            return
        flight = flight_recorder.current()  # this thread is inside the group's operation
        wait_within(Work([request], keep=keep, watch=self._inner._watch), self._limit(self._opts),
                    flight.describe() if flight is not None else "operation")

    def _started(self, work: Work, outputs: list, opts: Any, name: str) -> TorchWork:
        """torch's handle for coalesced operations, all started nonblocking.

        On MPI (CPU tensors) a blocking call waits here, at most the options' timeout or else the
        group's, then raises DistBackendError ("Timed out"), as torch's gloo does; the group may be
        unusable after. On the GPU a blocking call orders the caller's stream after the operations,
        without a host wait, as torch's NCCL does. The timeout is read only for a wait that
        outlasts a short spin (reading it costs ~1 us).
        """
        if opts.asyncOp:
            return self._pending(work, outputs, opts, name)
        if not work._mpi_requests:
            work.wait()
        elif not work._spin():
            self._wait_bounded(work, opts, name)
        return self._finished_work(outputs)

    def _finished_work(self, outputs: list) -> TorchWork:
        """The handle of a blocking call, which has finished: one per group, reused, since making
        one costs ~0.7 us and torch only waits on it (``result()`` is the latest call's outputs)."""
        finished = self._finished
        finished._outputs = outputs
        return finished

    def _wait_bounded(self, work: Work, opts: Any, name: str) -> None:
        """Wait for MPI ``work`` that a spin did not see finish, at most its timeout."""
        wait_within(work, self._limit(opts), f"{name} in group {self.group_name!r}")


def hpc_backend(group: Any = None) -> ProcessGroupHPC:
    """The ``ProcessGroupHPC`` behind a torch process group (default: the default group): the
    group itself before torch 2.14, from 2.14 on its backend for the first device "hpc" serves
    there. ValueError for a group without one."""
    import torch.distributed.distributed_c10d as c10d

    target = c10d._get_default_group() if group is None else group
    if isinstance(target, ProcessGroupHPC):
        return target
    for device in target._device_types:
        backend = target._get_backend(device)
        if isinstance(backend, ProcessGroupHPC):
            return backend
    raise ValueError(f"{target!r} has no backend {BACKEND_NAME!r}")
