"""torch's ``ProcessGroup`` method API (``pg.allreduce([t], opts)`` ...) over the validated ops.

Each method accepts torch's overloads (a one-element list or a bare array; an options struct or
the plain op/root arguments) and always returns a ``Work``, as torch's methods do.
"""

from __future__ import annotations

from typing import Any, Callable

from .options import (
    AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions,
    BarrierOptions, BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions,
    ScatterOptions,
)
from .reduce_op import ReduceOp, RedOpType
from .work import Work, combine_works

__all__ = ["TorchProcessGroupAPI", "one_tensor"]


def one_tensor(arrays: Any, name: str) -> Any:
    """Unwrap torch's one-tensor-per-device list (a bare array passes): one device per process."""
    if isinstance(arrays, (list, tuple)):
        if len(arrays) != 1:
            raise ValueError(f"`{name}` must hold exactly one tensor per process (one device each), got {len(arrays)}")
        return arrays[0]
    return arrays


def _options(opts: Any, cls: type, **plain: Any) -> Any:
    if isinstance(opts, cls):
        return opts
    if opts is not None and not isinstance(opts, (RedOpType, ReduceOp)):
        raise TypeError(f"expected {cls.__name__} or a ReduceOp, got {type(opts).__name__}")
    made = cls()
    if opts is not None:
        made.reduceOp = opts
    for field, value in plain.items():
        if value is not None:
            setattr(made, field, value)
    return made


class TorchProcessGroupAPI:
    """Mixin for ``ProcessGroup``: the method names and overloads of torch's ProcessGroup."""

    _rank: int
    # The validated operations ProcessGroup defines, each called here with async_op=True.
    _broadcast: Callable[..., Work]
    _all_reduce: Callable[..., Work]
    _reduce: Callable[..., Work]
    _all_gather: Callable[..., Work]
    _all_gather_into_tensor: Callable[..., Work]
    _gather: Callable[..., Work]
    _gather_single: Callable[..., Work]
    _scatter: Callable[..., Work]
    _reduce_scatter: Callable[..., Work]
    _reduce_scatter_tensor: Callable[..., Work]
    _all_to_all_single: Callable[..., Work]
    _all_to_all: Callable[..., Work]
    _send: Callable[..., Work]
    _recv: Callable[..., Work]
    _barrier: Callable[..., Work]
    size: Callable[[], int]

    def broadcast(self, tensors, opts=None) -> Work:
        opts = opts if isinstance(opts, BroadcastOptions) else _options(None, BroadcastOptions, rootRank=opts)
        return self._broadcast(one_tensor(tensors, "tensors"), opts.rootRank, True)

    def allreduce(self, tensors, opts=None) -> Work:
        opts = _options(opts, AllreduceOptions)
        return self._all_reduce(one_tensor(tensors, "tensors"), opts.reduceOp, True)

    def allreduce_coalesced(self, tensors, opts=None) -> Work:
        opts = _options(opts, AllreduceCoalescedOptions)
        works = [self._all_reduce(t, opts.reduceOp, True) for t in tensors]
        return combine_works(works, list(tensors))

    def reduce(self, tensors, opts=None, op=None) -> Work:
        if not isinstance(opts, ReduceOptions):
            opts = _options(op, ReduceOptions, rootRank=opts)
        return self._reduce(one_tensor(tensors, "tensors"), opts.rootRank, opts.reduceOp, True)

    def allgather(self, output_tensors, input_tensors, opts=None) -> Work:
        _options(opts, AllgatherOptions)
        outputs = one_tensor(output_tensors, "output_tensors")
        return self._all_gather(outputs, one_tensor(input_tensors, "input_tensors"), True)

    def _allgather_base(self, output, input, opts=None) -> Work:
        _options(opts, AllgatherOptions)
        return self._all_gather_into_tensor(output, input, True)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None) -> Work:
        _options(opts, AllgatherOptions)
        works = [self._all_gather_into_tensor(o, i, True) for o, i in zip(outputs, inputs, strict=True)]
        return combine_works(works, list(outputs))

    def allgather_coalesced(self, output_lists, input_list, opts=None) -> Work:
        """Input j of rank r lands in ``output_lists[r][j]`` (torch's layout: one list per rank)."""
        _options(opts, AllgatherOptions)
        if len(output_lists) != self.size() or any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError(f"all_gather_coalesced: output_tensor_lists must hold one list per rank ({self.size()}), "
                             f"each with one tensor per input ({len(input_list)})")
        works = [self._all_gather([outs[j] for outs in output_lists], inp, True) for j, inp in enumerate(input_list)]
        return combine_works(works, list(output_lists))

    def gather(self, output_tensors, input_tensors, opts=None) -> Work:
        opts = opts if isinstance(opts, GatherOptions) else _options(None, GatherOptions, rootRank=opts)
        outputs = one_tensor(output_tensors, "output_tensors") if output_tensors else None
        return self._gather(one_tensor(input_tensors, "input_tensors"), outputs, opts.rootRank, True)

    def gather_single(self, output, input, opts=None) -> Work:
        opts = opts if isinstance(opts, GatherOptions) else _options(None, GatherOptions, rootRank=opts)
        return self._gather_single(output if self._rank == opts.rootRank else None, input, opts.rootRank, True)

    def scatter(self, output_tensors, input_tensors, opts=None) -> Work:
        opts = opts if isinstance(opts, ScatterOptions) else _options(None, ScatterOptions, rootRank=opts)
        inputs = one_tensor(input_tensors, "input_tensors") if input_tensors else None
        return self._scatter(one_tensor(output_tensors, "output_tensors"), inputs, opts.rootRank, True)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> Work:
        opts = _options(opts, ReduceScatterOptions)
        output = one_tensor(output_tensors, "output_tensors")
        inputs = input_tensors[0] if isinstance(output_tensors, (list, tuple)) else input_tensors
        return self._reduce_scatter(output, inputs, opts.reduceOp, True)

    def _reduce_scatter_base(self, outputTensor, inputTensor, opts=None) -> Work:  # noqa: N803
        opts = _options(opts, ReduceScatterOptions)
        return self._reduce_scatter_tensor(outputTensor, inputTensor, opts.reduceOp, True)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None) -> Work:
        opts = _options(opts, ReduceScatterOptions)
        works = [self._reduce_scatter_tensor(o, i, opts.reduceOp, True) for o, i in zip(outputs, inputs, strict=True)]
        return combine_works(works, list(outputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None) -> Work:
        _options(opts, AllToAllOptions)
        return self._all_to_all_single(output, input, output_split_sizes, input_split_sizes, True)

    def alltoall(self, output_tensors, input_tensors, opts=None) -> Work:
        _options(opts, AllToAllOptions)
        return self._all_to_all(output_tensors, input_tensors, True)

    def send(self, tensors, dstRank, tag=0) -> Work:  # noqa: N803
        return self._send(one_tensor(tensors, "tensors"), dstRank, tag, True)

    def recv(self, tensors, srcRank, tag=0) -> Work:  # noqa: N803
        return self._recv(one_tensor(tensors, "tensors"), srcRank, tag, True)

    def recv_anysource(self, tensors, tag=0) -> Work:
        return self._recv(one_tensor(tensors, "tensors"), None, tag, True)

    def barrier(self, opts=None) -> Work:
        _options(opts, BarrierOptions)
        return self._barrier(True)
