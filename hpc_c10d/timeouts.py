"""Group timeouts: torch's default, the job-wide default from ``HPC_C10D_TIMEOUT``, the type check.

``HPC_C10D_TIMEOUT`` (seconds, a float) replaces torch's 30 minutes for groups created without
``timeout=``, so a whole job can be given a short timeout without editing its code. torch reads
no environment variable for this (its default is a C++ constant), so there is no torch spelling.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any

from .settings import non_negative

__all__ = ["TIMEOUT_ENV", "default_pg_timeout", "timeout_from_env", "check_timeout", "require_timedelta"]

TIMEOUT_ENV = "HPC_C10D_TIMEOUT"

#: torch's default for every group's timeout (torch code compares against it: never changed here).
default_pg_timeout = timedelta(minutes=30)


def timeout_from_env() -> timedelta | None:
    """``HPC_C10D_TIMEOUT`` as a timedelta, None when unset; ValueError naming it when malformed."""
    seconds = non_negative(TIMEOUT_ENV, float, "a number of seconds")
    if seconds is None:
        return None
    try:
        if seconds > 0 and math.isfinite(seconds):
            return timedelta(seconds=seconds)
    except OverflowError:
        pass
    raise ValueError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV].strip()!r} must be a positive, finite number of seconds")


def require_timedelta(timeout: Any) -> timedelta:
    """Return ``timeout``; TypeError, in torch's words, unless it is a ``datetime.timedelta``."""
    if not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout).__name__}")
    return timeout


def check_timeout(timeout: Any, inherited: timedelta | None = None) -> timedelta:
    """Return ``timeout``, or when it is None ``inherited`` (a parent group's), else the default
    (``HPC_C10D_TIMEOUT``, else torch's); TypeError unless it is a ``datetime.timedelta``,
    RuntimeError (torch's type for gloo's "Invalid timeout") unless it is positive."""
    if timeout is None:
        return inherited or timeout_from_env() or default_pg_timeout
    if require_timedelta(timeout) <= timedelta(0):
        raise RuntimeError(f"Invalid timeout: it must be positive, got {timeout!r}")
    return timeout
