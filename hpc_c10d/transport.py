"""The interface every transport (MPI on CPU, NCCL on GPU) implements for one process group.

Named ``Transport`` because torch's public ``Backend`` is the string enum of backend names
(see ``backend.py``). Arrays reach a transport already adapted by ``adapt_*``; ranks are group
ranks; lists have been checked for length and dtype. Each method returns ``None`` when
``async_op`` is false (the operation has completed) or a ``Work``.
"""

from __future__ import annotations

import abc
from itertools import accumulate
from typing import Any, Callable, Sequence

__all__ = ["Transport", "TransportWrapper", "displacements"]


def displacements(counts: Sequence[int]) -> list[int]:
    """Where each block starts when blocks of ``counts`` lie back to back (MPI's ``displs``)."""
    return [0, *accumulate(counts)][:-1]


class Transport(abc.ABC):
    """Collectives and point-to-point operations over one group's communicator."""

    #: device type this transport serves ("cpu", "cuda").
    device: str
    #: None, or what a blocking call hands its nonblocking request and the buffers it uses to, to
    #: return once it completed or raise (a group whose blocking calls must end within a timeout, or
    #: watch for refusal notices; honoured by MPI's transport).
    finish_within: Callable[[Any, Any], None] | None = None
    #: None, or what the waits of this transport's Works also watch (the refusal notices,
    #: mpi/notices.py: ``wait(requests, status, keep)`` and ``check()``; honoured by MPI's transport).
    watch: Any = None

    @abc.abstractmethod
    def adapt_input(self, x: Any, name: str) -> Any:
        """Return a view of ``x`` to read from (contiguous; copied only if it was not)."""

    @abc.abstractmethod
    def adapt_output(self, x: Any, name: str, writable: bool = True) -> Any:
        """Return a view of ``x`` to write into; ValueError if that is impossible in place.

        ``writable=False``: same layout checks, for an array only this rank reads.
        """

    @abc.abstractmethod
    def allreduce(self, buf, op, async_op, user):
        """Reduce ``buf`` over the group into every rank's ``buf``."""

    @abc.abstractmethod
    def broadcast(self, buf, root, async_op, user):
        """Copy root's ``buf`` into every rank's ``buf``."""

    @abc.abstractmethod
    def reduce(self, buf, root, op, async_op, user):
        """Reduce ``buf`` over the group into root's ``buf``."""

    @abc.abstractmethod
    def allgather(self, out, inp, async_op, user):
        """Concatenate every rank's ``inp`` into ``out`` (contiguous, group-rank order)."""

    @abc.abstractmethod
    def allgather_list(self, outs: Sequence, inp, async_op, user):
        """Gather every rank's ``inp`` into ``outs[rank]`` on every rank."""

    @abc.abstractmethod
    def gather_list(self, outs: Sequence | None, inp, root, async_op, user):
        """Gather every rank's ``inp`` into root's ``outs[rank]``."""

    @abc.abstractmethod
    def scatter_list(self, out, inps: Sequence | None, root, async_op, user):
        """Send root's ``inps[rank]`` to each rank's ``out``."""

    @abc.abstractmethod
    def reduce_scatter(self, out, inp, op, async_op, user):
        """Reduce ``inp`` (group-size blocks) and leave block ``rank`` in ``out``."""

    @abc.abstractmethod
    def reduce_scatter_list(self, out, inps: Sequence, op, async_op, user):
        """Reduce ``inps[r]`` over the group into rank r's ``out``."""

    @abc.abstractmethod
    def alltoall(self, out, inp, out_counts, in_counts, async_op, user):
        """Exchange element blocks of ``inp`` (sizes ``in_counts``) into ``out`` (``out_counts``)."""

    @abc.abstractmethod
    def alltoall_list(self, outs: Sequence, inps: Sequence, async_op, user):
        """Send ``inps[r]`` to rank r, receive rank r's block into ``outs[r]``."""

    @abc.abstractmethod
    def barrier(self, async_op):
        """Wait until every rank of the group has arrived."""

    def _finish_queued(self) -> None:  # noqa: B027 - not abstract: a host transport queues nothing
        """Block the host until this rank's operations queued on a device for the group are done."""

    @abc.abstractmethod
    def send(self, buf, peer, tag, async_op, user):
        """Send ``buf`` to group rank ``peer``."""

    @abc.abstractmethod
    def recv(self, buf, peer, tag, async_op, user):
        """Receive into ``buf`` from group rank ``peer`` (None: any); blocking returns the source."""

    def _bind(self, device_id: Any) -> None:  # noqa: B027 - not abstract: a transport with no device state keeps it
        """Set up for device ``device_id`` now (collective over the group) rather than on first use
        (the group's ``device_id``; a leading underscore, so debug wrappers pass it through unrecorded)."""

    def close(self) -> None:  # noqa: B027 - not abstract: a transport with nothing to release keeps it
        """Release the transport's resources."""


class TransportWrapper:
    """Forwards to another transport; a subclass wraps the methods it cares about (debug aids).

    ``around(name, method)`` returns the method to use instead, or ``method`` itself; the
    result is kept as an attribute, so later calls skip ``__getattr__``.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.device = inner.device
        self.adapt_input, self.adapt_output = inner.adapt_input, inner.adapt_output

    def around(self, name: str, method: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name.startswith("_") or not callable(method):
            return method
        wrapped = self.around(name, method)
        setattr(self, name, wrapped)
        return wrapped

    def close(self) -> None:
        self._inner.close()
