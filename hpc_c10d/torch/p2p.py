"""torch's ``isend``, ``irecv`` and ``batch_isend_irecv`` on backend "hpc": the backend's own handles.

A handle that passed through torch's ``ProcessGroup`` (torch 2.14 and later) answers only
``wait()`` and ``get_future()`` in Python, and torch batches point-to-point only on backends
that coalesce (a Python backend cannot), so ``install`` puts these functions in torch's place: on
a group whose every device is "hpc" they run torch's checks and call the backend directly (a
batch as one NCCL group); other calls go to torch's. Design: docs/architecture.md, "torch.distributed backend plugin".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .devices import BACKEND_NAME

__all__ = ["install"]

_torch_functions: dict[str, Any] = {}  # torch's own isend and irecv, once replaced


def install(handles: bool) -> None:
    """Put ``batch_isend_irecv`` in place of torch's, and with ``handles`` (torch 2.14 and later)
    ``isend`` and ``irecv`` too (idempotent)."""
    replaced = (("isend", isend), ("irecv", irecv)) if handles else ()
    for name, ours in (*replaced, ("batch_isend_irecv", batch_isend_irecv)):
        if getattr(c10d, name) is not ours:
            _torch_functions[name] = getattr(c10d, name)
            setattr(c10d, name, ours)
            setattr(dist, name, ours)


def _backend_of(tensor: torch.Tensor, group: Any) -> Any:
    """The group's "hpc" backend where the call is ours to serve (a plain tensor, a group this
    process is in, "hpc" for every device), else None."""
    if (c10d.has_torch_function((tensor,)) or c10d._rank_not_in_group(group)
            or c10d.get_backend(group) != BACKEND_NAME):
        return None
    from .process_group import hpc_backend

    return hpc_backend(group)


def _checked(tensor: torch.Tensor) -> torch.Tensor:
    c10d._check_single_tensor(tensor, "tensor")
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Any:
    """torch's ``isend``; on backend "hpc", the backend's own handle."""
    backend = _backend_of(tensor, group)
    if backend is None:
        return _torch_functions["isend"](tensor, dst, group, tag, group_dst)
    group = c10d._group_or_default_group(group)
    group_dst = c10d._canonicalize_group_rank(group, dst, group_dst)
    return backend.send([_checked(tensor)], group_dst, tag)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Any:
    """torch's ``irecv``; on backend "hpc", the backend's own handle (from any source without
    ``src``: its ``_source_rank()`` says which)."""
    backend = _backend_of(tensor, group)
    if backend is None:
        return _torch_functions["irecv"](tensor, src, group, tag, group_src)
    if src is None and group_src is None:
        return backend.recv_anysource([_checked(tensor)], tag)
    group = c10d._group_or_default_group(group)
    return backend.recv([_checked(tensor)], c10d._canonicalize_group_rank(group, src, group_src), tag)


def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
    """torch's ``batch_isend_irecv``; on backend "hpc", every operation started together by the
    backend (one NCCL group on CUDA tensors), one handle each."""
    c10d._check_p2p_op_list(p2p_op_list)
    first = p2p_op_list[0]
    backend = _backend_of(first.tensor, first.group)
    if backend is None or any(c10d.has_torch_function((op.tensor,)) for op in p2p_op_list):
        return _torch_functions["batch_isend_irecv"](p2p_op_list)
    return backend.batch_p2p([(op.op.__name__ == "isend", _checked(op.tensor), op.group_peer, op.tag)
                              for op in p2p_op_list])
