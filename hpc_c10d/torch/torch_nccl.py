"""CUDA tensors of an "hpc" group on torch's own ``ProcessGroupNCCL``, bootstrapped over MPI.

The group's store is the MPI store, so NCCL's unique ID travels over MPI: no TCPStore, no port.
``HPC_C10D_TORCH_CUDA`` chooses: ``nccl`` (the default where torch has NCCL) or ``hpc`` (hpc_c10d's
own NCCL transport). Design: docs/architecture.md, "torch.distributed backend plugin".
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _make_nccl_premul_sum

from ..diagnostics import watchdog
from .ops import premul_factor

__all__ = ["CUDA_ENV", "CHOICES", "cuda_path", "TorchNCCL", "torch_nccl", "bfloat16_premul_as_sum"]

CUDA_ENV = "HPC_C10D_TORCH_CUDA"
CHOICES = ("nccl", "hpc")
_PREMUL_SUM = dist.ReduceOp.RedOpType.PREMUL_SUM.value  # a torch ReduceOp hashes to its type's value


def cuda_path() -> str:
    """Which path a group's CUDA tensors take: ``"nccl"`` (torch's ProcessGroupNCCL) or ``"hpc"``
    (hpc_c10d's NCCL transport). ``HPC_C10D_TORCH_CUDA`` if set, else ``"nccl"`` where torch was
    built with NCCL. ValueError for another value, or for ``nccl`` where torch has none."""
    text = os.environ.get(CUDA_ENV, "").strip().lower()
    if text and text not in CHOICES:
        raise ValueError(f"{CUDA_ENV}={text!r}: use one of {', '.join(CHOICES)}")
    if text == "nccl" and not dist.is_nccl_available():
        raise ValueError(f"{CUDA_ENV}=nccl, but this torch ({torch.__version__}) was built without NCCL; "
                         f"unset it, or set {CUDA_ENV}=hpc for hpc_c10d's NCCL transport")
    return text or ("nccl" if dist.is_nccl_available() else "hpc")


class _Stuck:
    """An operation handed to torch's NCCL that has not finished, as the watchdog reports it."""

    def __init__(self, op_name: str, where: str, started: float) -> None:
        self.op_name, self.where, self._started = op_name, where, started

    def age(self) -> float:
        return time.monotonic() - self._started


class TorchNCCL:
    """torch's ProcessGroupNCCL serving one "hpc" group's CUDA tensors (``backend``), and the
    latest operation handed to it, which hpc_c10d's watchdog checks as it checks its own NCCL
    transport (operations on one communicator finish in order, so the latest stands for all)."""

    __slots__ = ("backend", "latest", "used", "_stuck")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.latest: tuple[Any, str, float, int] | None = None  # (work, op name, started, device index)
        self.used = False  # whether any operation went to it (barrier then goes there too)
        self._stuck: tuple[Any, _Stuck] | None = None  # the latest operation, once found overdue

    def _overdue(self, limit_s: float) -> _Stuck | None:
        latest = self.latest
        if latest is None:
            return None
        work, op_name, started, device = latest
        if time.monotonic() - started <= limit_s or work.is_completed():
            return None
        if self._stuck is None or self._stuck[0] is not latest:  # the same object each time: reported once
            self._stuck = (latest, _Stuck(op_name, f"cuda:{device}", started))
        return self._stuck[1]

    def _async_failure(self) -> None:
        """None: torch's own watchdog reports NCCL's asynchronous errors on this path."""
        return None

    def abort(self) -> None:
        """Abort torch's communicators (its operations in flight end with an error)."""
        self.backend.abort()

    def shutdown(self) -> None:
        """Free torch's communicators (``destroy_process_group``)."""
        self.backend.shutdown()


def _timeout_for_torch(timeout: timedelta) -> timedelta:
    """The group's timeout, plus the time hpc_c10d's watchdog takes to report a stuck operation
    (which ranks are behind) when it runs: torch's own watchdog then ends the process after it."""
    return timeout + timedelta(seconds=watchdog.report_time())


def torch_nccl(store: Any, rank: int, size: int, global_ranks: Sequence[int], group_name: str,
               timeout: timedelta) -> TorchNCCL | None:
    """torch's ProcessGroupNCCL for a group's CUDA tensors over ``store`` (the group's MPI store;
    its keys go under the group's name), or None where the group keeps hpc_c10d's NCCL transport:
    ``HPC_C10D_TORCH_CUDA=hpc``, no NCCL in torch, no GPU, or debug level DETAIL (where hpc_c10d
    checks every collective on its own transport). Makes no communicator: NCCL's come at first use."""
    if (store is None or cuda_path() != "nccl" or not torch.cuda.is_available()
            or dist.get_debug_level() == dist.DebugLevel.DETAIL):
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = _timeout_for_torch(timeout)
    options.global_ranks_in_group = list(global_ranks) or list(range(size))
    options.group_name = group_name
    prefixed = dist.PrefixStore(f"hpc-cuda/{group_name}/", store)
    return TorchNCCL(dist.ProcessGroupNCCL(prefixed, rank, size, options))


def bfloat16_premul_as_sum(args: tuple, opts_at: int, scaled_at: int,
                           in_place: bool) -> tuple[tuple, Any, Any] | None:
    """The arguments of a reduction that torch's NCCL would get wrong, rewritten as SUM, with its
    options and the op to put back in them; else None.

    torch's NCCL hands NCCL a bfloat16 PREMUL_SUM factor as 4 bytes where NCCL reads 2, so a factor
    such as 0.5 becomes 0 and the result all zeros (pytorch/pytorch#190745, in torch 2.11). Here the
    inputs (``args[scaled_at]``: a tensor or a list of tensors, or of lists) are multiplied by the
    factor first, in place or into new tensors, and ``args[opts_at].reduceOp`` becomes SUM: the
    caller puts the returned op back after the call (``opts.reduceOp = op``).
    """
    if len(args) <= opts_at:
        return None
    opts = args[opts_at]
    op = opts.reduceOp
    if hash(op) != _PREMUL_SUM:
        return None
    inputs = args[scaled_at]
    first = inputs
    while isinstance(first, list):
        first = first[0]
    if first.dtype != torch.bfloat16:
        return None
    factor = premul_factor(op)

    def scale(t: Any) -> Any:
        if isinstance(t, list):
            return [scale(item) for item in t]
        return t.mul_(factor) if in_place else t * factor

    opts.reduceOp = dist.ReduceOp.SUM  # ``op`` reads the options' own field: it says SUM now too
    return (*args[:scaled_at], scale(inputs), *args[scaled_at + 1:]), opts, _make_nccl_premul_sum(factor)
