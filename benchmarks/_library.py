"""Run ``python -m hpc_c10d bench`` for the scripts here: the installed package, else this checkout."""

import os
import sys


def bench(*fixed: str) -> None:
    """Exit with ``python -m hpc_c10d bench FIXED... ARGS...``, ARGS being the script's own arguments."""
    try:
        from hpc_c10d.bench import main
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from hpc_c10d.bench import main
    sys.exit(main([*fixed, *sys.argv[1:]]))
