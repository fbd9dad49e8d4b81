"""``python -m hpc_c10d trace DIR``: merge the ranks' flight-recorder dumps, say who is stuck where.

For each group it lists what its members were inside when they dumped, ranks doing the same
thing folded into ranges ("ranks 0-2 in all_reduce seq 17 of group 0; rank 3 in barrier seq 16
of group 0"), and names the ranks whose sequence number is behind the others'.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any, Iterable

from .flight_recorder import dumps_of, trace_dir

__all__ = ["rank_ranges", "summarize", "main"]


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2,5"`` (``"rank 5"`` for one)."""
    ordered = sorted(set(ranks))
    parts, start = [], None
    for i, rank in enumerate(ordered):
        if start is None:
            start = rank
        if i + 1 == len(ordered) or ordered[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ("rank " if len(ordered) == 1 else "ranks ") + ",".join(parts)


def _doing(dump: dict[str, Any], group: str) -> str:
    """What the rank was inside for ``group``, or where it was otherwise."""
    flights = dump.get("in_flight") or []
    for flight in flights:
        if flight.get("group") == group:
            shape = f" {flight['dtype']}{flight['shape']}" if flight.get("dtype") else ""
            return f"in {flight['op']} seq {flight['seq']} of group {group}{shape}"
    if flights:
        first = flights[0]
        where = f" of group {first['group']}" if first.get("group") is not None else ""
        return f"in {first['op']}{where} (not in this group's collectives)"
    seq = next((g["seq"] for g in dump.get("groups", []) if g["name"] == group), None)
    return f"not inside any operation (collectives started on group {group}: {seq})"


def summarize(dumps: list[dict[str, Any]]) -> str:
    """The report for one run's dumps."""
    if not dumps:
        return "no flight-recorder dumps found"
    world = next((d["world_size"] for d in dumps if d.get("world_size")), len(dumps))
    present = {d["rank"] for d in dumps if d.get("rank") is not None}
    lines = [f"run {dumps[0].get('run', '?')}: dumps from {len(present)} of {world} ranks"]
    missing = sorted(set(range(world)) - present)
    if missing:
        lines.append(f"  no dump from {rank_ranges(missing)} (dead, or could not write)")
    reasons = {d["reason"] for d in dumps if d.get("reason") not in (None, "another rank raised the alarm")}
    lines += [f"  reported: {reason}" for reason in sorted(reasons)]
    groups: dict[str, dict[str, Any]] = {}
    for dump in dumps:
        for group in dump.get("groups", []):
            entry = groups.setdefault(group["name"], {"desc": group.get("desc"), "seqs": {}})
            entry["seqs"][dump["rank"]] = group["seq"]
    for name, group in groups.items():
        members = [d for d in dumps if d["rank"] in group["seqs"]]
        by_state: dict[str, list[int]] = defaultdict(list)
        for dump in members:
            by_state[_doing(dump, name)].append(dump["rank"])
        states = sorted(by_state.items(), key=lambda item: min(item[1]))
        lines.append(f"group {name} ({group['desc']}): " + "; ".join(f"{rank_ranges(r)} {s}" for s, r in states))
        seqs = group["seqs"]
        newest = max(seqs.values())
        behind = [r for r, s in seqs.items() if s < newest]
        if behind:
            lines.append(f"  behind: {rank_ranges(behind)} (collective seq "
                         + ", ".join(f"{seqs[r]}" for r in sorted(behind)) + f" < {newest})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the report for the newest run in DIR (or ``--run``)."""
    parser = argparse.ArgumentParser(prog="python -m hpc_c10d trace", description=__doc__.replace("``", ""))
    parser.add_argument("directory", nargs="?", default=None, help=f"dump directory (default: {trace_dir()})")
    parser.add_argument("--run", default=None, help="run id to report (default: the newest)")
    args = parser.parse_args(argv)
    dumps = dumps_of(args.directory or trace_dir(), args.run)
    print(summarize(dumps))
    return 0 if dumps else 1
