#!/usr/bin/env python3
"""The GPU section of docs/benchmarks.md and its engineering record, from the device run's bench JSON:

    python tests/gpu/gpu_report.py OUT_DIR      # reads OUT_DIR/bench-*.json, writes two files there

benchmarks-gpu.md (for the user page): each bench's command and tables, under one line with the
date and the machine (GPU, CUDA, NCCL, torch). targets-gpu.md (for docs/dev/measurements.md): the
issues' targets with what was measured against each (met, missed, or not measured), and per op
how much more host time a call takes through the plugin than on torch's "nccl".
"""
from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass, fields

from hpc_c10d.bench.report import Record, table
from hpc_c10d.bench.sweep import TENSORS
from hpc_c10d.bench.units import fmt_bytes

REPORT, RECORD = "benchmarks-gpu.md", "targets-gpu.md"
MiB = 1 << 20
RUNS = re.compile(r"median of (\d+) runs")  # a merged record's note (tests/gpu/training_rounds.py)


@dataclass(frozen=True)
class Verdict:
    """One target and what the run measured against it."""

    target: str
    measured: str
    met: bool | None  # None: not measured

    def row(self) -> str:
        state = {True: "met", False: "**missed**", None: "not measured"}[self.met]
        return f"| {self.target} | {self.measured} | {state} |"


def load(path: str) -> tuple[dict, list[Record]]:
    """A bench JSON file: its meta and its records."""
    with open(path) as f:
        doc = json.load(f)
    names = {f.name for f in fields(Record)}
    return doc["meta"], [Record(**{k: v for k, v in r.items() if k in names}) for r in doc["results"]]


def _by(records: list[Record], impl: str, **where: object) -> list[Record]:
    return [r for r in records if r.impl == impl and all(getattr(r, k) == v for k, v in where.items()) and r.us_max]


def _pairs(records: list[Record], mine: str, theirs: str, metric: str,
           sizes: object = None) -> list[tuple[Record, float, float]]:
    """(mine's record, its ``metric``, theirs) for every point both measured (host_us or us_max)."""
    out = []
    for r in _by(records, mine):
        if sizes is not None and not sizes(r.bytes):
            continue
        other = _by(records, theirs, op=r.op, mode=r.mode, bytes=r.bytes)
        if other and getattr(r, metric) and getattr(other[0], metric):
            out.append((r, getattr(r, metric), getattr(other[0], metric)))
    return out


def _ratios(records: list[Record], mine: str, theirs: str, metric: str, sizes: object = None) -> list[tuple]:
    """(op, mode, bytes, mine / theirs) for every point both measured, on ``metric``."""
    return [(r.op, r.mode, r.bytes, a / b) for r, a, b in _pairs(records, mine, theirs, metric, sizes)]


def plugin_extra(records: list[Record]) -> list[tuple]:
    """(op, mode, bytes, µs) the plugin's host time per call exceeds torch's "nccl", every point both measured."""
    coll = [r for r in records if r.bench == "collectives"]
    return [(r.op, r.mode, r.bytes, a - b) for r, a, b in _pairs(coll, "plugin", "torch", "host_us")]


def _worst(target: str, values: list[tuple], limit: float, form: str = "{:.2f}x") -> Verdict:
    if not values:
        return Verdict(target, "", None)
    op, mode, nbytes, worst = max(values, key=lambda t: t[3])
    return Verdict(target, f"worst {form.format(worst)} ({op} {mode}, {nbytes} B; {len(values)} points)",
                   worst <= limit)


def _training(records: list[Record]) -> Verdict:
    """Training steps against torch's NCCL, judged only on the median of at least 3 runs."""
    train = [r for r in records if r.bench == "training"]
    verdict = _worst("training step time <= 1.03x torch's NCCL (DDP, FSDP2; the median of >= 3 runs)",
                     _ratios(train, "plugin", "torch", "us_max"), 1.03)
    runs = min((int(m[1]) if (m := RUNS.search(r.note)) else 1 for r in train), default=0)
    if verdict.met is not None and runs < 3:
        return Verdict(verdict.target, f"{verdict.measured}; {runs} run(s) only", None)
    return Verdict(verdict.target, f"{verdict.measured}; {runs} runs" if verdict.measured else "", verdict.met)


