"""The torch releases this plugin supports, and the check made before it is used."""

from __future__ import annotations

import functools
import re

from ..extras import install_hint

__all__ = ["SUPPORTED_TORCH", "torch_version_problem", "require_supported_torch", "python_backends",
           "has_shrink_helpers"]

#: torch releases the plugin is tested with (the C++ hooks it overrides change between releases).
SUPPORTED_TORCH = ">=2.11,<2.16"
_OLDEST = (2, 11)
_FIRST_UNSUPPORTED = (2, 16)


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def torch_version_problem(version: str | None = None) -> str:
    """Return why ``version`` (default: the installed torch's) is unsupported, or '' if it is supported."""
    if version is None:
        import torch

        version = torch.__version__
    release = _release(version)
    if release is not None and _OLDEST <= release < _FIRST_UNSUPPORTED:
        return ""
    return (f"hpc_c10d.torch supports torch {SUPPORTED_TORCH} but found torch {version}; install a "
            f"supported release ({install_hint('torch')}) or use hpc_c10d's own API "
            f"(import hpc_c10d as dist), which works with any torch")


def require_supported_torch() -> None:
    """Raise ImportError, saying what to install, unless the installed torch is supported."""
    problem = torch_version_problem()
    if problem:
        raise ImportError(problem)


@functools.cache
def python_backends() -> bool:
    """Whether the installed torch lets Python make a per-device ``Backend`` (2.14 and later bind
    its constructor; before, only C++ can). Probed once."""
    from torch._C._distributed_c10d import Backend

    try:
        Backend(0, 1)
    except TypeError:  # "No constructor defined!"
        return False
    return True


# torch's private helpers the plugin's shrink_group relies on (torch 2.13's; a torch without them
# keeps its own function)
_SHRINK_HELPERS = ("shrink_group", "_validate_shrink_inputs", "_prepare_shrink_target_group",
                   "_validate_shrink_backend_requirements", "_validate_and_process_excluded_ranks",
                   "_cleanup_process_group_global_state", "_update_default_pg", "_register_pg_in_world",
                   "_process_group_name")


def has_shrink_helpers() -> bool:
    """Whether the installed torch has ``shrink_group`` and the helpers torch/shrink.py uses."""
    import torch.distributed.distributed_c10d as c10d

    return all(hasattr(c10d, name) for name in _SHRINK_HELPERS)
