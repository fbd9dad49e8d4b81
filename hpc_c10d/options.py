"""torch's per-collective option structs, for the ``ProcessGroup`` method API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .reduce_op import RedOpType

__all__ = [
    "AllreduceOptions", "AllreduceCoalescedOptions", "BroadcastOptions", "ReduceOptions",
    "AllgatherOptions", "GatherOptions", "ScatterOptions", "ReduceScatterOptions",
    "BarrierOptions", "AllToAllOptions",
]

_UNSET = timedelta(milliseconds=-1)  # torch's "use the group's timeout"


class _Options:
    """Plain attribute bag with torch's field names and defaults."""

    _fields: dict[str, Any] = {}

    def __init__(self) -> None:
        for name, default in self._fields.items():
            setattr(self, name, list(default) if isinstance(default, list) else default)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"


class AllreduceOptions(_Options):
    _fields = {"reduceOp": RedOpType.SUM, "timeout": _UNSET, "asyncOp": True}


class AllreduceCoalescedOptions(AllreduceOptions):
    pass


class BroadcastOptions(_Options):
    _fields = {"rootRank": 0, "rootTensor": 0, "timeout": _UNSET, "asyncOp": True}


class ReduceOptions(_Options):
    _fields = {"reduceOp": RedOpType.SUM, "rootRank": 0, "rootTensor": 0, "timeout": _UNSET, "asyncOp": True}


class AllgatherOptions(_Options):
    _fields = {"timeout": _UNSET, "asyncOp": True}


class GatherOptions(_Options):
    _fields = {"rootRank": 0, "timeout": _UNSET, "asyncOp": True}


class ScatterOptions(_Options):
    _fields = {"rootRank": 0, "timeout": _UNSET, "asyncOp": True}


class ReduceScatterOptions(_Options):
    _fields = {"reduceOp": RedOpType.SUM, "timeout": _UNSET, "asyncOp": True}


class BarrierOptions(_Options):
    _fields = {"device_ids": [], "timeout": _UNSET, "device": None, "asyncOp": True}


class AllToAllOptions(_Options):
    _fields = {"timeout": _UNSET, "asyncOp": True}
