"""``ProcessGroupHPC``: the process group torch gets for backend ``"hpc"``.

torch (and its C++ callers: DDP's reducer, functional collectives, DTensor) call the methods
below with lists of tensors and an options struct. Each unpacks them and enters hpc_c10d's
validating ``ProcessGroup`` methods, which adapt tensors to numpy views (bfloat16 included),
raise torch's errors before any communication and pick the transport by device. One case skips
that layer: an all-reduce of one contiguous CPU tensor with a plain op goes straight to mpi4py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C._distributed_c10d import (
    AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions, BarrierOptions,
    BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions, ScatterOptions,
)

from ..backend import BackendConfig
from ..process_group import ProcessGroup as _HPCGroup
from ..work import Work, combine_works
from ._ops import as_view, as_views, cpu_buffer, lean_reduction, to_hpc_op
from ._registration import BACKEND_NAME, devices
from ._rendezvous import close_stores
from ._work import TorchWork

__all__ = ["ProcessGroupHPC"]

_IN_PLACE = MPI.IN_PLACE
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


def _one(tensors: Sequence[Any], name: str) -> Any:
    if len(tensors) != 1:
        raise ValueError(f"{name}: backend 'hpc' takes one tensor per process, got {len(tensors)}")
    return tensors[0]


def _tensor(tensors: Sequence[Any], name: str) -> Any:
    """The one tensor of a per-process list, as a numpy view where possible."""
    return as_view(_one(tensors, name))


def _list(lists: Sequence[Any], name: str) -> Any:
    """The one list of a per-process list of lists, as numpy views where possible."""
    return as_views(_one(lists, name))


def _root_tensor(opts: Any, name: str) -> int:
    if opts.rootTensor != 0:
        raise ValueError(f"{name}: rootTensor must be 0 (one tensor per process), got {opts.rootTensor}")
    return opts.rootRank


class ProcessGroupHPC(dist.ProcessGroup):
    """A torch process group whose collectives run on an MPI communicator through hpc_c10d."""

    def __init__(self, comm: Any, global_ranks: Sequence[int], group_name: str, timeout: timedelta) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        ranks = list(global_ranks) or list(range(comm.Get_size()))
        self._comm = comm
        self._inner = _HPCGroup(comm, ranks, group_name, device_config(), BACKEND_NAME, timeout)
        self._is_world = not global_ranks

    # ---- identity (torch's functional collectives look groups up by name) ----------------------
    def name(self) -> str:
        """Return the backend name, ``"hpc"``."""
        return BACKEND_NAME

    _get_backend_name = name

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
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = _ALLREDUCE) -> TorchWork:
        """All-reduce one tensor in place."""
        if len(tensors) == 1:
            tensor = tensors[0]
            red = lean_reduction(opts.reduceOp, tensor.dtype)
            if red is not None and tensor.is_cpu and tensor.is_contiguous():
                recv = (cpu_buffer(tensor), red.datatype)
                if opts.asyncOp:
                    request = self._comm.Iallreduce(_IN_PLACE, recv, red.op)
                    return TorchWork(Work([request], tensors, None, tensor), tensors)
                self._comm.Allreduce(_IN_PLACE, recv, red.op)
                return TorchWork(None, tensors)
        work = self._inner._all_reduce(_tensor(tensors, "allreduce"), to_hpc_op(opts.reduceOp), opts.asyncOp)
        return TorchWork(work, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = _ALLREDUCE_COALESCED) -> TorchWork:
        """All-reduce each tensor in place."""
        op = to_hpc_op(opts.reduceOp)
        return self._coalesced([self._inner._all_reduce(as_view(t), op, True) for t in tensors], tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = _BROADCAST) -> TorchWork:
        """Broadcast one tensor from group rank ``opts.rootRank``."""
        root = _root_tensor(opts, "broadcast")
        work = self._inner._broadcast(_tensor(tensors, "broadcast"), root, opts.asyncOp)
        return TorchWork(work, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = _REDUCE) -> TorchWork:
        """Reduce one tensor onto group rank ``opts.rootRank``."""
        root = _root_tensor(opts, "reduce")
        work = self._inner._reduce(_tensor(tensors, "reduce"), root, to_hpc_op(opts.reduceOp), opts.asyncOp)
        return TorchWork(work, tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = _ALLGATHER) -> TorchWork:
        """Gather every rank's tensor into a list on every rank."""
        outputs = _list(output_tensors, "allgather")
        work = self._inner._all_gather(outputs, _tensor(input_tensors, "allgather"), opts.asyncOp)
        return TorchWork(work, output_tensors)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                            opts: Any = _ALLGATHER) -> TorchWork:
        """``allgather`` of each input tensor into its own output list."""
        pairs = self._pairs(output_lists, input_tensors, "allgather_coalesced")
        works = [self._inner._all_gather(as_views(o), as_view(i), True) for o, i in pairs]
        return self._coalesced(works, output_lists, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = _ALLGATHER) -> TorchWork:
        """Gather every rank's tensor into one output tensor (input may be this rank's block of it)."""
        work = self._inner._all_gather_into_tensor(as_view(output), as_view(input), opts.asyncOp)
        return TorchWork(work, [output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = _ALLGATHER) -> TorchWork:
        """``_allgather_base`` for each (output, input) pair."""
        pairs = self._pairs(outputs, inputs, "allgather_into_tensor_coalesced")
        works = [self._inner._all_gather_into_tensor(as_view(o), as_view(i), True) for o, i in pairs]
        return self._coalesced(works, outputs, opts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = _GATHER) -> TorchWork:
        """Gather every rank's tensor into a list on group rank ``opts.rootRank``."""
        outputs = _list(output_tensors, "gather") if output_tensors else None
        work = self._inner._gather(_tensor(input_tensors, "gather"), outputs, opts.rootRank, opts.asyncOp)
        return TorchWork(work, output_tensors)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = _SCATTER) -> TorchWork:
        """Scatter a list from group rank ``opts.rootRank``, one tensor per rank."""
        inputs = _list(input_tensors, "scatter") if input_tensors else None
        work = self._inner._scatter(_tensor(output_tensors, "scatter"), inputs, opts.rootRank, opts.asyncOp)
        return TorchWork(work, output_tensors)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = _REDUCE_SCATTER) -> TorchWork:
        """Reduce a list of tensors, one per rank, and give each rank its own."""
        output = _tensor(output_tensors, "reduce_scatter")
        work = self._inner._reduce_scatter(output, _list(input_tensors, "reduce_scatter"),
                                           to_hpc_op(opts.reduceOp), opts.asyncOp)
        return TorchWork(work, output_tensors)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = _REDUCE_SCATTER) -> TorchWork:
        """Reduce one tensor over the group and give each rank its block."""
        work = self._inner._reduce_scatter_tensor(as_view(output), as_view(input), to_hpc_op(opts.reduceOp),
                                                  opts.asyncOp)
        return TorchWork(work, [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = _REDUCE_SCATTER) -> TorchWork:
        """``_reduce_scatter_base`` for each (output, input) pair."""
        op = to_hpc_op(opts.reduceOp)
        pairs = self._pairs(outputs, inputs, "reduce_scatter_tensor_coalesced")
        works = [self._inner._reduce_scatter_tensor(as_view(o), as_view(i), op, True) for o, i in pairs]
        return self._coalesced(works, outputs, opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = _ALLTOALL) -> TorchWork:
        """Exchange blocks of one tensor (split along dim 0) with every rank."""
        work = self._inner._all_to_all_single(as_view(output), as_view(input), output_split_sizes, input_split_sizes,
                                              opts.asyncOp)
        return TorchWork(work, [output])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = _ALLTOALL) -> TorchWork:
        """Send ``input_tensors[i]`` to rank i and receive ``output_tensors[i]`` from it."""
        work = self._inner._all_to_all(as_views(output_tensors), as_views(input_tensors), opts.asyncOp)
        return TorchWork(work, output_tensors)

    def barrier(self, opts: Any = _BARRIER) -> TorchWork:
        """Wait until every rank of the group arrives."""
        return TorchWork(self._inner._barrier(opts.asyncOp), [])

    # ---- point to point (always nonblocking, as torch's backends are) -------------------------
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> TorchWork:  # noqa: N803 - torch's names
        """Start sending one tensor to group rank ``dstRank``."""
        return TorchWork(self._inner._send(_tensor(tensors, "send"), dstRank, tag, True), tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> TorchWork:  # noqa: N803
        """Start receiving one tensor from group rank ``srcRank``."""
        return TorchWork(self._inner._recv(_tensor(tensors, "recv"), srcRank, tag, True), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> TorchWork:
        """Start receiving one tensor from whichever rank sends first (``_source_rank()`` says which)."""
        return TorchWork(self._inner._recv(_tensor(tensors, "recv"), None, tag, True), tensors)

    # ---- lifetime --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Free the group's communicator, and for the default group the rendezvous store
        (``destroy_process_group`` calls this)."""
        if self._inner._comm is not None:
            self._inner._destroy()
            if self._is_world:
                close_stores()

    abort = shutdown

    # ---- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _pairs(outputs: list, inputs: list, name: str) -> list:
        if len(outputs) != len(inputs):
            raise ValueError(f"{name}: {len(outputs)} outputs for {len(inputs)} inputs")
        return list(zip(outputs, inputs))

    @staticmethod
    def _coalesced(works: list, outputs: list, opts: Any) -> TorchWork:
        work = combine_works(works, outputs)
        if not opts.asyncOp:
            work.wait()
            return TorchWork(None, outputs)
        return TorchWork(work, outputs)

