"""The flight recorder: what each rank's collectives were doing, written to one file per rank.

``in_flight()`` reads which operation each thread is inside from the Python stacks (also a store's
``wait``/``get``, registered with ``track_store``, and what ``track`` names); an optional ring keeps
the last N operations; ``dump`` writes ``<run>-rank<N>.json`` for ``python -m hpc_c10d trace``.
Design: docs/architecture.md, "Hangs"; settings: docs/hangs.md, "What a dump holds".
"""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Iterable

from ..process_group import ProcessGroup
from ..settings import non_negative
from ..state import _world
from ..transport import TransportWrapper
from ..work import Work
from . import debug

__all__ = ["InFlight", "in_flight", "current", "track", "track_store", "buffer_size", "trace_dir", "enable_recording",
           "dump", "dumps_of", "snapshot", "set_hosts", "host_of", "BUFFER_ENV", "DIR_ENV", "DEFAULT_DIR", "ON_REQUEST",
           "P2P"]

BUFFER_ENV = "HPC_C10D_TRACE_BUFFER_SIZE"
_TORCH_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
DIR_ENV = "HPC_C10D_TRACE_DIR"
DEFAULT_DIR = "hpc_c10d_traces"
ON_REQUEST = "SIGUSR2"  # the reason of a dump that a signal asked for (that rank only)
_DEBUG_BUFFER = 2000

#: ProcessGroup method -> the operation's public name.
_GROUP_OPS = {
    "_all_reduce": "all_reduce", "_broadcast": "broadcast", "_reduce": "reduce",
    "_all_gather": "all_gather", "_all_gather_into_tensor": "all_gather_into_tensor",
    "_gather": "gather", "_scatter": "scatter", "_reduce_scatter": "reduce_scatter",
    "_reduce_scatter_tensor": "reduce_scatter_tensor", "_all_to_all": "all_to_all",
    "_all_to_all_single": "all_to_all_single", "_barrier": "barrier", "_send": "send", "_recv": "recv",
}
P2P = ("send", "recv")  # the operations counted by the groups' p2p sequence numbers
_ARRAY_ARGS = ("tensor", "output", "input", "output_tensor_list", "tensor_list", "input_tensor_list")
_STORE_OPS = ("wait", "get")  # the store operations that block until another rank acts
_codes: dict[Any, str] | None = None
_untimed: dict[Any, str] = {}  # code -> name, from track(): reported, never timed out
_store_waits: set[Any] = set()  # the codes of the stores' wait/get, from track_store()


