"""Numeric settings from environment variables, checked the same way everywhere."""

from __future__ import annotations

import os
from typing import Callable, TypeVar

__all__ = ["non_negative"]

N = TypeVar("N", int, float)


def non_negative(names: str | tuple[str, ...], parse: Callable[[str], N], what: str, hint: str = "") -> N | None:
    """Parse the first of ``names`` set (and not blank) in the environment; None if none is.

    ValueError naming the variable if it is not ``what`` (e.g. "a number of seconds") or is
    negative (``hint`` is appended to that message)."""
    for name in (names,) if isinstance(names, str) else names:
        text = os.environ.get(name, "").strip()
        if not text:
            continue
        try:
            value = parse(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not {what}") from None
        if value < 0:
            raise ValueError(f"{name}={text!r} must be >= 0{hint}")
        return value
    return None