def verdicts(records: list[Record]) -> list[Verdict]:
    """The targets of the GPU benchmarks (per-call host time, never slower than torch's NCCL, the
    plugin's host time per call, training steps, checkpoint bandwidth) against ``records``."""
    coll = [r for r in records if r.bench == "collectives"]
    smallest = min((r.bytes for r in coll if r.bytes), default=0)
    out = [
        _worst("host time per call <= 1.2x the direct NCCL call at the smallest size",
               _ratios(coll, "hpc_c10d", "nccl", "host_us", lambda b: b == smallest), 1.2),
        _worst("host time per call <= 1.02x the direct NCCL call from 1 MiB",
               _ratios(coll, "hpc_c10d", "nccl", "host_us", lambda b: b >= MiB), 1.02),
        _worst("never slower than torch's ProcessGroupNCCL (time per call, every size)",
               _ratios(coll, "hpc_c10d", "torch", "us_max"), 1.0),
        _worst("hpc_c10d on torch tensors never slower than torch's ProcessGroupNCCL (time per call, every size)",
               _ratios(coll, TENSORS, "torch", "us_max"), 1.0),
        _worst("the plugin's host time per call <= torch's 'nccl' + 2 µs (every op and size)",
               plugin_extra(coll), 2.0, "{:+.1f} µs"),
        _training(records),
    ]
    ckpt = [r for r in records if r.bench == "checkpoint"]
    for what in ("write", "read"):
        ours = _by(ckpt, "hpc_c10d", op=what)
        best = max((r.algbw_gbs or 0 for r in ckpt if r.op == what and r.impl in ("torch.save", "dcp")), default=0)
        met = None if not ours or not best else ours[0].algbw_gbs >= 0.8 * best
        measured = f"{ours[0].algbw_gbs:.2f} GB/s against {best:.2f}" if met is not None else ""
        out.append(Verdict(f"checkpoint {what} >= 0.8x the faster of torch.save and DCP", measured, met))
    return out


def plugin_table(records: list[Record]) -> list[str]:
    """Markdown lines: per op, the plugin's extra host µs per call over torch's "nccl" at its worst
    size and the median over sizes (none where the two were not both measured)."""
    by_op: dict[str, list[tuple[int, float]]] = {}
    for op, mode, nbytes, extra in plugin_extra(records):
        by_op.setdefault(op if mode == "blocking" else f"{op} ({mode})", []).append((nbytes, extra))
    if not by_op:
        return []
    lines = ["", "### The plugin's host time per call over torch's 'nccl'", "",
             "| op | worst size | worst extra (µs) | median extra (µs) |", "|---|---:|---:|---:|"]
    for op, points in by_op.items():
        nbytes, worst = max(points, key=lambda p: p[1])
        lines.append(f"| {op} | {fmt_bytes(nbytes)} | {worst:+.1f} | {statistics.median(e for _, e in points):+.1f} |")
    return lines


def report(out_dir: str) -> tuple[str, str]:
    """The user page's Markdown section and the record's, for the JSON files in ``out_dir``."""
    loaded = [load(path) for path in sorted(glob.glob(os.path.join(out_dir, "bench-*.json")))]
    if not loaded:
        return "## On a GPU\n\nNo GPU benchmark ran.\n", "No GPU benchmark ran.\n"
    lines = ["## On a GPU", ""]
    for meta, records in loaded:
        machine = f"{meta.get('gpu') or 'no GPU named'}, torch {meta['torch']}, hpc_c10d {meta['hpc_c10d']}"
        lines += [f"Measured on {meta['date'][:10]}, {machine}: `{meta['command']}`", "", table(records), ""]
    if os.path.exists(os.path.join(out_dir, "bench-gpu.png")):
        lines += ["![GPU collectives](img/bench-gpu.png)", ""]
    everything = [r for _, records in loaded for r in records]
    meta = loaded[0][0]
    record = [f"### Targets, {meta['date']} on {meta['host']}", "", "| target | measured | |", "|---|---|---|"]
    record += [v.row() for v in verdicts(everything)] + plugin_table(everything)
    return "\n".join(lines), "\n".join(record) + "\n"


if __name__ == "__main__":
    for name, text in zip((REPORT, RECORD), report(sys.argv[1])):
        with open(os.path.join(sys.argv[1], name), "w") as f:
            f.write(text)
        print(text)