@dataclass
class InFlight:
    """One thread inside an hpc_c10d operation, as its stack shows."""

    thread: int
    op: str
    group: str | None
    group_desc: str | None
    ranks: list[int] | None
    seq: int | None
    shape: list[int] | None
    dtype: str | None
    pg: Any = None  # the ProcessGroup (left out of dumps)
    timed: bool = True  # under its group's timeout (the watchdog's); a store's or tracked call has its own

    def as_dict(self) -> dict[str, Any]:
        """The facts, JSON-ready (the group object itself left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pg"}

    def describe(self) -> str:
        where = f" seq {self.seq} of group {self.group}" if self.group is not None else ""
        what = f" {self.dtype}{self.shape}" if self.dtype is not None else ""
        return f"{self.op}{where}{what}"


def track(function: Any) -> None:
    """Have ``in_flight`` name a thread inside ``function`` (e.g. ``destroy_process_group``, where a
    finished rank waits for the others), without a timeout."""
    _untimed[function.__code__] = function.__name__


def track_store(cls: type) -> None:
    """Have ``in_flight`` name a thread blocked in ``cls``'s own ``wait`` or ``get``, with the keys,
    without a timeout (a store has its own). Every ``Store`` subclass is tracked as it is defined."""
    _store_waits.update(cls.__dict__[op].__code__ for op in _STORE_OPS if op in cls.__dict__)


def _tracked_codes() -> dict[Any, str]:
    global _codes
    if _codes is None:
        _codes = {getattr(ProcessGroup, name).__code__: op for name, op in _GROUP_OPS.items()}
        _codes[Work.wait.__code__] = "wait"
    return _codes


def _untimed_flight(thread: int, label: str) -> InFlight:
    return InFlight(thread, label, None, None, None, None, None, None, None, timed=False)


def _from_frame(thread: int, frame: Any, op: str) -> InFlight:
    local = frame.f_locals
    owner = local.get("self")
    if isinstance(owner, ProcessGroup):
        shape, dtype, _ = _array_summary(local.get(name) for name in _ARRAY_ARGS)
        shape, dtype = (None, None) if shape is None else ([int(n) for n in shape], str(dtype))
        seq = owner._p2p_seq if op in P2P else owner._seq
        return InFlight(thread, op, owner._name, owner._desc, list(owner._global_ranks), seq, shape, dtype, owner)
    if op == "store":
        keys = local.get("keys", local.get("key"))
        return _untimed_flight(thread, f"{type(owner).__name__}.{frame.f_code.co_name}({keys!r})")
    label = f"wait({getattr(owner, 'op_name', 'operation')})"
    return InFlight(thread, label, None, None, None, None, None, None, None)


def _innermost(thread: int, frame: Any) -> InFlight | None:
    """The innermost hpc_c10d operation on the stack that ends in ``frame``, if any (a group's
    operation rather than the ``Work.wait`` it makes, for one that waits inside: backend "hpc")."""
    codes, depth, wait = _tracked_codes(), 0, None
    while frame is not None and depth < 64:
        op = "store" if frame.f_code in _store_waits else codes.get(frame.f_code)
        if op == "wait":
            wait = wait or frame
        elif op is not None:
            return _from_frame(thread, frame, op)
        name = _untimed.get(frame.f_code)
        if name is not None:
            return _untimed_flight(thread, name)
        frame, depth = frame.f_back, depth + 1
    return None if wait is None else _from_frame(thread, wait, "wait")


def in_flight(skip: int | None = None) -> list[InFlight]:
    """Return the hpc_c10d operation each thread (but ``skip``) is inside, innermost per thread."""
    found = (_innermost(thread, frame) for thread, frame in sys._current_frames().items() if thread != skip)
    return [flight for flight in found if flight is not None]


def current() -> InFlight | None:
    """The hpc_c10d operation the calling thread is inside, if any (for error messages)."""
    return _innermost(threading.get_ident(), sys._getframe(1))


# --------------------------------------------------------------------------------- the ring
def buffer_size() -> int:
    """Entries the ring keeps (0: no ring); ValueError for a malformed setting."""
    size = non_negative((BUFFER_ENV, _TORCH_BUFFER_ENV), int, "a whole number of entries")
    if size is not None:
        return size
    return _DEBUG_BUFFER if debug.get_debug_level() >= debug.DebugLevel.INFO else 0


_ring: collections.deque = collections.deque(maxlen=0)
_ids = iter(range(sys.maxsize))


def _array_summary(args: Iterable[Any]) -> tuple[Any, Any, int]:
    """Shape and dtype objects of the first array among ``args`` (a list counts by its first
    element), and how many arrays that argument holds. Turned into text only when dumped."""
    for arg in args:
        count = 1
        if isinstance(arg, (list, tuple)):
            count, arg = len(arg), arg[0] if arg else None
        shape, dtype = getattr(arg, "shape", None), getattr(arg, "dtype", None)
        if shape is not None and dtype is not None:
            return shape, dtype, count
    return None, None, 0


class _Recording(TransportWrapper):
    """A transport whose every operation leaves an entry in the ring."""

    def __init__(self, inner: Any, pg: ProcessGroup) -> None:
        super().__init__(inner)
        self._pg = pg

    def around(self, name: str, method: Any) -> Any:
        pg, p2p = self._pg, name in P2P

        def recorded(*args: Any) -> Any:
            shape, dtype, count = _array_summary(args)
            entry = [next(_ids), name, pg, pg._p2p_seq if p2p else pg._seq, p2p, shape, dtype, count,
                     "started", time.time(), None]  # _ENTRY_FIELDS, made a dict when dumped
            _ring.append(entry)
            try:
                result = method(*args)
            except BaseException as exc:
                entry[_STATE] = f"failed: {type(exc).__name__}"
                raise
            if isinstance(result, Work):
                entry[_STATE] = "scheduled"  # async: completion is up to its Work
            else:
                entry[_STATE], entry[_FINISHED] = "completed", time.time()
            return result

        return recorded


_ENTRY_FIELDS = ("id", "op", "group", "seq", "p2p", "shape", "dtype", "arrays", "state", "started", "finished")
_STATE, _FINISHED = _ENTRY_FIELDS.index("state"), _ENTRY_FIELDS.index("finished")


def _entry_dict(entry: list) -> dict[str, Any]:
    """A ring entry as JSON-ready fields (the group named by its name and description)."""
    found = dict(zip(_ENTRY_FIELDS, entry))
    pg = found["group"]
    found["group"], found["group_desc"] = pg._name, pg._desc
    found["shape"] = None if found["shape"] is None else [int(n) for n in found["shape"]]
    found["dtype"] = None if found["dtype"] is None else str(found["dtype"])
    return found


def enable_recording(pg: ProcessGroup) -> None:
    """Wrap ``pg``'s transports so each operation is kept in the ring, if the ring is on."""
    global _ring
    size = buffer_size()
    if size == 0:
        return
    if _ring.maxlen != size:
        _ring = collections.deque(_ring, maxlen=size)
    pg._wrap_transports(lambda transport: _Recording(transport, pg))


