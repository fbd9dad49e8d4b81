"""The optional packages sub-benchmarks need (torch, cupy, h5py): whether they import here, and if
not, the pip command that adds them."""

from __future__ import annotations

import importlib

from ..extras import install_hint

__all__ = ["unimportable"]


def unimportable(module: str, *extras: str) -> str | None:
    """Why ``module`` does not import in this process, naming the pip command of each of ``extras``
    that would add it (None: it imports)."""
    package = module.partition(".")[0]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if exc.name == package:
            return f"{package} is not installed ({' or '.join(install_hint(extra) for extra in extras)})"
        return f"{package} cannot be imported ({type(exc).__name__}: {exc})"
    return None
