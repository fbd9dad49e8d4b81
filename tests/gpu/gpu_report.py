#!/usr/bin/env python3
"""The GPU section of docs/benchmarks.md, made from what the device run's bench steps wrote:

    python tests/gpu/gpu_report.py OUT_DIR      # reads OUT_DIR/bench-*.json, writes OUT_DIR/benchmarks-gpu.md

It holds the machine (GPU, CUDA, NCCL), each bench's command and tables, and the issue's targets
with what was measured against each: met, missed, or not measured.
"""
from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import dataclass, fields

from hpc_c10d.bench.report import Record, table

REPORT = "benchmarks-gpu.md"
MiB = 1 << 20


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


def _ratios(records: list[Record], mine: str, theirs: str, metric: str, sizes: object = None) -> list[tuple]:
    """(op, mode, bytes, mine / theirs) for every point both measured, on ``metric`` (host_us or us_max)."""
    out = []
    for r in _by(records, mine):
        if sizes is not None and not sizes(r.bytes):
            continue
        other = [o for o in _by(records, theirs, op=r.op, mode=r.mode, bytes=r.bytes)]
        if other and getattr(r, metric) and getattr(other[0], metric):
            out.append((r.op, r.mode, r.bytes, getattr(r, metric) / getattr(other[0], metric)))
    return out


def _worst(target: str, ratios: list[tuple], limit: float) -> Verdict:
    if not ratios:
        return Verdict(target, "", None)
    op, mode, nbytes, worst = max(ratios, key=lambda t: t[3])
    return Verdict(target, f"worst {worst:.2f}x ({op} {mode}, {nbytes} B; {len(ratios)} points)", worst <= limit)


def verdicts(records: list[Record]) -> list[Verdict]:
    """The targets of the GPU benchmarks (per-call host time, never slower than torch's NCCL, the
    plugin's all_reduce, training steps, checkpoint bandwidth) against ``records``."""
    coll = [r for r in records if r.bench == "collectives"]
    smallest = min((r.bytes for r in coll if r.bytes), default=0)
    out = [
        _worst("host time per call <= 1.2x the direct NCCL call at the smallest size",
               _ratios(coll, "hpc_c10d", "nccl", "host_us", lambda b: b == smallest), 1.2),
        _worst("host time per call <= 1.02x the direct NCCL call from 1 MiB",
               _ratios(coll, "hpc_c10d", "nccl", "host_us", lambda b: b >= MiB), 1.02),
        _worst("never slower than torch's ProcessGroupNCCL (time per call, every size)",
               _ratios(coll, "hpc_c10d", "torch", "us_max"), 1.0),
    ]
    extra = [(r.op, r.mode, r.bytes, r.host_us - o.host_us) for r in _by(coll, "plugin", op="all_reduce")
             for o in _by(coll, "torch", op="all_reduce", mode=r.mode, bytes=r.bytes) if r.host_us and o.host_us]
    if extra:
        op, mode, nbytes, worst = max(extra, key=lambda t: t[3])
        out.append(Verdict("the plugin's CUDA all_reduce per call <= torch's 'nccl' + 2 µs (host time)",
                           f"worst +{worst:.1f} µs ({mode}, {nbytes} B)", worst <= 2.0))
    else:
        out.append(Verdict("the plugin's CUDA all_reduce per call <= torch's 'nccl' + 2 µs (host time)", "", None))
    out.append(_worst("training step time within 5% of torch's NCCL (DDP, FSDP2)",
                      _ratios([r for r in records if r.bench == "training"], "plugin", "torch", "us_max"), 1.05))
    ckpt = [r for r in records if r.bench == "checkpoint"]
    for what in ("write", "read"):
        ours = _by(ckpt, "hpc_c10d", op=what)
        best = max((r.algbw_gbs or 0 for r in ckpt if r.op == what and r.impl in ("torch.save", "dcp")), default=0)
        met = None if not ours or not best else ours[0].algbw_gbs >= 0.8 * best
        measured = f"{ours[0].algbw_gbs:.2f} GB/s against {best:.2f}" if met is not None else ""
        out.append(Verdict(f"checkpoint {what} >= 0.8x the faster of torch.save and DCP", measured, met))
    return out


def report(out_dir: str) -> str:
    """The Markdown section for the JSON files in ``out_dir``."""
    loaded = [load(path) for path in sorted(glob.glob(os.path.join(out_dir, "bench-*.json")))]
    if not loaded:
        return "## On a GPU\n\nNo GPU benchmark ran.\n"
    metas = [meta for meta, _ in loaded]
    gpu = next((m["gpu"] for m in metas if m.get("gpu")), "no GPU named")
    lines = ["## On a GPU", "", f"Measured {metas[0]['date']} on {metas[0]['host']}: {gpu}; torch {metas[0]['torch']}, "
             f"{metas[0].get('mpi_library', '')}, hpc_c10d {metas[0]['hpc_c10d']}. World size "
             f"{metas[0]['ranks']}: per-call costs are host-side overheads and local copies. Made by "
             "`tests/gpu/gpu_report.py` from the device run's JSON files.", "", "### Targets", "",
             "| target | measured | |", "|---|---|---|"]
    lines += [v.row() for v in verdicts([r for _, records in loaded for r in records])]
    for meta, records in loaded:
        lines += ["", f"`{meta['command']}`", table(records)]
    if os.path.exists(os.path.join(out_dir, "bench-gpu.png")):
        lines += ["![GPU collectives](img/bench-gpu.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    text = report(sys.argv[1])
    with open(os.path.join(sys.argv[1], REPORT), "w") as f:
        f.write(text)
    print(text)
