"""Store latency: ``MPIStore`` (and torch's ``TCPStore`` with ``--compare``), every rank at once on
keys of its own, then all ranks adding to one shared counter."""

from __future__ import annotations

from functools import partial
from typing import Any

from . import busy_owner
from .report import Record
from .sweep import Sweep
from .torch_side import tcp_store

__all__ = ["run", "STORE_OPS", "VALUE"]

VALUE = "0123456789abcdef"  # 16 bytes, not a number
COUNTER = 12345
STORE_OPS = ("set", "get", "get counter", "add", "compare_set", "contended add")
_CONTENDED_CHECK = 100  # adds per rank in the contended checking pass


def _prepare(store: Any, rank: int) -> None:
    store.set(f"s{rank}", VALUE)
    store.set(f"g{rank}", VALUE)
    store.set(f"n{rank}", str(COUNTER))
    store.add(f"a{rank}", 0)
    store.set(f"c{rank}", VALUE)


def _call_and_expected(store: Any, op: str, rank: int) -> tuple[Any, Any]:
    """(the timed call, a check: the call's result → is it right)."""
    if op == "set":
        return partial(store.set, f"s{rank}", VALUE), lambda _: store.get(f"s{rank}") == VALUE.encode()
    if op == "get":
        return partial(store.get, f"g{rank}"), lambda got: got == VALUE.encode()
    if op == "get counter":
        return partial(store.get, f"n{rank}"), lambda got: got == str(COUNTER).encode()
    if op == "add":
        before = store.add(f"a{rank}", 0)
        return partial(store.add, f"a{rank}", 1), lambda got: got == before + 1
    if op == "compare_set":  # expected == desired: the swap always succeeds, the value stays
        return partial(store.compare_set, f"c{rank}", VALUE, VALUE), lambda got: got == VALUE.encode()
    return partial(store.add, "contended", 1), None


def _contended_wrong(bench: Sweep, store: Any) -> int:
    """Every rank adds 1 to one key; results must rise on each rank and sum up exactly."""
    from mpi4py import MPI

    bench.comm.Barrier()
    results = [store.add("contended-check", 1) for _ in range(_CONTENDED_CHECK)]
    bad = sum(b <= a for a, b in zip(results, results[1:]))
    bench.comm.Barrier()
    final = int(store.get("contended-check"))
    return bench.comm.allreduce(bad, op=MPI.SUM) + abs(final - bench.size * _CONTENDED_CHECK)


def run(bench: Sweep, ops: list[str], use_libuv: bool | None, busy_seconds: float = 0.0) -> list[Record]:
    """Time ``ops`` on an MPIStore over the world (and a TCPStore with its server on rank 0); with
    ``busy_seconds``, while rank 0 computes that long (``busy_owner``)."""
    from mpi4py import MPI

    from ..store import MPIStore

    stores = {"MPIStore": MPIStore(bench.comm)}
    if "torch" in bench.impls:
        stores["TCPStore"] = tcp_store(bench.comm, use_libuv)
    records = []
    if busy_seconds:
        bench.progress.total = len(stores)
        records = busy_owner.run(bench, stores, ops, busy_seconds)
        ops = []
    else:
        for store in stores.values():
            _prepare(store, bench.rank)
        bench.progress.total = len(ops)
    for op in ops:
        steps, wrong = {}, {}
        for name, store in stores.items():
            call, check = _call_and_expected(store, op, bench.rank)
            bad = _contended_wrong(bench, store) if check is None else int(not check(call()))
            wrong[name] = bench.comm.allreduce(bad, op=MPI.SUM) if check else bad
            steps[name] = call
        records += bench.records(bench.measure(steps), wrong, bench="stores", op=op, bytes=len(VALUE))
        bench.progress.step(op)
    bench.comm.Barrier()
    stores.pop("MPIStore").close()
    bench.comm.Barrier()  # TCPStore clients go before the server on rank 0
    if stores and bench.rank != 0:
        stores.clear()
    bench.comm.Barrier()
    return records
