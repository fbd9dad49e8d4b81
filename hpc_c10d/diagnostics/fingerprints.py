"""Collective fingerprints (debug level DETAIL): ranks compare what they are about to run.

Before each collective the members allgather a checksum of the operation (op, device, dtype,
shape, root, reduce op) and its sequence number on a duplicate of the group's communicator; when they
differ, or a member refuses its own arguments, every member raises ``DistError`` naming the
difference before the collective runs. Design: docs/architecture.md, "Hangs" (Fingerprints).
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

import numpy as np

from ..errors import DistError
from ..process_group import VALIDATING, ProcessGroup
from ..transport import TransportWrapper
from . import debug
from .trace_report import rank_ranges

__all__ = ["enable_checks"]


class _Layout(NamedTuple):
    """Where a transport method keeps what its fingerprint compares (argument positions)."""

    op: str  # the public operation's name
    array: int | None  # the array whose shape every rank must agree on
    root: int | None = None
    reduce_op: int | None = None
    shape_agrees: bool = True  # False: blocks may differ by rank, compare the dtype only


_LAYOUTS = {
    "allreduce": _Layout("all_reduce", 0, reduce_op=1),
    "broadcast": _Layout("broadcast", 0, root=1),
    "reduce": _Layout("reduce", 0, root=1, reduce_op=2),
    "allgather": _Layout("all_gather_into_tensor", 1),
    "allgather_list": _Layout("all_gather", 1),
    "gather_list": _Layout("gather", 1, root=2),
    "scatter_list": _Layout("scatter", 0, root=2),
    "reduce_scatter": _Layout("reduce_scatter_tensor", 0, reduce_op=2),
    "reduce_scatter_list": _Layout("reduce_scatter", 0, reduce_op=2),
    "alltoall": _Layout("all_to_all_single", 1, shape_agrees=False),
    "alltoall_list": _Layout("all_to_all", 1, shape_agrees=False),
    "barrier": _Layout("barrier", None),
}


_REFUSED = -1  # the checksum of a refusal (a crc32 is never negative)


def _static_part(layout: _Layout, device: str, args: tuple) -> tuple:
    """The fingerprint less its sequence number: the same across many calls, so its checksum is cached."""
    array = None if layout.array is None else args[layout.array]
    if isinstance(array, (list, tuple)):
        array = array[0]
    return (layout.op, device,
            None if array is None else array.dtype,
            array.shape if array is not None and layout.shape_agrees else None,
            None if layout.root is None else args[layout.root],
            None if layout.reduce_op is None else args[layout.reduce_op])


def _readable(static: tuple, seq: int) -> dict[str, Any]:
    """A fingerprint as named fields, those the op does not have left out."""
    op, device, dtype, shape, root, reduce_op = static
    fields = {"op": op, "seq": seq, "device": device, "dtype": dtype, "shape": shape, "root": root,
              "reduce_op": reduce_op}
    return {name: value if name in ("op", "seq") else str(value)
            for name, value in fields.items() if value is not None}


def _refusal_message(pg: ProcessGroup, prints: list[dict[str, Any]]) -> str:
    """Which ranks (global) refused their arguments, and why."""
    refusals = [(pg._global_ranks[r], p) for r, p in enumerate(prints) if "refused" in p]
    op, seq = refusals[0][1]["op"], refusals[0][1]["seq"]
    lines = [f"{op} seq {seq} of group {pg._name!r} was refused by the arguments of "
             f"{rank_ranges([rank for rank, _ in refusals])}, so no rank ran it:"]
    lines += [f"  rank {rank}: {p['refused']}" for rank, p in refusals]
    return "\n".join(lines)


def _mismatch_message(pg: ProcessGroup, prints: list[dict[str, Any]]) -> str:
    """Which fields differ, and which ranks (global) hold each value."""
    if any("refused" in p for p in prints):
        return _refusal_message(pg, prints)
    mine = ", ".join(f"{key}={value}" for key, value in prints[pg._rank].items())
    lines = [f"Detected mismatch between collectives on the ranks of group {pg._name!r} "
             f"(this rank runs {mine}):"]
    for field in dict.fromkeys(key for p in prints for key in p):
        holders: dict[str, list[int]] = {}
        for group_rank, p in enumerate(prints):
            holders.setdefault(str(p.get(field, "(none)")), []).append(pg._global_ranks[group_rank])
        if len(holders) > 1:
            sides = "; ".join(f"{rank_ranges(ranks)}: {value}" for value, ranks in holders.items())
            lines.append(f"  {field} differs: {sides}")
    return "\n".join(lines)


class _Checker:
    """One group's fingerprint exchange, shared by the group's transports."""

    _MAX_CODES = 4096  # distinct fingerprints remembered (the cache is dropped when full)

    def __init__(self, pg: ProcessGroup, error: type[Exception]) -> None:
        self.pg = pg
        self.error = error
        self.comm = pg.comm.Dup()
        self._codes: dict[tuple, int] = {}
        self._mine = np.zeros(2, np.int64)  # [checksum of the static part, sequence number]
        self._all = np.zeros(2 * pg.size(), np.int64)

    def check(self, layout: _Layout, device: str, args: tuple) -> None:
        """Raise ``self.error`` on every member unless all members hold the same fingerprint."""
        static = _static_part(layout, device, args)
        code = self._codes.get(static)
        if code is None:
            if len(self._codes) >= self._MAX_CODES:
                self._codes.clear()
            code = self._codes[static] = zlib.crc32(repr(static).encode())
        mine = self._mine
        mine[0], mine[1] = code, self.pg._seq
        self.comm.Allgather(mine, self._all)
        if self._all.tobytes() != mine.tobytes() * self.pg._size:
            prints = self.comm.allgather(_readable(static, self.pg._seq))  # only on a mismatch
            raise self.error(_mismatch_message(self.pg, prints))

    def refuse(self, op: str, error: Exception) -> None:
        """Tell the members, in the exchange their fingerprints go through, that this rank refused
        the arguments of ``op`` (the next sequence number; it raises ``error`` afterwards)."""
        pg, mine = self.pg, self._mine
        pg._seq += 1  # the number the others consumed, so that the next collective agrees
        mine[0], mine[1] = _REFUSED, pg._seq
        self.comm.Allgather(mine, self._all)
        if self._all.tobytes() != mine.tobytes() * pg._size:  # some member did not refuse: it waits for why
            self.comm.allgather({"op": op, "seq": pg._seq, "refused": f"{type(error).__name__}: {error}"})

    def close(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None


def _joining(pg: ProcessGroup, method: Any, op: str, checker: _Checker) -> Any:
    """``method`` (a validating one) whose refusal of this rank's arguments joins the exchange."""

    def joined(*args: Any) -> Any:
        seq = pg._seq
        try:
            return method(*args)
        except (TypeError, ValueError) as error:
            if pg._seq == seq:  # refused before the operation started (after it, every member was checked)
                checker.refuse(op, error)
            raise

    return joined


class _Checked(TransportWrapper):
    """A transport whose collectives first check the members' fingerprints."""

    def __init__(self, inner: Any, checker: _Checker) -> None:
        super().__init__(inner)
        self._checker = checker

    def around(self, name: str, method: Any) -> Any:
        layout = _LAYOUTS.get(name)
        if layout is None:
            return method
        check, device = self._checker.check, self.device

        def checked(*args: Any) -> Any:
            check(layout, device, args)
            return method(*args)

        return checked

    def close(self) -> None:
        super().close()
        self._checker.close()


def enable_checks(pg: ProcessGroup, detail: bool = False, error: type[Exception] = DistError) -> bool:
    """At debug level DETAIL (or with ``detail``), fingerprint-check every collective of ``pg``,
    raising ``error`` on a mismatch (collective call); whether it does."""
    if not detail and debug.get_debug_level() < debug.DebugLevel.DETAIL:
        return False
    checker = _Checker(pg, error)
    pg._wrap_transports(lambda transport: _Checked(transport, checker))
    for name, op in VALIDATING.items():  # instance attributes, in front of the class's methods
        setattr(pg, name, _joining(pg, getattr(pg, name), op, checker))
    return True
