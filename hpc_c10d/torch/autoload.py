"""The ``torch.backends`` entry point: torch calls ``autoload()`` at the end of ``import torch``."""

from __future__ import annotations

import warnings

__all__ = ["autoload"]


def autoload() -> None:
    """Register backend ``"hpc"`` if this torch is supported; warn (never raise) otherwise.

    An exception here would make ``import torch`` fail in the whole environment.
    """
    from .version import torch_version_problem

    problem = torch_version_problem()
    if problem:
        warnings.warn(f"{problem}; backend 'hpc' is not registered", RuntimeWarning, stacklevel=2)
        return
    from .registration import register

    register()
