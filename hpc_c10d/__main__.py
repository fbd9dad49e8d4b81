"""Command line: ``python -m hpc_c10d info`` (run it under mpiexec/srun to see the job's layout)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the sub-command and run it."""
    parser = argparse.ArgumentParser(prog="python -m hpc_c10d", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, MPI library, thread level and the rank layout")
    args = parser.parse_args(argv)
    if args.command == "info":
        from .info import main as info_main

        return info_main()
    return 2


if __name__ == "__main__":
    sys.exit(main())
