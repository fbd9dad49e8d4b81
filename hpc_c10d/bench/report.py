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

__all__ = ["Record", "Progress", "table", "write_json", "write_csv", "wrong_total"]


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
    note: str = ""


def wrong_total(records: list[Record]) -> int:
    """Wrong elements over all records (records without a check count zero)."""
    return sum(r.wrong or 0 for r in records)


def _time(us: float) -> str:
    """µs as a short cell: ``7.3``, ``812`` (µs), ``15.2 ms``, ``1.25 s``."""
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e4:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def _optional(value: Any, form: str) -> str:
    return "" if value is None else format(value, form)


def _title(bench: str, op: str, first: Record) -> str:
    details = [d for d in (first.dtype, first.redop, first.device if first.bench != "startup" else "",
                           first.mode if first.bench in ("collectives", "p2p", "torch") else "") if d]
    return f"### {bench}: {op}" + (f" ({', '.join(details)})" if details else "")


def table(records: list[Record]) -> str:
    """A Markdown table per (bench, op): one row per size (or rank count), the first implementation's
    min/median/max time (µs unless a unit is shown), bandwidths and wrong count where there are any,
    then each other implementation's slowest-rank time, the ratio first / other (below 1: the first
    is faster) and its wrong count."""
    out = io.StringIO()
    groups: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        groups.setdefault((record.bench, record.op), []).append(record)
    for (bench, op), group in groups.items():
        base, *others = dict.fromkeys(r.impl for r in group)
        by_point: dict[tuple, dict[str, Record]] = {}
        for r in group:
            by_point.setdefault((r.ranks, r.bytes), {})[r.impl] = r
        sweep_ranks = len({r.ranks for r in group}) > 1
        sized = any(r.count for r in group)
        bandwidth = any(r.busbw_gbs is not None for r in group)
        checked = any(r.wrong is not None for r in group)
        head = ["ranks" if sweep_ranks else "size"] + (["count"] if sized else [])
        head += [f"{base} min", "median", "max"] + (["algbw GB/s", "busbw GB/s"] if bandwidth else [])
        head += ["#wrong"] if checked else []
        for other in others:
            head += [f"{other}", f"{base} / {other}"] + (["#wrong"] if checked else [])
        out.write(f"\n{_title(bench, op, group[0])}\n\n| " + " | ".join(head) + " |\n|"
                  + "|".join("---:" for _ in head) + "|\n")
        for (ranks, nbytes), row in by_point.items():
            b = row.get(base)
            cells = [str(ranks) if sweep_ranks else fmt_bytes(nbytes)] + ([str(b.count if b else "")] if sized else [])
            mine = [_time(b.us_min), _time(b.us_median), _time(b.us_max)] if b and b.us_max else ["failed", "", ""]
            if bandwidth:
                mine += [_optional(b and b.algbw_gbs, ".2f"), _optional(b and b.busbw_gbs, ".2f")]
            cells += mine + ([_optional(b and b.wrong, "d")] if checked else [])
            for other in others:
                o = row.get(other)
                if o is None or not o.us_max:
                    cells += ["failed" if o else "", ""] + ([""] if checked else [])
                    continue
                ratio = f"{b.us_max / o.us_max:.2f}" if b and b.us_max else ""
                cells += [_time(o.us_max), ratio] + ([_optional(o.wrong, "d")] if checked else [])
            out.write("| " + " | ".join(cells) + " |\n")
        for note in sorted({f"{r.impl} at {r.ranks} ranks: {r.note}" if sweep_ranks else f"{r.impl}: {r.note}"
                            for r in group if r.note}):
            out.write(f"\n{note}\n")
    return out.getvalue()


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
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done)
        line = f"[{self.done}/{self.total}] {label}  {elapsed:.0f} s, about {left:.0f} s left"
        sys.stderr.write(f"\r\033[K{line}" if self.live else line + "\n")
        if self.live and self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
