"""``ProcessGroup``: a group's MPI communicator, its ranks, and one transport per device type.

Every operation enters through one of the validating methods below (used by the module-level
API and by the torch-style methods in ``_pg_api.py``): arrays are adapted once by the transport
that serves their device, checked (lengths, dtypes, sizes, ranks), and only then communicated.
"""

from __future__ import annotations

import operator
from datetime import timedelta
from typing import Any, Callable, Sequence, cast

import numpy as np

from .arrays import device_type, plain_input, plain_output
from .backend import BackendConfig, transport_factory
from .pg_methods import TorchProcessGroupAPI
from .reduce_op import ReduceOp, RedOpType
from .transport import Transport, TransportWrapper
from .work import Work

__all__ = ["ProcessGroup", "as_rank", "VALIDATING"]

# The validating methods below that start a collective, and its name: what the debug aids put
# themselves in front of (a refusal there joins the fingerprint exchange, or sends a notice).
VALIDATING = {"_all_reduce": "all_reduce", "_broadcast": "broadcast", "_reduce": "reduce",
              "_all_gather": "all_gather", "_all_gather_into_tensor": "all_gather_into_tensor",
              "_gather": "gather", "_scatter": "scatter", "_reduce_scatter": "reduce_scatter",
              "_reduce_scatter_tensor": "reduce_scatter_tensor", "_all_to_all": "all_to_all",
              "_all_to_all_single": "all_to_all_single"}

_C_INT_MAX = (1 << 31) - 1  # torch takes a tag as a C int and refuses larger ones with TypeError


def as_rank(value: Any, name: str) -> int:
    """``value`` as a plain int: any integral index (int, numpy integer, 0-d integer tensor), as torch
    takes ranks; TypeError naming ``name`` otherwise."""
    if type(value) is int:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: rank must be an int, got {type(value).__name__}") from None


def check_reduce_op(op: Any, name: str) -> None:
    """TypeError unless ``op`` is a ReduceOp member or instance."""
    if type(op) is not RedOpType and not isinstance(op, ReduceOp):
        raise TypeError(f"{name}: op must be a ReduceOp such as ReduceOp.SUM, got {op!r}")


def _check_list(value: Any, name: str, length: int | None = None) -> list:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"Invalid function argument: expected `{name}` to be a list of arrays, "
                        f"got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"`{name}` must hold one array per rank of the group ({length}), got {len(value)}")
    return list(value)


def _same_dtype(arrays: Sequence[np.ndarray], name: str) -> None:
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1:
        raise ValueError(f"Invalid usage of tensors with different dtypes in {name}: "
                         f"found {', '.join(sorted(map(str, dtypes)))}")


def _same_size(arrays: Sequence[np.ndarray], like: np.ndarray, op_name: str, name: str,
               like_name: str = "input") -> None:
    """Every block must match ``like``: a check each rank makes alone, so all ranks agree on it."""
    for i, a in enumerate(arrays):
        if a.size != like.size:
            raise ValueError(f"{op_name}: {name}[{i}] has {a.size} elements but every block must have "
                             f"{like.size}, like this rank's {like_name}")


def _plain_blocks(blocks: Any, like: np.ndarray, size: int, writable: bool) -> bool:
    """A list of ``size`` C-contiguous ndarrays each with ``like``'s dtype and size (the hot paths'
    list check; anything else goes through the full validation and its errors)."""
    if type(blocks) is not list or len(blocks) != size:
        return False
    dtype, n, ndarray = like.dtype, like.size, np.ndarray
    for block in blocks:
        if type(block) is not ndarray or block.size != n or (block.dtype is not dtype and block.dtype != dtype):
            return False
        flags = block.flags
        if not flags.c_contiguous or (writable and not flags.writeable):
            return False
    return True


