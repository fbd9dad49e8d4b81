"""Results: one record per (operation, size or ranks, implementation); tables, JSON, CSV, progress."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import IO, Any

from .units import fmt_bytes

__all__ = ["Record", "Progress", "NOISY", "table", "write_json", "write_csv", "wrong_total"]


@dataclass
class Record:
    """One measured point. Times are per call, in microseconds: the median over rounds on each rank,
    then the minimum, median and maximum over ranks. Bandwidths (GB/s, 10**9 bytes) use the maximum."""

    bench: str
    op: str
    impl: str
    ranks: int
    bytes: int = 0
    count: int = 0
    dtype: str = ""
    redop: str = ""
    device: str = "cpu"
    mode: str = "blocking"
    iters: int = 0
    rounds: int = 0
    us_min: float = 0.0
    us_median: float = 0.0
    us_max: float = 0.0
    algbw_gbs: float | None = None
    busbw_gbs: float | None = None
    wrong: int | None = None  # elements that differed from the reference in the checking pass
    host_us: float | None = None  # on a GPU: the host's time to queue a call (slowest rank)
    gpu_us: float | None = None  # on a GPU: the GPU's time per call, from CUDA events (slowest rank)
    note: str = ""


def wrong_total(records: list[Record]) -> int:
    """Wrong elements over all records (records without a check count zero)."""
    return sum(r.wrong or 0 for r in records)


#: (name, microseconds) from the largest
_UNITS = (("s", 1e6), ("ms", 1e3), ("µs", 1.0))


def _unit(records: list[Record]) -> tuple[str, float]:
    """One time unit for a table: the largest in which its shortest time is at least 10."""
    shortest = min((r.us_max for r in records if r.us_max > 0), default=0.0)
    return next(((name, us) for name, us in _UNITS if shortest >= 10 * us), _UNITS[-1])


def _optional(value: Any, form: str) -> str:
    return "" if value is None else format(value, form)


def _title(bench: str, op: str, first: Record) -> str:
    details = [d for d in (first.dtype, first.redop, first.device if first.bench != "startup" else "",
                           first.mode if first.bench in ("collectives", "p2p", "torch") else "") if d]
    return f"### {bench}: {op}" + (f" ({', '.join(details)})" if details else "")


class _Columns:
    """The columns of one (bench, op) table: the point (size or ranks), the first implementation's
    min/median/max time, bandwidths and wrong count where there are any, then each other
    implementation's slowest-rank time, the ratio first / other (below 1: the first is faster) and its
    wrong count where it was checked; on a GPU last each implementation's host and GPU time per
    call. Times are in one unit, named in the headers."""

    def __init__(self, group: list[Record]) -> None:
        impls = list(dict.fromkeys(r.impl for r in group))
        self.base, self.others = impls[0], impls[1:]
        self.by_ranks = group[0].bench == "startup" or len({r.ranks for r in group}) > 1
        self.sized = any(r.count for r in group)
        self.bandwidths = [n for n in ("algbw", "busbw") if any(getattr(r, f"{n}_gbs") is not None for r in group)]
        self.checked = {r.impl for r in group if r.wrong is not None}
        self.device_times = any(r.gpu_us is not None for r in group)
        self.unit, self.scale = _unit(group)

    def header(self) -> list[str]:
        base, unit = self.base, self.unit
        head = ["ranks" if self.by_ranks else "size"] + (["count"] if self.sized else [])
        head += [f"{base} min ({unit})", f"median ({unit})", f"max ({unit})"]
        head += [f"{name} GB/s" for name in self.bandwidths] + (["#wrong"] if base in self.checked else [])
        for other in self.others:
            head += [f"{other} max ({unit})", f"{base} / {other}"] + self._wrong(other, f"{other} #wrong")
        if self.device_times:
            head += [f"{impl} {part} ({unit})" for impl in (base, *self.others) for part in ("host", "GPU")]
        return head

    def row(self, ranks: int, nbytes: int, point: dict[str, Record]) -> list[str]:
        b = point.get(self.base)
        cells = [str(ranks) if self.by_ranks else fmt_bytes(nbytes)]
        cells += [str(b.count if b else "")] if self.sized else []
        if b and b.us_max:
            cells += [self._time(b.us_min), self._time(b.us_median), self._time(b.us_max)]
        else:
            cells += ["failed", "", ""]
        cells += [_optional(b and getattr(b, f"{name}_gbs"), ".2f") for name in self.bandwidths]
        cells += self._wrong(self.base, _optional(b and b.wrong, "d"))
        for other in self.others:
            o = point.get(other)
            wrong = self._wrong(other, _optional(o and o.wrong, "d"))
            if o is None or not o.us_max:
                cells += ["failed" if o else "", ""] + wrong
            else:
                cells += [self._time(o.us_max), f"{b.us_max / o.us_max:.2f}" if b and b.us_max else ""] + wrong
        if self.device_times:
            for impl in (self.base, *self.others):
                r = point.get(impl)
                times = (r.host_us, r.gpu_us) if r else (None, None)
                cells += [self._time(us) if us is not None else "" for us in times]
        return cells

    def _time(self, us: float) -> str:
        """``us`` microseconds in this table's unit: ``7.3``, ``812.4``, ``15230``."""
        value = us / self.scale
        return f"{value:.1f}" if value < 1000 else f"{value:.0f}"

    def _wrong(self, impl: str, cell: str) -> list[str]:
        """``[cell]`` in the wrong-count column of ``impl``, where it has one."""
        return [cell] if impl in self.checked else []


