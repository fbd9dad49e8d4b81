"""``python -m hpc_c10d trace DIR``: merge the ranks' flight-recorder dumps, say who is stuck where.

Per group: what its members were inside, ranks doing the same thing folded into ranges ("ranks 0-2
in all_reduce seq 17 of group 0; rank 3 in barrier seq 16 of group 0"), the ranks whose sequence
number is behind, and the ranks that left no dump or did not answer the roll call, with their
hosts ("no answer from ranks 2-3 on node2"). Reading it: docs/hangs.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from typing import Any, Iterable

from .flight_recorder import DEFAULT_DIR, DIR_ENV, ON_REQUEST, dumps_of, trace_dir

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


def _on(ranks: Iterable[int], hosts: list[str] | None) -> str:
    """`` on node2`` (the distinct hosts of ``ranks``), or nothing when the hosts are unknown."""
    names = sorted({hosts[r] for r in ranks if hosts is not None and 0 <= r < len(hosts) and hosts[r]})
    return f" on {','.join(names)}" if names else ""


def _roll_call_lines(dumps: list[dict[str, Any]], hosts: list[str] | None) -> list[str]:
    """Who heard nothing from whom in the roll call, ranks with the same silence folded together."""
    by_silent: dict[tuple[int, ...], list[tuple[int, float]]] = defaultdict(list)
    for dump in dumps:
        roll = dump.get("roll_call") or {}
        if roll.get("silent") and dump.get("rank") is not None:
            by_silent[tuple(roll["silent"])].append((dump["rank"], float(roll.get("waited_s") or 0)))
    lines = []
    for silent, heard_by in sorted(by_silent.items(), key=lambda item: min(r for r, _ in item[1])):
        listeners = [r for r, _ in heard_by]
        waited = max(w for _, w in heard_by)
        lines.append(f"  no answer from {rank_ranges(silent)}{_on(silent, hosts)} to {rank_ranges(listeners)}"
                     f"{_on(listeners, hosts)} within {waited:.1f} s (dead, stopped, or cut off from them)")
    return lines


def _missing_lines(dumps: list[dict[str, Any]], missing: list[int], hosts: list[str] | None) -> list[str]:
    """Why ranks left no dump, as far as the dumps tell: asked by no one (dumps made on SIGUSR2),
    alive (they answered a roll call), or neither (dead, or could not write)."""
    if not missing:
        return []
    if all(d.get("reason") == ON_REQUEST for d in dumps):
        return [f"  no dump from {rank_ranges(missing)}{_on(missing, hosts)}: {ON_REQUEST} makes only the ranks "
                "it reaches dump (send it to each rank's process to see them all)"]
    answered = {r for d in dumps for r in (d.get("roll_call") or {}).get("answered", [])}
    alive, unknown = [r for r in missing if r in answered], [r for r in missing if r not in answered]
    lines = []
    if alive:
        lines.append(f"  no dump from {rank_ranges(alive)}{_on(alive, hosts)}, which answered the roll call "
                     "(alive, but could not write its dump)")
    if unknown:
        lines.append(f"  no dump from {rank_ranges(unknown)}{_on(unknown, hosts)} (dead, or could not write)")
    return lines


def _doing(dump: dict[str, Any], group: str) -> str:
    """What the rank was inside for ``group``, or where it was otherwise."""
    flights = dump.get("in_flight") or []
    for flight in flights:
        if flight.get("group") == group:
            shape = f" {flight['dtype']}{flight['shape']}" if flight.get("dtype") else ""
            return f"in {flight['op']} seq {flight['seq']} of group {group}{shape}"
    if flights:
        first = flights[0]
        if first.get("group") is None:  # a store's wait, destroy_process_group, a Work's wait
            return f"in {first['op']}"
        return f"in {first['op']} of group {first['group']} (not in this group's collectives)"
    seq = next((g["seq"] for g in dump.get("groups", []) if g["name"] == group), None)
    return f"not inside any operation (collectives started on group {group}: {seq})"


def summarize(dumps: list[dict[str, Any]]) -> str:
    """The report for one run's dumps."""
    if not dumps:
        return "no flight-recorder dumps found"
    world = next((d["world_size"] for d in dumps if d.get("world_size")), len(dumps))
    present = {d["rank"] for d in dumps if d.get("rank") is not None}
    lines = [f"run {dumps[0].get('run', '?')}: dumps from {len(present)} of {world} ranks"]
    hosts = next((d["hosts"] for d in dumps if d.get("hosts")), None)
    lines += _missing_lines(dumps, sorted(set(range(world)) - present), hosts)
    lines += _roll_call_lines(dumps, hosts)
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
    directory = args.directory or trace_dir()
    if not os.path.isdir(directory):
        print(f"{parser.prog}: {directory}: no such directory (dumps go to {DIR_ENV}, else ./{DEFAULT_DIR}, in "
              "the directory the job ran in)", file=sys.stderr)
        return 1
    dumps = dumps_of(directory, args.run)
    if not dumps and args.run is not None:
        print(f"no flight-recorder dumps of run {args.run} in {directory}")
    else:
        print(summarize(dumps) + ("" if dumps else f" in {directory}"))
    return 0 if dumps else 1