class ProcessGroup(TorchProcessGroupAPI):
    """A group of ranks with its own MPI communicator (torch's ``ProcessGroup``)."""

    def __init__(
        self,
        comm: Any,
        global_ranks: Sequence[int],
        name: str,
        config: BackendConfig,
        backend_name: str,
        timeout: timedelta,
        desc: str = "undefined",
        finish_within: Callable[[Any, Any], None] | None = None,
    ) -> None:
        self._comm = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._global_ranks = tuple(global_ranks)
        self._group_rank_of = {g: i for i, g in enumerate(self._global_ranks)}
        self._config = config
        self._backend_name = backend_name
        self._timeout = timeout
        self._name = name
        self._desc = desc
        self._transports: dict[str, Transport] = {}
        self._wrap: Callable[[Transport], Transport] | None = None
        self._seq = 0  # collectives started on this group (the same count on every member)
        self._p2p_seq = 0  # sends and receives started on this group
        self._gpu_watch: Any = None  # another NCCL serving this group (torch's, behind "hpc"), for the watchdog
        self._watch: Any = None  # the refusal notices' watch (mpi/notices.py), installed from above
        self.bound_device_id: Any = None
        self._tag_ub = _tag_upper_bound(comm)
        self._finish_within = finish_within  # for the CPU transport's blocking calls (Transport.finish_within)
        self._cpu = self._transport_for_device("cpu") if "cpu" in config.device_backend_map else None

    # ---- identity -------------------------------------------------------------------------
    def rank(self) -> int:
        """Return this process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """Return the number of ranks in the group."""
        return self._size

    def name(self) -> str:
        """Return the backend name, as torch's ``ProcessGroup.name()`` does."""
        return self._backend_name

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    @property
    def comm(self) -> Any:
        """The group's mpi4py communicator (an extension over torch)."""
        if self._comm is None:
            raise ValueError(f"process group {self._name!r} has been destroyed")
        return self._comm

    def __repr__(self) -> str:
        return f"<ProcessGroup {self._name!r} rank {self._rank}/{self._size} ranks={list(self._global_ranks)}>"

    # ---- rank translation -----------------------------------------------------------------
    def global_rank(self, group_rank: int) -> int:
        """Return the global rank of ``group_rank``."""
        group_rank = as_rank(group_rank, "group_rank")
        if not 0 <= group_rank < self._size:
            raise ValueError(f"Group rank {group_rank} is not part of group {self._name!r} "
                             f"(valid: 0..{self._size - 1})")
        return self._global_ranks[group_rank]

    def group_rank(self, global_rank: int, name: str | None = None) -> int:
        """Return the group rank of ``global_rank``; ValueError if it is not a member (the messages name
        the argument ``name`` where given)."""
        global_rank = as_rank(global_rank, name or "global_rank")
        found = self._group_rank_of.get(global_rank)
        if found is None:
            where = f"{name}: " if name else ""
            raise ValueError(f"{where}Global rank {global_rank} is not part of group {self._name!r} "
                             f"(its ranks: {list(self._global_ranks)})")
        return found

    # ---- transports -----------------------------------------------------------------------
    def _transport_for_device(self, device: str) -> Transport:
        transport = self._transports.get(device)
        if transport is None:
            backend = self._config.device_backend_map.get(device)
            if backend is None:
                raise RuntimeError(f"no backend for device type {device!r} in group {self._name!r} "
                                   f"(backend config: {self._config})")
            transport = transport_factory(backend)(self.comm, self._timeout)
            transport.finish_within, transport.watch = self._blocking_wait(), self._watch
            if self._wrap is not None:
                transport = self._wrap(transport)
            self._transports[device] = transport
        return transport

    def _watch_with(self, watch: Any) -> None:
        """Have this group's transports' waits watch ``watch`` too (the refusal notices): their
        Works' waits, and a blocking call's where no other wait is set (``finish_within``)."""
        self._watch = watch
        for transport in self._transports.values():
            transport.finish_within, transport.watch = self._blocking_wait(), watch

    def _blocking_wait(self) -> Callable[[Any, Any], None] | None:
        """What a transport's blocking call waits with: the owner's bounded wait, else the notices'
        where they raise in blocking calls (unbounded: the watchdog times it), else none (MPI's
        blocking call)."""
        if self._finish_within is not None or self._watch is None or not self._watch.raising:
            return self._finish_within
        return self._watch.finish

    def _bind_device(self, device_id: Any) -> None:
        """Remember the bound device; with a CUDA backend, have its transport set up for it now
        (NCCL: its communicator, collective over the group) instead of on the first GPU operation."""
        self.bound_device_id = device_id
        if device_id is not None and "cuda" in self._config.device_backend_map:
            self._transport_for_device("cuda")._bind(device_id)

    def _wrap_transports(self, wrap: Callable[[Transport], TransportWrapper]) -> None:
        """Put ``wrap`` around every transport of this group, present and future (debug aids);
        a later wrap goes around the earlier ones."""

        def wrapped(transport: Transport) -> Transport:
            return cast(Transport, wrap(transport))  # a wrapper forwards all it does not change

        inner = self._wrap
        self._wrap = wrapped if inner is None else lambda transport: wrapped(inner(transport))
        self._transports = {device: wrapped(t) for device, t in self._transports.items()}
        self._cpu = self._transports.get("cpu")

    def _transport(self, x: Any, name: str = "tensor") -> Transport:
        if type(x) is np.ndarray and self._cpu is not None:
            return self._cpu
        return self._transport_for_device(device_type(x, name))

    def _transport_of_all(self, name: str, **arguments: Sequence[Any]) -> Transport:
        """The one transport serving every array of ``arguments`` (argument name -> its arrays)."""
        devices = {device_type(a, arg) for arg, arrays in arguments.items() for a in arrays}
        if len(devices) > 1:
            raise ValueError(f"{name}: all arrays must be on one device type, got {sorted(devices)}")
        return self._transport_for_device(devices.pop() if devices else "cpu")

    def _check_root(self, root: Any, name: str) -> int:
        """``root`` as an int group rank; TypeError unless integral, ValueError unless in the group."""
        root = as_rank(root, name)
        if not 0 <= root < self._size:
            raise ValueError(f"{name}: group rank {root} is out of range for a group of size {self._size}")
        return root

    def _check_tag(self, tag: Any) -> int:
        """``tag`` as an int in 0..MPI's TAG_UB; TypeError where torch's would (not an integer, or
        past a C int), ValueError for the rest."""
        if type(tag) is not int:
            try:
                tag = operator.index(tag)
            except TypeError:
                raise TypeError(f"tag must be an int, got {type(tag).__name__}") from None
        if not 0 <= tag <= self._tag_ub:
            error = TypeError if not -_C_INT_MAX - 1 <= tag <= _C_INT_MAX else ValueError
            raise error(f"tag must be a non-negative int no larger than MPI's TAG_UB ({self._tag_ub}), got {tag}")
        return tag

    # ---- validated operations (group ranks) ----------------------------------------------
    def _all_reduce(self, tensor, op, async_op):
        t = self._cpu
        if t is not None and type(tensor) is np.ndarray and type(op) is RedOpType:
            flags = tensor.flags  # the hot path: a contiguous, writable ndarray is its own view
            if flags.c_contiguous and flags.writeable:
                self._seq += 1
                return t.allreduce(tensor, op, async_op, tensor)
        check_reduce_op(op, "all_reduce")
        t = self._transport(tensor)
        buf = t.adapt_output(tensor, "tensor")
        self._seq += 1
        return t.allreduce(buf, op, async_op, tensor)

    def _broadcast(self, tensor, root, async_op):
        t = self._cpu
        if t is not None and type(root) is int and 0 <= root < self._size and (  # a group rank in range
                plain_output(tensor) or (root == self._rank and plain_input(tensor))):
            self._seq += 1
            return t.broadcast(tensor, root, async_op, tensor)
        root = self._check_root(root, "broadcast")
        t = self._transport(tensor)
        buf = t.adapt_output(tensor, "tensor", writable=self._rank != root)  # the root only reads
        self._seq += 1
        return t.broadcast(buf, root, async_op, tensor)

    def _reduce(self, tensor, root, op, async_op):
        t = self._cpu
        if t is not None and type(op) is RedOpType and type(root) is int and 0 <= root < self._size and (
                plain_output(tensor)):  # a group rank in range
            self._seq += 1
            return t.reduce(tensor, root, op, async_op, tensor)
        check_reduce_op(op, "reduce")
        root = self._check_root(root, "reduce")
        t = self._transport(tensor)
        buf = t.adapt_output(tensor, "tensor")
        self._seq += 1
        return t.reduce(buf, root, op, async_op, tensor)

    def _all_gather(self, tensor_list, tensor, async_op):
        t = self._cpu
        if t is not None and plain_input(tensor) and _plain_blocks(tensor_list, tensor, self._size, True):
            self._seq += 1
            return t.allgather_list(tensor_list, tensor, async_op, tensor_list)
        tensor_list = _check_list(tensor_list, "tensor_list", self._size)
        t = self._transport_of_all("all_gather", tensor=[tensor], tensor_list=tensor_list)
        inp = t.adapt_input(tensor, "tensor")
        outs = [t.adapt_output(o, "tensor_list") for o in tensor_list]
        _same_dtype([inp, *outs], "all_gather")
        _same_size(outs, inp, "all_gather", "tensor_list")
        self._seq += 1
        return t.allgather_list(outs, inp, async_op, tensor_list)

    def _all_gather_into_tensor(self, output, input, async_op):
        t = self._cpu
        if t is not None and plain_output(output) and plain_input(input) and output.dtype == input.dtype and (
                output.size == input.size * self._size):
            self._seq += 1
            return t.allgather(output, input, async_op, output)
        t, out, inp = self._one_tensor_each("all_gather_into_tensor", output, input, "output_tensor", "input_tensor")
        self._seq += 1
        return t.allgather(out, inp, async_op, output)

    def _one_tensor_each(self, name, output, input, output_name, input_name):
        """The general path of the one-tensor gather and reduce-scatter: their transport and arrays,
        checked (one dtype; the whole, the output of a gather or the input of a reduce-scatter,
        holding the group's size times the other)."""
        t = self._transport_of_all(name, **{output_name: [output], input_name: [input]})
        out, inp = t.adapt_output(output, output_name), t.adapt_input(input, input_name)
        _same_dtype([out, inp], name)
        gathers = name.startswith("all_gather")
        whole, part = (out, inp) if gathers else (inp, out)
        whole_name, part_name = ("output", "input") if gathers else ("input", "output")
        if whole.size != part.size * self._size:
            raise ValueError(f"{name}: {whole_name} has {whole.size} elements, expected "
                             f"group size {self._size} x {part_name}'s {part.size}")
        return t, out, inp

    def _root_only_list(self, values, is_root, name, role):
        """The list a rooted operation takes on its root only: checked there, absent elsewhere. One
        that is not a list is a TypeError on every rank, root or not, as torch's check makes it."""
        if values is not None and not isinstance(values, (list, tuple)):
            _check_list(values, name)
        if is_root:
            if not values:
                raise ValueError(f"Argument ``{name}`` must be specified on {role} rank.")
            return _check_list(values, name, self._size)
        if values:
            raise ValueError(f"Argument ``{name}`` must NOT be specified on non-{role} ranks.")
        return None

    def _gather(self, tensor, gather_list, root, async_op):
        t = self._cpu
        if t is not None and type(root) is int and 0 <= root < self._size and plain_input(tensor) and (
                _plain_blocks(gather_list, tensor, self._size, True) if root == self._rank else not gather_list):
            self._seq += 1
            return t.gather_list(gather_list, tensor, root, async_op, gather_list or [])
        root = self._check_root(root, "gather")
        is_root = self._rank == root
        device_type(tensor, "tensor")  # not an array: the same error on every rank, before the root's list
        gather_list = self._root_only_list(gather_list, is_root, "gather_list", "destination")
        t = self._transport_of_all("gather", tensor=[tensor], gather_list=gather_list or ())
        inp = t.adapt_input(tensor, "tensor")
        outs = [t.adapt_output(o, "gather_list") for o in gather_list] if is_root else None
        _same_dtype([inp, *(outs or ())], "gather")
        _same_size(outs or (), inp, "gather", "gather_list")
        self._seq += 1
        return t.gather_list(outs, inp, root, async_op, gather_list or [])

    def _gather_single(self, gather_tensor, tensor, root, async_op):
        """``gather`` into one array on the root: ``gather_tensor`` (contiguous, ``size`` times
        ``tensor``'s elements, any shape) holds every rank's ``tensor`` in group-rank order."""
        root = self._check_root(root, "gather_single")
        is_root = self._rank == root
        if is_root and gather_tensor is None:
            raise ValueError("gather_tensor must be specified on the destination rank")
        t = self._transport_of_all("gather_single", tensor=[tensor], gather_tensor=[gather_tensor] if is_root else [])
        inp = t.adapt_input(tensor, "tensor")
        if not is_root:
            return self._gather(inp, None, root, async_op)
        out = t.adapt_output(gather_tensor, "gather_tensor")
        if out.size != self._size * inp.size:
            raise ValueError(f"gather_single: gather_tensor needs {self._size} x {inp.size} = "
                             f"{self._size * inp.size} elements (one tensor per rank), got {out.size}")
        return self._gather(inp, list(out.reshape((self._size, *inp.shape))), root, async_op)

    def _scatter(self, tensor, scatter_list, root, async_op):
        t = self._cpu
        if t is not None and type(root) is int and 0 <= root < self._size and plain_output(tensor) and (
                _plain_blocks(scatter_list, tensor, self._size, False) if root == self._rank else not scatter_list):
            self._seq += 1
            return t.scatter_list(tensor, scatter_list, root, async_op, tensor)
        root = self._check_root(root, "scatter")
        is_root = self._rank == root
        device_type(tensor, "tensor")  # as in _gather
        scatter_list = self._root_only_list(scatter_list, is_root, "scatter_list", "source")
        t = self._transport_of_all("scatter", tensor=[tensor], scatter_list=scatter_list or ())
        out = t.adapt_output(tensor, "tensor")
        inps = [t.adapt_input(i, "scatter_list") for i in scatter_list] if is_root else None
        _same_dtype([out, *(inps or ())], "scatter")
        _same_size(inps or (), out, "scatter", "scatter_list", "output")
        self._seq += 1
        return t.scatter_list(out, inps, root, async_op, tensor)

    def _reduce_scatter(self, output, input_list, op, async_op):
        check_reduce_op(op, "reduce_scatter")
        input_list = _check_list(input_list, "input_list", self._size)
        t = self._transport_of_all("reduce_scatter", output=[output], input_list=input_list)
        out = t.adapt_output(output, "output")
        inps = [t.adapt_input(i, "input_list") for i in input_list]
        _same_dtype([out, *inps], "reduce_scatter")
        _same_size(inps, out, "reduce_scatter", "input_list", "output")
        self._seq += 1
        return t.reduce_scatter_list(out, inps, op, async_op, output)

    def _reduce_scatter_tensor(self, output, input, op, async_op):
        t = self._cpu
        if t is not None and type(op) is RedOpType and plain_output(output) and plain_input(input) and (
                output.dtype == input.dtype and input.size == output.size * self._size):
            self._seq += 1
            return t.reduce_scatter(output, input, op, async_op, output)
        check_reduce_op(op, "reduce_scatter_tensor")
        t, out, inp = self._one_tensor_each("reduce_scatter_tensor", output, input, "output", "input")
        self._seq += 1
        return t.reduce_scatter(out, inp, op, async_op, output)

    def _all_to_all(self, output_tensor_list, input_tensor_list, async_op):
        outs_user = _check_list(output_tensor_list, "output_tensor_list", self._size)
        ins_user = _check_list(input_tensor_list, "input_tensor_list", self._size)
        t = self._transport_of_all("all_to_all", output_tensor_list=outs_user,
                                   input_tensor_list=ins_user)
        outs = [t.adapt_output(o, "output_tensor_list") for o in outs_user]
        inps = [t.adapt_input(i, "input_tensor_list") for i in ins_user]
        _same_dtype([*outs, *inps], "all_to_all")
        if outs[self._rank].size != inps[self._rank].size:
            raise ValueError("all_to_all: the block a rank sends itself must match the block it receives")
        self._seq += 1
        return t.alltoall_list(outs, inps, async_op, outs_user)

    def _all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, async_op):
        t = self._cpu
        size = self._size
        if t is not None and not output_split_sizes and not input_split_sizes and plain_output(output) and (
                plain_input(input) and output.dtype == input.dtype and output.size == input.size
                and output.ndim and input.ndim and not output.shape[0] % size and not input.shape[0] % size):
            self._seq += 1
            return t.alltoall(output, input, None, None, async_op, output)
        t = self._transport_of_all("all_to_all_single", output=[output], input=[input])
        out, inp = t.adapt_output(output, "output"), t.adapt_input(input, "input")
        _same_dtype([out, inp], "all_to_all_single")
        out_counts = self._split_counts(out, output_split_sizes, "output")
        in_counts = self._split_counts(inp, input_split_sizes, "input")
        if out_counts is None and in_counts is None:
            if out.size != inp.size:
                raise ValueError(f"all_to_all_single: output has {out.size} elements but input has {inp.size}")
        else:
            out_counts = out_counts or self._split_counts(out, [out.shape[0] // self._size] * self._size, "output")
            in_counts = in_counts or self._split_counts(inp, [inp.shape[0] // self._size] * self._size, "input")
        self._seq += 1
        return t.alltoall(out, inp, out_counts, in_counts, async_op, output)

    def _split_counts(self, arr, split_sizes, name):
        """Element counts per rank from split sizes along dim 0, or None for an even split."""
        rows = arr.shape[0] if arr.ndim else 1
        if not split_sizes:
            if rows % self._size:
                raise ValueError(f"all_to_all_single: {name} has {rows} rows along dim 0, which does "
                                 f"not split evenly over {self._size} ranks; pass {name}_split_sizes")
            return None
        splits = [int(s) for s in split_sizes]
        if len(splits) != self._size or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"all_to_all_single: {name}_split_sizes {splits} must hold {self._size} "
                             f"non-negative sizes adding up to dim 0 of {name} ({rows})")
        row = arr.size // rows if rows else 0
        return [s * row for s in splits]

    def _barrier(self, async_op):
        """Over MPI, through the transport the group's backend names first for the CPU (the same on
        every rank, so every rank makes the same MPI call); a rank whose group has a GPU transport
        first waits there for its queued GPU collectives (as torch's NCCL barrier does)."""
        gpu = self._transports.get("cuda")
        if gpu is not None:
            gpu._finish_queued()
        transport = self._cpu or self._transport_for_device(
            "cpu" if "cpu" in self._config.device_backend_map else "cuda")
        self._seq += 1
        return transport.barrier(async_op)

    def _check_peer(self, peer, name, allow_self=False):
        peer = self._check_root(peer, name)
        if peer == self._rank and not allow_self:  # only blocking send/recv would deadlock on self
            kind = "destination" if name.endswith("send") else "source"
            raise ValueError(f"Invalid {kind} rank: {kind} rank should not be the same as "
                             "the rank of the current process.")
        return peer

    def _prepare_p2p(self, tensor, peer, tag, sending, async_op):
        """Check a point-to-point operation; return (transport, array, peer, tag)."""
        t = self._transport(tensor)
        arr = t.adapt_input(tensor, "tensor") if sending else t.adapt_output(tensor, "tensor")
        if sending or peer is not None:
            peer = self._check_peer(peer, "send" if sending else "recv", allow_self=async_op)
        return t, arr, peer, self._check_tag(tag)

    def _send(self, tensor, peer, tag, async_op):
        t = self._cpu  # the hot path: an int peer in range (not this rank when blocking) and tag, a plain array
        if t is not None and type(peer) is int and 0 <= peer < self._size and (async_op or peer != self._rank) and (
                type(tag) is int and 0 <= tag <= self._tag_ub and plain_input(tensor)):
            self._p2p_seq += 1
            return t.send(tensor, peer, tag, async_op, tensor)
        t, arr, peer, tag = self._prepare_p2p(tensor, peer, tag, True, async_op)
        self._p2p_seq += 1
        return t.send(arr, peer, tag, async_op, tensor)

    def _recv(self, tensor, peer, tag, async_op):
        t = self._cpu  # the hot path, as in _send; peer None is any rank
        if t is not None and (peer is None or type(peer) is int and 0 <= peer < self._size and (
                async_op or peer != self._rank)) and type(tag) is int and 0 <= tag <= self._tag_ub and (
                plain_output(tensor)):
            self._p2p_seq += 1
            return t.recv(tensor, peer, tag, async_op, tensor)
        t, arr, peer, tag = self._prepare_p2p(tensor, peer, tag, False, async_op)
        self._p2p_seq += 1
        return t.recv(arr, peer, tag, async_op, tensor)

    def _batch_p2p(self, ops: Sequence[tuple[bool, Any, Any, Any]]) -> list[Work]:
        """Start every (is_send, tensor, group peer, tag), all checked before any starts; on a
        transport that batches (NCCL) in one group of calls, so no pair waits on another, else
        one nonblocking operation each. Both APIs' ``batch_isend_irecv`` come here."""
        prepared = [(is_send, tensor, *self._prepare_p2p(tensor, peer, tag, is_send, True))
                    for is_send, tensor, peer, tag in ops]
        transports = {id(transport) for _, _, transport, *_ in prepared}
        batch = getattr(prepared[0][2], "batch_p2p", None) if len(transports) == 1 else None
        if batch is not None:
            return batch([(is_send, arr, peer, tensor) for is_send, tensor, _, arr, peer, _ in prepared])
        return [(transport.send if is_send else transport.recv)(arr, peer, tag, True, tensor)
                for is_send, tensor, transport, arr, peer, tag in prepared]

    # ---- lifetime -------------------------------------------------------------------------
    def _destroy(self) -> None:
        if self._watch is not None:
            self._watch.leave()
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()
        self._cpu = None
        if self._comm is not None:
            self._comm.Free()
            self._comm = None


def _tag_upper_bound(comm: Any) -> int:
    """The largest tag ``comm`` takes: MPI's TAG_UB (2**29 - 1 with MPICH). The standard attaches it
    to COMM_WORLD only (Open MPI's other communicators answer None); it holds for every one."""
    from mpi4py import MPI

    bound = comm.Get_attr(MPI.TAG_UB)
    if bound is None:
        bound = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return 32767 if bound is None else bound  # the least TAG_UB the standard allows
