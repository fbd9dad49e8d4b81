"""``torch.distributed.irecv`` (and so ``recv``) from any source on backend "hpc", where "hpc" is a
per-device ``Backend``.

A receive from any source is only useful with its handle's ``_source_rank()``. From torch 2.14 a
handle that passed through torch's ``ProcessGroup`` reaches Python code for ``wait()`` and
``get_future()`` only (torch's ``Work`` trampoline binds no other method), so it cannot say. The
plugin puts this ``irecv`` in place of torch's (``install``): from any source on a group of
backend "hpc" it hands back the backend's own handle, which can; torch's ``recv`` calls it too.
Every other call goes to torch's function.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ._devices import BACKEND_NAME

__all__ = ["install"]

_torch_irecv: Any = None


def install() -> None:
    """Put ``irecv`` in place of torch's (idempotent)."""
    global _torch_irecv
    if c10d.irecv is not irecv:
        _torch_irecv = c10d.irecv
        c10d.irecv = dist.irecv = irecv


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Any:
    """torch's ``irecv``; from any source on backend "hpc", the backend's own handle."""
    if (src is not None or group_src is not None or c10d.has_torch_function((tensor,))
            or c10d._rank_not_in_group(group) or c10d.get_backend(group) != BACKEND_NAME):
        return _torch_irecv(tensor, src, group, tag, group_src)
    from ._process_group import hpc_backend

    c10d._check_single_tensor(tensor, "tensor")
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return hpc_backend(group).recv_anysource([tensor], tag)
