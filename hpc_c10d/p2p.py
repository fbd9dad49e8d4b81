"""Point-to-point: ``send``/``recv``, ``isend``/``irecv``, ``P2POp`` and ``batch_isend_irecv``.

``dst``/``src`` are global ranks, ``group_dst``/``group_src`` ranks within ``group``; ``recv``
with no source receives from any rank and returns the sender's global rank.
"""

from __future__ import annotations

from typing import Any, Callable

from .process_group import ProcessGroup
from .state import group_and_rank, resolve_group, to_group_rank, warn_not_in_group
from .work import Work

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def send(tensor: Any, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to ``dst``; returns once the buffer may be reused."""
    pg, peer = group_and_rank(group, dst, group_dst, "send", "dst")
    if pg is not None:
        pg._send(tensor, peer, tag, False)


def recv(tensor: Any, src: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank if None); return the sender's global rank."""
    pg, peer = group_and_rank(group, src, group_src, "recv", "src", any_source=True)
    return -1 if pg is None else pg.global_rank(pg._recv(tensor, peer, tag, False))


def isend(tensor: Any, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor`` to ``dst``; return a Work."""
    pg, peer = group_and_rank(group, dst, group_dst, "isend", "dst")
    return None if pg is None else pg._send(tensor, peer, tag, True)


def irecv(tensor: Any, src: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor`` from ``src`` (any rank if None); return a Work."""
    pg, peer = group_and_rank(group, src, group_src, "irecv", "src", any_source=True)
    return None if pg is None else pg._recv(tensor, peer, tag, True)


class P2POp:
    """One ``isend`` or ``irecv`` for ``batch_isend_irecv``."""

    def __init__(self, op: Callable[..., Any], tensor: Any, peer: int | None = None,
                 group: ProcessGroup | None = None, tag: int = 0, group_peer: int | None = None) -> None:
        if op not in (isend, irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type "
                             "``hpc_c10d.isend`` or ``hpc_c10d.irecv``.")
        self.op = op
        self.tensor = tensor
        self.group = group
        self.tag = tag
        pg = resolve_group(group)
        self.peer = peer
        self.group_peer = None if pg is None else to_group_rank(pg, peer, group_peer, "peer")

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, group_peer={self.group_peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every send and receive in the list; return their Works (checked before any starts)."""
    if not isinstance(p2p_op_list, list) or not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``hpc_c10d.P2POp``.")
    group = p2p_op_list[0].group
    if not all(p.group is group for p in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    pg = resolve_group(group)
    if pg is None:
        warn_not_in_group("batch_isend_irecv")
        return []
    return pg._batch_p2p([(p.op is isend, p.tensor, p.group_peer, p.tag) for p in p2p_op_list])
