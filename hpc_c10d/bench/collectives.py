"""The collective sweep: for each operation and size, a checking pass of every implementation against
the numpy reference, then interleaved timed rounds."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .collective_ops import COLLECTIVES, REDUCTIONS, Blocks, Case, Collective
from .report import Record
from .sweep import Sweep
from .torch_side import as_tensor
from .units import fmt_bytes, sweep

__all__ = ["run", "CORRUPT_ENV", "count_wrong"]

#: Test hook: name an implementation here and the checking pass adds 1 to the first element of its
#: result on every rank, so that the wrong-results count must show it.
CORRUPT_ENV = "HPC_C10D_BENCH_CORRUPT"


def count_wrong(got: np.ndarray, expected: np.ndarray) -> int:
    """Elements of ``got`` that differ from ``expected`` (floating types within their precision)."""
    if np.array_equal(got, expected):  # the usual answer, found without float64 copies (1 GiB: 0.2 s, not 4)
        return 0
    if expected.dtype.kind in "fV":
        tolerance = 1e-2 if expected.dtype.itemsize == 2 else 1e-6
        close = np.isclose(got.astype(np.float64), expected.astype(np.float64), rtol=tolerance, atol=0)
        return int(np.count_nonzero(~close))
    return int(np.count_nonzero(got != expected))


def _arrays(x: Any) -> list:
    """The arrays of ``x``: itself, or a list form's blocks and ``whole``."""
    return [*x, x.whole] if isinstance(x, Blocks) else [x]


def _convert(x: Any, convert: Callable[[Any], Any]) -> Any:
    """``convert(x)``, block by block for a list form's Blocks."""
    return x.map(convert) if isinstance(x, Blocks) else convert(x)


def _assign(target: Any, source: Any, convert: Callable[[Any], Any]) -> None:
    """Fill ``target`` (an array or Blocks) with ``source`` (the same layout, on the host)."""
    for into, values in zip(_arrays(target), _arrays(source)):
        into[...] = convert(values)


def _result(bench: Sweep, out: Any, impl: str) -> np.ndarray:
    """Where ``impl``'s result lands, on the host: a list form's blocks one after the other (raw
    MPI's: ``whole``)."""
    if not isinstance(out, Blocks):
        return bench.to_host(out)
    if impl == "mpi4py":
        return bench.to_host(out.whole)
    return np.concatenate([bench.to_host(block).reshape(-1) for block in out])


def _steps(bench: Sweep, op: Collective, inp: Any, out: Any, redop: str,
           failed: dict[str, str]) -> dict[str, Callable[[], Any]]:
    """Each implementation's call of ``op``; one that has none goes to ``failed`` with the reason."""
    member, mpi_op, _ = REDUCTIONS[redop]
    root = bench.rank == 0
    steps = {}
    for impl in bench.impls:
        if impl == "nccl":
            from .nccl_direct import direct_step

            try:
                steps[impl] = direct_step(op.name, inp, out, member)
            except NotImplementedError as exc:
                failed[impl] = str(exc)
            continue
        if impl == "mpi4py":
            from mpi4py import MPI

            steps[impl] = op.mpi_step(bench.comm, inp, out, getattr(MPI, mpi_op), root, bench.async_op)
            continue
        api, tensors = bench.apis[impl]
        arrays = (_convert(inp, as_tensor), _convert(out, as_tensor)) if tensors else (inp, out)
        steps[impl] = op.c10d_step(api, *arrays, getattr(api.ReduceOp, member), root, bench.async_op)
    return steps


def _check(bench: Sweep, op: Collective, case: Case, steps: dict[str, Callable[[], Any]], inp: Any, out: Any,
           failed: dict[str, str]) -> dict[str, int]:
    """Run each implementation once on fresh inputs (every step works on ``inp`` and ``out``); wrong
    elements summed over ranks. An implementation that cannot run this case (e.g. raw MPI has no
    bfloat16) moves from ``steps`` to ``failed``."""
    from mpi4py import MPI

    fresh_in, fresh_out = op.buffers(case)
    expected = op.expected(case)
    corrupt = os.environ.get(CORRUPT_ENV, "")
    wrong = {}
    for impl in list(steps):
        _assign(inp, fresh_in, bench.to_device)
        _assign(out, fresh_out, bench.to_device)
        try:
            steps[impl]()
            failure = ""
        except Exception as exc:  # noqa: BLE001 - reported as the implementation's note, on every rank
            failure = f"{type(exc).__name__}: {exc}"
        failures = [f for f in bench.comm.allgather(failure) if f]
        if failures:
            failed[impl] = f"cannot run {op.name} on {case.dtype}: {failures[0]}"
            del steps[impl]
            continue
        got = _result(bench, out, impl)
        if expected is not None and corrupt == impl and got.size:
            got = got.copy()
            got.flat[0] += 1
        wrong[impl] = bench.comm.allreduce(0 if expected is None else count_wrong(got, expected), op=MPI.SUM)
    return wrong


def _points(ops: list[str], first: int, last: int, factor: int, dtype: np.dtype, ranks: int) -> list[tuple]:
    points = []
    for name in ops:
        op = COLLECTIVES[name]
        quantum = dtype.itemsize * (ranks if op.chunked else 1)
        points += [(op, nbytes) for nbytes in (sweep(first, last, factor, quantum) if op.sized else [0])]
    return points


def run(bench: Sweep, ops: list[str], sizes: tuple[int, int], factor: int, dtype: np.dtype, redop: str,
        label: str = "collectives") -> list[Record]:
    """Sweep ``ops`` over ``sizes`` (bytes, both ends included, ``factor`` apart); records say ``label``."""
    records = []
    points = _points(ops, *sizes, factor, dtype, bench.size)
    bench.progress.total = len(points)
    for op, nbytes in points:
        case = Case(bench.rank, bench.size, nbytes // dtype.itemsize, dtype, redop if op.reduces else "sum")
        host_in, host_out = op.buffers(case)
        inp = _convert(host_in, bench.to_device)
        out = inp if host_out is host_in else _convert(host_out, bench.to_device)
        failed: dict[str, str] = {}
        steps = _steps(bench, op, inp, out, case.redop, failed)
        wrong = _check(bench, op, case, steps, inp, out, failed)
        for array in _arrays(inp) + _arrays(out):
            array[...] = 0  # timed calls then add zeros: no overflow, no denormals, same work
        measured = bench.measure(steps)
        records += bench.records(measured, wrong, failed, bench=label, op=op.name, bytes=nbytes,
                                 count=case.count, dtype=str(dtype), redop=case.redop if op.reduces else "",
                                 bus=op.bus_factor(bench.size))
        bench.progress.step(f"{op.name} {fmt_bytes(nbytes)}")
    return records
