"""Command line: python -m hpc_c10d info, trace or bench.

info: versions, the MPI library and where every rank runs (run it under mpiexec or srun to see the
job's layout). trace [DIR]: who is stuck where, from the flight-recorder dumps. bench: collectives,
p2p, stores, start-up and checkpoint benchmarks.
"""

from __future__ import annotations

import argparse
import sys

#: command -> (one line for the listing, what its --help says, or None: the command parses its own options)
_COMMANDS = {
    "info": ("versions, MPI library, thread level and the rank layout",
             "Print the versions of hpc_c10d and the packages it uses, the MPI library and the thread level MPI "
             "granted, the NCCL library the GPU transport would load, the job as the launcher describes it, and "
             "one line per rank: host, node-local rank, pid, usable CPUs and visible GPUs. Run it under the "
             "launcher your jobs use (mpiexec, srun): every rank takes part, rank 0 prints."),
    "trace": ("merge flight-recorder dumps: who is stuck where", None),
    "bench": ("benchmarks: collectives, torch, p2p, stores, startup, checkpoint", None),
}


def main(argv: list[str] | None = None) -> int:
    """Parse the sub-command and run it."""
    parser = argparse.ArgumentParser(prog="python -m hpc_c10d", description=__doc__)
    commands = parser.add_subparsers(dest="command", title="commands")
    for name, (listed, described) in _COMMANDS.items():
        commands.add_parser(name, help=listed, description=described, add_help=described is not None)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if args.command == "trace":
        from .diagnostics.trace_report import main as trace_main

        return trace_main(rest)
    if args.command is None:
        parser.error(f"name a command: {', '.join(_COMMANDS)}")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from .info import main as info_main

    return info_main()


if __name__ == "__main__":
    sys.exit(main())
