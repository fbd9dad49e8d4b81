#!/usr/bin/env python3
"""The training bench in separate runs, two model shapes taking turns, merged into one file:

    python tests/gpu/training_rounds.py --out DIR [--runs 3] [--mpiexec MPIEXEC] [--python PYTHON]

Each run is its own job (``mpiexec -n 1 python -m hpc_c10d bench training ...``): the 100M-parameter
bf16 MLP at batch 64, then the host-bound 6M-parameter fp32 one at batch 256, then again, ``--runs``
times each. Within a run the bench already takes the plugin and torch's NCCL in turns. Into
``DIR/bench-training.json`` (the bench's JSON, rewritten after every run): one record per step and
backend, each time the median over the runs, its note listing every run's time. Without a GPU it
says "no CUDA GPU" and exits 3, as the probes do.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace

from gpu_report import load  # beside this file
from probes import gpu_or_exit

from hpc_c10d.bench.options import PROG
from hpc_c10d.bench.report import Record, write_json

SHAPES = {
    "100M-bf16": ("--params", "100M", "-d", "bfloat16", "--batch", "64"),
    "6M-fp32": ("--params", "6M", "-d", "float32", "--batch", "256"),
}
BENCH = ("training", "--device", "cuda", "-r", "5")
OUTPUT = "bench-training.json"
_TIMES = ("us_min", "us_median", "us_max", "host_us", "gpu_us")


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def merge(runs: list[list[Record]]) -> list[Record]:
    """One record per (op, dtype, backend) of ``runs``: each time the median over the runs that
    measured it, the most wrong parameters any run saw, a note with every run's slowest-rank time."""
    points: dict[tuple[str, str, str, str], list[Record]] = {}
    for records in runs:
        for r in records:
            points.setdefault((r.bench, r.op, r.dtype, r.impl), []).append(r)
    merged = []
    for group in points.values():
        times = ", ".join(f"{r.us_max:.1f}" for r in group)
        notes = dict.fromkeys([f"median of {len(group)} runs: {times} µs", *(r.note for r in group if r.note)])
        merged.append(replace(group[0], **{name: _median([getattr(r, name) for r in group]) for name in _TIMES},
                              wrong=max((r.wrong for r in group if r.wrong is not None), default=None),
                              note="; ".join(notes)))
    return merged


def write(path: str, runs: list[tuple[dict, list[Record]]]) -> None:
    """The merged ``runs`` (each a bench JSON's meta and records) as one bench JSON at ``path``."""
    meta = dict(runs[0][0], command="tests/gpu/training_rounds.py: the median of alternating runs of "
                                  + "; ".join(" ".join((PROG, *BENCH, *shape)) for shape in SHAPES.values()))
    write_json(path, meta, merge([records for _, records in runs]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help=f"where {OUTPUT} goes")
    parser.add_argument("--runs", type=int, default=3, help="runs of each shape (default 3)")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    gpu_or_exit()
    os.makedirs(args.out, exist_ok=True)
    runs: list[tuple[dict, list[Record]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(1, args.runs + 1):
            for name, shape in SHAPES.items():
                path = os.path.join(tmp, f"{name}-{n}.json")
                command = [args.mpiexec, "-n", "1", args.python, "-m", "hpc_c10d", "bench", *BENCH, *shape,
                           "--json", path]
                print(f"$ {' '.join(command)}", flush=True)
                rc = subprocess.run(command, stdin=subprocess.DEVNULL).returncode
                if rc != 0:
                    print(f"training_rounds: run {n} of {name} failed (exit {rc})", flush=True)
                    return rc
                runs.append(load(path))
                write(os.path.join(args.out, OUTPUT), runs)
    print(f"training_rounds: {args.runs} runs of each shape, medians in {os.path.join(args.out, OUTPUT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
