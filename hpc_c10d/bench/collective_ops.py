"""The collectives the bench sweeps: buffer layout, what each rank sends, the result every rank
must see, the nccl-tests bus-bandwidth factor, and the same call through hpc_c10d, raw mpi4py and
torch.distributed.

Sizes follow nccl-tests: ``count`` is the element count of the operation's largest buffer (the
gathered output of all_gather, the input of reduce_scatter), and chunked operations split it into
one equal chunk per rank. Root is rank 0. Design: docs/architecture.md, "The bench".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

__all__ = ["Case", "Blocks", "Collective", "COLLECTIVES", "REDUCTIONS", "contribution", "reference_reduce"]

#: --redop name -> (ReduceOp member name, MPI op name, numpy ufunc)
REDUCTIONS = {"sum": ("SUM", "SUM", np.add), "prod": ("PRODUCT", "PROD", np.multiply),
              "min": ("MIN", "MIN", np.minimum), "max": ("MAX", "MAX", np.maximum)}


@dataclass(frozen=True)
class Case:
    """One point of a sweep, as one rank sees it."""

    rank: int
    size: int  # ranks in the group
    count: int  # elements of the largest buffer
    dtype: np.dtype
    redop: str

    @property
    def chunk(self) -> int:
        return self.count // self.size


def contribution(case: Case, rank: int, count: int) -> np.ndarray:
    """What ``rank`` puts in: small integers, exact in every dtype the bench offers (bfloat16 included)
    for every reduction up to hundreds of ranks; 1s and 2s for products."""
    ramp = np.arange(count, dtype=np.int64) + rank
    values = 1 + (ramp % 7 == 0) if case.redop == "prod" else ramp % 4 + 1
    return values.astype(case.dtype)


def reference_reduce(case: Case, count: int) -> np.ndarray:
    """The reduction of every rank's contribution, in float64 for floating types (then rounded once)."""
    ufunc = REDUCTIONS[case.redop][2]
    wide = np.float64 if case.dtype.kind in "fV" else case.dtype
    result = contribution(case, 0, count).astype(wide)
    for rank in range(1, case.size):
        ufunc(result, contribution(case, rank, count).astype(wide), out=result, casting="unsafe")
    return result.astype(case.dtype)


class Blocks(list):
    """A list form's blocks, one per rank, allocated one by one as torch's tutorials do
    (``[torch.empty_like(t) for _ in range(world_size)]``), and ``whole``: one array of their
    total size, where the raw MPI call (``Gather``, ``Scatter``, ``Allgather``) puts the same bytes."""

    def __init__(self, blocks: list, whole: Any) -> None:
        super().__init__(blocks)
        self.whole = whole

    @classmethod
    def split(cls, data: np.ndarray, parts: int) -> "Blocks":
        """``data`` cut into ``parts`` separately allocated blocks (and a copy as ``whole``)."""
        return cls([block.copy() for block in np.split(data, parts)], data.copy())

    def map(self, convert: Callable[[Any], Any]) -> "Blocks":
        """The same blocks converted (to device arrays, to tensors)."""
        return Blocks([convert(block) for block in self], convert(self.whole))


def _waited(start: Callable[[], Any]) -> Any:
    return start().wait()


def _mpi_waited(start: Callable[[], Any]) -> Any:
    return start().Wait()


