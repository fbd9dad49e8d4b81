"""Debug levels (``OFF``/``INFO``/``DETAIL``) from ``TORCH_DISTRIBUTED_DEBUG`` or ``HPC_C10D_DEBUG``."""

from __future__ import annotations

import enum
import os

__all__ = ["DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env"]

_ENV_VARS = ("HPC_C10D_DEBUG", "TORCH_DISTRIBUTED_DEBUG")


class DebugLevel(enum.IntEnum):
    """How much the package checks and logs."""

    OFF = 0
    INFO = 1
    DETAIL = 2


def _parse(text: str, source: str) -> DebugLevel:
    try:
        return DebugLevel[text.strip().upper()]
    except KeyError:
        raise ValueError(f"{source}={text!r} is not a debug level; use one of OFF, INFO, DETAIL") from None


def _from_env() -> DebugLevel:
    for name in _ENV_VARS:
        value = os.environ.get(name)
        if value:
            return _parse(value, name)
    return DebugLevel.OFF


_level = _from_env()


def get_debug_level() -> DebugLevel:
    """Return the current debug level."""
    return _level


def set_debug_level(level: DebugLevel | str) -> None:
    """Set the debug level (a DebugLevel or its name)."""
    global _level
    _level = level if isinstance(level, DebugLevel) else _parse(str(level), "level")


def set_debug_level_from_env() -> None:
    """Read the level again from HPC_C10D_DEBUG, then TORCH_DISTRIBUTED_DEBUG."""
    global _level
    _level = _from_env()
