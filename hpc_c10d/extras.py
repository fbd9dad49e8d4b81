"""How to install an optional part of hpc_c10d, said as a command that runs as written.

hpc_c10d is installed from a checkout or from a wheel, not from an index, so a hint such as
``pip install 'hpc-c10d[hdf5]'`` would fail. The hints name the packages behind an extra instead,
read from the installed package's own metadata, so they always match ``pyproject.toml``.
"""

from __future__ import annotations

import re
import shlex

_DISTRIBUTION = "hpc-c10d"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_requirements(extra: str) -> list[str]:
    """The requirements (``"torch<2.16,>=2.11"``) that the extra ``extra`` adds; [] if unknown."""
    from importlib import metadata  # here, not at import: it costs ~35 ms, which every rank would pay

    try:
        requires = metadata.requires(_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    found = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        match = _EXTRA_MARKER.search(marker)
        if match and match.group(1) == extra:
            found.append(requirement.strip())
    return found


def install_hint(extra: str) -> str:
    """The pip command that adds what the extra ``extra`` needs, e.g. ``pip install h5py``.

    Outside an installed hpc_c10d (a checkout on ``PYTHONPATH``) it names the extra for pip to
    resolve from the checkout.
    """
    requirements = extra_requirements(extra)
    if not requirements:
        return f"pip install '.[{extra}]' (in the hpc_c10d checkout)"
    return "pip install " + " ".join(shlex.quote(r) for r in requirements)


def gpu_install_hint() -> str:
    """The pip commands that add the GPU transport (CuPy and NCCL), for CUDA 13 and for CUDA 12."""
    return f"{install_hint('cuda13')} for CUDA 13, {install_hint('cuda12')} for CUDA 12"
