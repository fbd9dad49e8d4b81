"""``run_at_world_size``: run a function on N ranks from a plain serial process (a serial pytest).

It starts ``mpiexec -n N python -m hpc_c10d.testing.spawn DIR`` (the launcher beside this Python,
or ``launcher=``) under a time limit. Each rank imports the function from its source file,
initialises the default group, calls it and writes what it returned, or its traceback, into DIR;
the caller gets the return values by rank, or one AssertionError that names the failing ranks.
"""

from __future__ import annotations

import inspect
import importlib.util
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..diagnostics.trace_report import rank_ranges

__all__ = ["run_at_world_size", "main"]

_CALL = "call.pickle"
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "OMPI_COMM_WORLD", "OMPI_MCA_ess", "MPI_LOCALRANKID")


def run_at_world_size(world_size: int, func: Callable[..., Any], *args: Any, timeout: float = 120.0,
                      launcher: Sequence[str] | None = None, env: dict[str, str] | None = None,
                      **kwargs: Any) -> list[Any]:
    """Call ``func(*args, **kwargs)`` on every rank of a fresh ``world_size``-rank job and return
    the values it returned, by rank. ``func`` must be a module-level function of an importable
    file (a test module is fine); arguments and results are pickled. ``launcher`` is the command
    before ``-n`` (default: the ``mpiexec`` beside this Python, else on PATH); ``env`` is added to
    the environment. Raises AssertionError naming the ranks that failed, with their tracebacks, or
    saying that the job did not finish within ``timeout`` seconds."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    source = inspect.getsourcefile(func)
    if source is None or "<locals>" in func.__qualname__:
        raise ValueError(f"{func.__qualname__} must be a module-level function defined in a file")
    from ..bench.startup import launcher_command

    command = [*(launcher or launcher_command("mpiexec", world_size)[:-2]), "-n", str(world_size),
               sys.executable, "-m", "hpc_c10d.testing.spawn"]
    with tempfile.TemporaryDirectory(prefix="hpc_c10d-spawn-") as scratch:
        Path(scratch, _CALL).write_bytes(pickle.dumps((source, func.__qualname__, args, kwargs)))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
        job = subprocess.Popen([*command, scratch], env={**clean, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            output, _ = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)  # the launcher and every rank it started
            output, _ = job.communicate()
            raise AssertionError(f"{func.__qualname__} at world size {world_size} did not finish within "
                                 f"{timeout:g} s; its output:\n{output[-4000:]}") from None
        results = {}
        for rank in range(world_size):
            path = Path(scratch, f"rank{rank}.pickle")
            if path.exists():
                results[rank] = pickle.loads(path.read_bytes())
    failed = [rank for rank in range(world_size) if rank not in results or not results[rank][0]]
    if failed or job.returncode != 0:
        reports = [f"---------- rank {rank} ----------\n{results[rank][1]}" for rank in failed if rank in results]
        silent = [rank for rank in failed if rank not in results]
        if silent:
            reports.append(f"{rank_ranges(silent)} left no result (exit status {job.returncode}); the job's output:\n"
                           f"{output[-4000:]}")
        raise AssertionError(f"{func.__qualname__} at world size {world_size} failed on ranks "
                             f"{failed or 'none (the job failed)'}\n" + "\n".join(reports))
    return [results[rank][1] for rank in range(world_size)]


def _load(source: str, qualname: str) -> Callable[..., Any]:
    name = f"_hpc_c10d_spawned_{Path(source).stem}"
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(Path(source).parent))
    spec.loader.exec_module(module)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def main(argv: list[str] | None = None) -> int:
    """One rank of a ``run_at_world_size`` job."""
    from .. import lifecycle

    scratch = Path((argv or sys.argv[1:])[0])
    source, qualname, args, kwargs = pickle.loads(Path(scratch, _CALL).read_bytes())
    lifecycle.init_process_group()
    rank = lifecycle.get_rank()
    try:
        outcome = (True, _load(source, qualname)(*args, **kwargs))
    except BaseException:  # noqa: B036 - reported to the caller, whatever it was
        outcome = (False, traceback.format_exc())
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:
        data = pickle.dumps((False, f"its return value could not be pickled: {exc!r}"))
    Path(scratch, f"rank{rank}.pickle").write_bytes(data)
    lifecycle.destroy_process_group()
    return 0 if outcome[0] else 1


if __name__ == "__main__":
    sys.exit(main())
