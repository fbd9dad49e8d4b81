"""Byte sizes on the command line: ``8``, ``4K``, ``16MiB``, ranges ``8:256M`` and their sweeps."""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_bytes", "parse_range", "fmt_bytes", "sweep"]

_UNIT = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
         "g": 1024**3, "gb": 1000**3, "gib": 1024**3}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``"8"`` → 8, ``"4K"``/``"4KiB"`` → 4096, ``"1MB"`` → 10**6 (a bare K/M/G is binary, as in nccl-tests)."""
    match = _SIZE.match(text)
    unit = match and match.group(2).lower()
    if not match or unit not in _UNIT:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 8, 4K, 16MiB, 1GB")
    return int(float(match.group(1)) * _UNIT[unit])


def parse_range(text: str) -> tuple[int, int]:
    """``"8:256M"`` → (8, 268435456); a single size is a range of one."""
    low, _, high = text.partition(":")
    first, last = parse_bytes(low), parse_bytes(high or low)
    if first < 1 or last < first:
        raise argparse.ArgumentTypeError(f"bad size range {text!r}: want MIN:MAX with 1 <= MIN <= MAX")
    return first, last


def fmt_bytes(n: int) -> str:
    """4096 → ``"4 KiB"``; sizes that are not whole units stay in bytes."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def sweep(first: int, last: int, factor: int, quantum: int) -> list[int]:
    """Sizes from ``first`` to ``last`` (both included), times ``factor`` each step, rounded down to a
    multiple of ``quantum`` (the bytes of one element on every rank) and never below it."""
    sizes, size = [], first
    while size < last:
        sizes.append(size)
        size *= factor
    sizes.append(last)
    return sorted({max(quantum, s - s % quantum) for s in sizes})