# --------------------------------------------------------------------------------- dumps
def trace_dir() -> str:
    """Where dumps go: ``HPC_C10D_TRACE_DIR`` or ./hpc_c10d_traces."""
    return os.environ.get(DIR_ENV, "").strip() or DEFAULT_DIR


_hosts: list[str] | None = None


def set_hosts(hosts: list[str] | None) -> None:
    """Every world rank's host name, by rank (None: unknown); written into each dump as ``hosts``."""
    global _hosts
    _hosts = None if hosts is None else list(hosts)


def host_of(global_rank: int) -> str | None:
    """The host of a world rank, where known (gathered when the watchdog started)."""
    return _hosts[global_rank] if _hosts is not None and 0 <= global_rank < len(_hosts) else None


def snapshot(reason: str, skip: int | None = None) -> dict[str, Any]:
    """This rank's state as a JSON-ready dict."""
    pg = _world.default_pg
    flights = [f.as_dict() for f in in_flight(skip)]
    return {
        "version": 1, "reason": reason, "time": time.time(), "host": socket.gethostname(), "pid": os.getpid(),
        "rank": pg._rank if pg is not None else None, "world_size": pg._size if pg is not None else None,
        "hosts": _hosts,
        "groups": [{"name": g._name, "desc": g._desc, "ranks": list(g._global_ranks), "seq": g._seq,
                    "p2p_seq": g._p2p_seq, "timeout_s": g._timeout.total_seconds()} for g in _world.groups],
        "in_flight": flights,
        "entries": [_entry_dict(entry) for entry in list(_ring)],
    }


_dump_lock = threading.Lock()


def dump(reason: str, directory: str | None = None, skip: int | None = None, run_id: str = "run",
         extra: dict[str, Any] | None = None) -> str | None:
    """Write this rank's snapshot (with the fields in ``extra``) to ``<dir>/<run_id>-rank<N>.json``;
    return the path (None if that failed)."""
    with _dump_lock:
        try:
            data = snapshot(reason, skip)
            data.update(extra or {})
            data["run"] = run_id
            folder = directory or trace_dir()
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{run_id}-rank{data['rank'] if data['rank'] is not None else 'X'}.json")
            partial = f"{path}.{os.getpid()}.tmp"
            with open(partial, "w") as out:
                json.dump(data, out, indent=1, default=str)
            os.replace(partial, path)
            return path
        except Exception as exc:  # a dump is best effort: never let it mask the real failure
            print(f"hpc_c10d: could not write the flight recorder dump: {exc}", file=sys.stderr, flush=True)
            return None


def dumps_of(directory: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """Read the dumps in ``directory`` of ``run_id`` (None: the run with the newest dump), by rank."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json") and "-rank" in n]
    except FileNotFoundError:
        return []
    if run_id is None and names:
        newest = max(names, key=lambda n: os.path.getmtime(os.path.join(directory, n)))
        run_id = newest.rsplit("-rank", 1)[0]
    found = []
    for name in names:
        if name.rsplit("-rank", 1)[0] != run_id:
            continue
        try:
            with open(os.path.join(directory, name)) as data:
                found.append(json.load(data))
        except (OSError, ValueError):
            continue  # being written, or cut short by the abort
    return sorted(found, key=lambda d: (d.get("rank") is None, d.get("rank") or 0))
