"""Thread pools sized to each rank's share of the cores, so the ranks on a node do not fight over them.

At ``init_process_group`` the node-local ranks compare affinity masks and, unless the user set one
of ``THREAD_VARIABLES`` (or ``HPC_C10D_LIMIT_THREADS=0``), each rank's BLAS/OpenMP pools and those
variables get its cores divided by the ranks that share them. Design: docs/architecture.md, "The
job"; use: docs/launching.md, "Threads per rank".
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from ..diagnostics.logs import logger
from ..mpi import bootstrap

__all__ = ["THREAD_VARIABLES", "SWITCH", "ThreadChoice", "switched_on", "share", "limit_pools", "limit_pools_of",
           "current"]

#: what the user sets to size the pools; any one of them set (not by us) means "leave them".
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
SWITCH = "HPC_C10D_LIMIT_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """What ``init_process_group`` did to this rank's thread pools."""

    threads: int | None  # the limit set; None: the pools were left alone
    reason: str  # one line, for the log and ``info``


_set_by_us: dict[str, str] = {}  # the variables this process set itself (a later init may limit again)
_choice: ThreadChoice | None = None
_announced = False


def switched_on() -> bool:
    """Whether ``HPC_C10D_LIMIT_THREADS`` allows limiting (unset, 1 or 0); ValueError otherwise."""
    text = os.environ.get(SWITCH, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{SWITCH}={text!r} must be 1 (limit the thread pools, the default) or 0 (leave them)")
    return text != "0"


def share(mine: set[int], masks: Sequence[set[int]]) -> tuple[int, int]:
    """(threads, ranks sharing) for a rank whose affinity is ``mine`` among the node's ``masks``
    (its own included): the cores it may use divided among the ranks whose masks overlap it."""
    sharing = max(1, sum(1 for mask in masks if mask & mine))
    return max(1, len(mine) // sharing), sharing


def _affinity() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _user_settings() -> list[str]:
    return [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES
            if os.environ.get(name, "").strip() and _set_by_us.get(name) != os.environ[name]]


def _apply(threads: int) -> None:
    import threadpoolctl

    for name in THREAD_VARIABLES:
        os.environ[name] = _set_by_us[name] = str(threads)
    threadpoolctl.threadpool_limits(limits=threads)
    torch = sys.modules.get("torch")  # None where imports of torch are blocked
    if torch is not None:
        torch.set_num_threads(threads)


def limit_pools(node_comm: Any, announce: bool) -> ThreadChoice:
    """Limit this rank's pools to its share of the cores (collective over the node's ranks); with
    ``announce`` (rank 0), say so once per process when ranks share cores."""
    global _choice, _announced
    mine = _affinity()
    masks = [set(mask) for mask in node_comm.allgather(sorted(mine))]
    threads, sharing = share(mine, masks)
    settings = _user_settings()
    if settings:
        _choice = ThreadChoice(None, f"left as set: {', '.join(settings)}")
    elif not switched_on():
        _choice = ThreadChoice(None, f"left as the libraries made them ({SWITCH}=0)")
    else:
        _apply(threads)
        _choice = ThreadChoice(threads, f"{threads} thread(s) per rank: {sharing} rank(s) on this node share "
                                        f"the {len(mine)} core(s) this rank may use (OMP_NUM_THREADS chooses, "
                                        f"{SWITCH}=0 keeps the libraries' own)")
        if sharing > 1 and announce and not _announced:
            _announced = True
            logger.warning("hpc_c10d: BLAS/OpenMP thread pools limited to %s", _choice.reason, extra={"rank": 0})
    return _choice


def limit_pools_of(world: Any) -> ThreadChoice:
    """``limit_pools`` for the ranks of ``world`` (collective), where no node-local split exists yet."""
    node = bootstrap.node_local_comm(world)
    try:
        return limit_pools(node, world.Get_rank() == 0)
    finally:
        node.Free()


def current() -> ThreadChoice | None:
    """What the last ``init_process_group`` in this process chose (None before the first)."""
    return _choice