class Collective:
    """One operation. Subclasses say how buffers are laid out and what comes out."""

    name = ""
    chunked = False  # count splits into one chunk per rank
    reduces = False  # takes --redop
    sized = True  # barrier is not

    def bus_factor(self, ranks: int) -> float:
        return (ranks - 1) / ranks

    def buffers(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        """(input, output) filled for the checking pass; the same array when the call is in place."""
        data = contribution(case, case.rank, case.count)
        return data, data

    def expected(self, case: Case) -> np.ndarray | None:
        """What this rank's output must hold afterwards (None: nothing defined here)."""
        raise NotImplementedError

    def c10d(self, api: Any, inp: Any, out: Any, redop: Any, root: bool) -> tuple[Callable, tuple, dict]:
        """(function, args, kwargs) of the torch.distributed-style call (hpc_c10d or torch)."""
        raise NotImplementedError

    def mpi(self, comm: Any, inp: Any, out: Any, op: Any, root: bool) -> tuple[Callable, Callable, tuple]:
        """(blocking method, nonblocking method, args) of the raw mpi4py call."""
        raise NotImplementedError

    def c10d_step(self, api: Any, inp: Any, out: Any, redop: Any, root: bool, async_op: bool) -> Callable:
        fn, args, kwargs = self.c10d(api, inp, out, redop, root)
        if async_op:
            return partial(_waited, partial(fn, *args, async_op=True, **kwargs))
        return partial(fn, *args, **kwargs)

    def mpi_step(self, comm: Any, inp: Any, out: Any, op: Any, root: bool, async_op: bool) -> Callable:
        blocking, nonblocking, args = self.mpi(comm, inp, out, op, root)
        return partial(_mpi_waited, partial(nonblocking, *args)) if async_op else partial(blocking, *args)


class AllReduce(Collective):
    name, reduces = "all_reduce", True

    def bus_factor(self, ranks):
        return 2 * (ranks - 1) / ranks

    def expected(self, case):
        return reference_reduce(case, case.count)

    def c10d(self, api, inp, out, redop, root):
        return api.all_reduce, (inp,), {"op": redop}

    def mpi(self, comm, inp, out, op, root):
        from mpi4py import MPI

        return comm.Allreduce, comm.Iallreduce, (MPI.IN_PLACE, inp, op)


class Broadcast(Collective):
    name = "broadcast"

    def bus_factor(self, ranks):
        return 1.0

    def buffers(self, case):
        data = contribution(case, 0, case.count) if case.rank == 0 else np.zeros(case.count, case.dtype)
        return data, data

    def expected(self, case):
        return contribution(case, 0, case.count)

    def c10d(self, api, inp, out, redop, root):
        return api.broadcast, (inp,), {"src": 0}

    def mpi(self, comm, inp, out, op, root):
        return comm.Bcast, comm.Ibcast, (inp, 0)


class Reduce(Collective):
    name, reduces = "reduce", True

    def bus_factor(self, ranks):
        return 1.0

    def expected(self, case):
        return reference_reduce(case, case.count) if case.rank == 0 else None

    def c10d(self, api, inp, out, redop, root):
        return api.reduce, (inp,), {"dst": 0, "op": redop}

    def mpi(self, comm, inp, out, op, root):
        from mpi4py import MPI

        return comm.Reduce, comm.Ireduce, ((MPI.IN_PLACE, inp) if root else (inp, None)) + (op, 0)


class AllGather(Collective):
    name, chunked = "all_gather", True

    def buffers(self, case):
        return contribution(case, case.rank, case.chunk), np.zeros(case.count, case.dtype)

    def expected(self, case):
        return np.concatenate([contribution(case, r, case.chunk) for r in range(case.size)])

    def c10d(self, api, inp, out, redop, root):
        return getattr(api, "all_gather_single", api.all_gather_into_tensor), (out, inp), {}

    def mpi(self, comm, inp, out, op, root):
        return comm.Allgather, comm.Iallgather, (inp, out)


class ReduceScatter(Collective):
    name, chunked, reduces = "reduce_scatter", True, True

    def buffers(self, case):
        return contribution(case, case.rank, case.count), np.zeros(case.chunk, case.dtype)

    def expected(self, case):
        return reference_reduce(case, case.count)[case.rank * case.chunk:(case.rank + 1) * case.chunk]

    def c10d(self, api, inp, out, redop, root):
        return getattr(api, "reduce_scatter_single", api.reduce_scatter_tensor), (out, inp), {"op": redop}

    def mpi(self, comm, inp, out, op, root):
        return comm.Reduce_scatter_block, comm.Ireduce_scatter_block, (inp, out, op)


class AllToAll(Collective):
    name, chunked = "all_to_all", True

    def buffers(self, case):
        return contribution(case, case.rank, case.count), np.zeros(case.count, case.dtype)

    def expected(self, case):
        mine = slice(case.rank * case.chunk, (case.rank + 1) * case.chunk)
        return np.concatenate([contribution(case, r, case.count)[mine] for r in range(case.size)])

    def c10d(self, api, inp, out, redop, root):
        return api.all_to_all_single, (out, inp), {}

    def mpi(self, comm, inp, out, op, root):
        return comm.Alltoall, comm.Ialltoall, (inp, out)


class AllGatherList(AllGather):
    """``all_gather`` into a list of separately allocated blocks (raw MPI: ``Allgather`` into one buffer)."""

    name = "all_gather_list"

    def buffers(self, case):
        return contribution(case, case.rank, case.chunk), Blocks.split(np.zeros(case.count, case.dtype), case.size)

    def c10d(self, api, inp, out, redop, root):
        return api.all_gather, (list(out), inp), {}  # a plain list, as users pass

    def mpi(self, comm, inp, out, op, root):
        return comm.Allgather, comm.Iallgather, (inp, out.whole)


class Gather(AllGatherList):
    """``gather`` into a list of separately allocated blocks (raw MPI: ``Gather`` into one buffer)."""

    name = "gather"

    def expected(self, case):
        return super().expected(case) if case.rank == 0 else None

    def c10d(self, api, inp, out, redop, root):
        return api.gather, (inp,), {"gather_list": list(out) if root else None, "dst": 0}

    def mpi(self, comm, inp, out, op, root):
        return comm.Gather, comm.Igather, (inp, out.whole if root else None, 0)


class Scatter(Collective):
    """``scatter`` from a list of separately allocated blocks (raw MPI: ``Scatter`` from one buffer)."""

    name, chunked = "scatter", True

    def buffers(self, case):
        source = contribution(case, 0, case.count) if case.rank == 0 else np.zeros(case.count, case.dtype)
        return Blocks.split(source, case.size), np.zeros(case.chunk, case.dtype)

    def expected(self, case):
        return contribution(case, 0, case.count)[case.rank * case.chunk:(case.rank + 1) * case.chunk]

    def c10d(self, api, inp, out, redop, root):
        return api.scatter, (out,), {"scatter_list": list(inp) if root else None, "src": 0}

    def mpi(self, comm, inp, out, op, root):
        return comm.Scatter, comm.Iscatter, (inp.whole if root else None, out, 0)


class Barrier(Collective):
    name, sized = "barrier", False

    def bus_factor(self, ranks):
        return 0.0

    def buffers(self, case):
        empty = np.zeros(0, case.dtype)
        return empty, empty

    def expected(self, case):
        return None

    def c10d(self, api, inp, out, redop, root):
        return api.barrier, (), {}

    def mpi(self, comm, inp, out, op, root):
        return comm.Barrier, comm.Ibarrier, ()


COLLECTIVES: dict[str, Collective] = {op.name: op for op in (
    AllReduce(), Broadcast(), Reduce(), AllGather(), AllGatherList(), ReduceScatter(), AllToAll(), Gather(), Scatter(),
    Barrier())}