def table(records: list[Record]) -> str:
    """A Markdown table per (bench, op), one row per size (or rank count); ``_Columns`` says which."""
    out = io.StringIO()
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        groups.setdefault((record.bench, record.op), []).append(record)
    for (bench, op), group in groups.items():
        columns = _Columns(group)
        head = columns.header()
        out.write(f"\n{_title(bench, op, group[0])}\n\n| " + " | ".join(head) + " |\n|"
                  + "|".join("---:" for _ in head) + "|\n")
        points: dict[tuple[int, int], dict[str, Record]] = {}
        for r in group:
            points.setdefault((r.ranks, r.bytes), {})[r.impl] = r
        for (ranks, nbytes), point in points.items():
            out.write("| " + " | ".join(columns.row(ranks, nbytes, point)) + " |\n")
        for note in sorted({f"{r.impl} at {r.ranks} ranks: {r.note}" if columns.by_ranks else f"{r.impl}: {r.note}"
                            for r in group if r.note}):
            out.write(f"\n{note}\n")
        noise = _noise(group, columns)
        if noise:
            out.write(f"\n{noise}\n")
    return out.getvalue()


#: a median this many times the minimum: the machine was busy (other jobs, too few cores)
NOISY = 1.5


def _noise(group: list[Record], columns: _Columns) -> str:
    """A warning where the base implementation's median is far above its minimum ('' where not)."""
    noisy = [r for r in group if r.impl == columns.base and r.us_min > 0 and r.us_median >= NOISY * r.us_min]
    if not noisy:
        return ""
    where = ", ".join(f"{r.ranks} ranks" if columns.by_ranks else fmt_bytes(r.bytes) for r in noisy)
    ratios = [r.us_median / r.us_min for r in noisy]
    option = "--repeats" if group[0].bench == "startup" else "--rounds"
    more = f" (this run: {group[0].rounds})" if group[0].rounds else ""
    return (f"noisy: the median is {min(ratios):.1f}-{max(ratios):.1f}x the minimum at {where}, so the machine was "
            f"busy: rerun on a quiet one, or with more {option}{more}")


def _open(path: str) -> IO[str]:
    return sys.stdout if path == "-" else open(path, "w", newline="")


def write_json(path: str, meta: dict[str, Any], records: list[Record]) -> None:
    """``{"meta": ..., "results": [record, ...]}`` to ``path`` (``-``: standard output)."""
    stream = _open(path)
    json.dump({"meta": meta, "results": [asdict(r) for r in records]}, stream, indent=1)
    stream.write("\n")
    if stream is not sys.stdout:
        stream.close()


def write_csv(path: str, records: list[Record]) -> None:
    """One row per record, a header of the record's field names, to ``path`` (``-``: standard output)."""
    stream = _open(path)
    writer = csv.DictWriter(stream, fieldnames=[f.name for f in fields(Record)])
    writer.writeheader()
    writer.writerows(asdict(r) for r in records)
    if stream is not sys.stdout:
        stream.close()


class Progress:
    """``[3/12] all_reduce 4 KiB  6 s, about 18 s left`` on standard error, rewritten in place on a
    terminal and one line per step otherwise; silent when disabled (other ranks, ``--quiet``)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.start = time.monotonic()
        self.live = enabled and sys.stderr.isatty()

    def step(self, label: str) -> None:
        """One more step done. The last prints nothing (a live line is cleared): the table comes next,
        and a line written just before it could reach the terminal after it, as ``mpiexec`` forwards a
        rank's standard output and error separately."""
        self.done += 1
        if not self.enabled:
            return
        if self.done >= self.total:
            if self.live:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
            return
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done)
        line = f"[{self.done}/{self.total}] {label}  {elapsed:.0f} s, about {left:.0f} s left"
        sys.stderr.write(f"\r\033[K{line}" if self.live else line + "\n")
        sys.stderr.flush()
