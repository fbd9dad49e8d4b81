"""Command line: ``python -m hpc_c10d info`` (run it under mpiexec/srun to see the job's layout) and
``python -m hpc_c10d trace [DIR]`` (who is stuck where, from the flight-recorder dumps) and
``python -m hpc_c10d bench ...`` (collectives, p2p, stores, start-up and checkpoint benchmarks)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the sub-command and run it."""
    parser = argparse.ArgumentParser(prog="python -m hpc_c10d", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, MPI library, thread level and the rank layout")
    commands.add_parser("trace", help="merge flight-recorder dumps: who is stuck where", add_help=False)
    commands.add_parser("bench", help="benchmarks: collectives, p2p, stores, startup, checkpoint", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if args.command == "trace":
        from .trace_report import main as trace_main

        return trace_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        from .info import main as info_main

        return info_main()
    return 2


if __name__ == "__main__":
    sys.exit(main())
