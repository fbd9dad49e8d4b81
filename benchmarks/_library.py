"""Import hpc_c10d for the benchmarks: the installed package, else the checkout they live in."""

import os
import sys


def load():
    """Return the hpc_c10d module (a namespace package without ``__init__`` is not the library)."""
    try:
        import hpc_c10d

        hpc_c10d.init_process_group  # noqa: B018
    except (ImportError, AttributeError):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for name in [m for m in sys.modules if m == "hpc_c10d" or m.startswith("hpc_c10d.")]:
            del sys.modules[name]
        import hpc_c10d
    return hpc_c10d
