"""Refusal notices: one rank's refusal of a collective's arguments ends the others' wait for it.

A rank that refuses its own arguments (TypeError, ValueError: nothing was sent) sends a *notice*
to the group's other members on the process's notice communicator (a duplicate of the world). A
member waiting for that collective, or past it, raises ``DistBackendError`` naming the rank, the
operation, its sequence number and the message, and tells the others the group is unusable; a
member that refused the same call itself drops the notice (every rank refused alike: nothing
hangs, the group stays usable). Waits on MPI requests (``Work.wait``, backend "hpc"'s bounded
waits) watch the notice request beside their own (``MPI_Waitany``, or a test in their polling
loop). MPI's blocking calls cannot be interrupted: a rank inside one when the notice comes is
ended by the watchdog, naming the refusal (mode ``abort``, the default), unless mode ``raise``
makes every blocking call a nonblocking one and a wait (about 2 µs more per small call).

A refused receive drops the message its peer and tag name if it has arrived, so a later receive
does not take it (one sent after the refusal stays queued, as in torch). Design: docs/architecture.md,
"Hangs" (Refusal notices).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections import deque
from functools import wraps
from typing import Any, Callable, NamedTuple


from ..errors import DistBackendError
from ..process_group import VALIDATING
from ..work import spin

__all__ = ["SWITCH", "MODES", "mode", "NoticeBoard", "RefusalWatch", "watch_refusals"]

SWITCH = "HPC_C10D_REFUSAL_NOTICES"

_TAG = 7
_SIZE = 4096  # a notice's bytes at most (its message is cut to fit)
_MESSAGE_CHARS = 1500
_REMEMBERED = 1024  # this rank's own refusals kept, to recognise the same refusal by others
_POLL_MAX_S = 1e-3  # a wait that cannot watch the notice request itself polls at most this far apart


MODES = ("abort", "raise", "off")


def mode() -> str:
    """``HPC_C10D_REFUSAL_NOTICES``: ``abort`` (unset: waits raise, a rank inside MPI's blocking
    call ends the job), ``raise`` (blocking calls wait too, and raise) or ``off``; ValueError otherwise."""
    text = os.environ.get(SWITCH, "").strip().lower() or "abort"
    if text not in MODES:
        raise ValueError(f"{SWITCH}={text!r}: use abort (the default), raise or off")
    return text


def _refusal(notice: "Notice") -> str:
    """A refused notice in words: the call, its group, the rank and its error."""
    return (f"{notice.op} #{notice.seq} in group {notice.group!r}: rank {notice.rank} refused its arguments "
            f"({notice.message})")


class Notice(NamedTuple):
    """What one rank tells the others: ``"refused"`` call ``seq`` of ``group`` (its arguments), or
    ``"unusable"``: the group is out of step since some rank's refusal. ``before``: refused before
    the call took its sequence number, so before it could communicate (the group's checks; a
    transport refuses later, perhaps after an exchange that every rank ends refusing alike)."""

    kind: str
    group: str
    seq: int
    op: str
    rank: int
    message: str
    before: bool


class NoticeBoard:
    """This process's notice communicator: one receive always posted, the notices that arrived
    (by group name), and the sends not yet known to be complete."""

    def __init__(self, comm: Any, MPI: Any, raising: bool) -> None:  # noqa: N803 - the module, once MPI runs
        self.MPI = MPI
        self.raising = raising  # mode "raise": blocking calls wait watching the notices, and raise
        self._comm = comm
        self._buffer = bytearray(_SIZE)
        self.status = MPI.Status()  # the notice receive's, used holding ``lock``
        self.request = comm.Irecv(self._buffer, MPI.ANY_SOURCE, _TAG)
        self.lock = threading.Lock()  # held by whoever tests or waits on ``request``
        self.arrived: dict[str, list[Notice]] = {}
        self._sent: list[tuple[Any, bytes]] = []
        self.broken = False  # the communicator failed (a dead rank under ULFM) or was closed: notices stop

    def post(self, world_ranks: list[int], notice: Notice) -> None:
        """Send ``notice`` to ``world_ranks`` (nonblocking; a rank that cannot be reached is skipped)."""
        if self.broken:
            return
        data = pickle.dumps(notice._replace(message=notice.message[:_MESSAGE_CHARS]))
        self._sent = [(request, kept) for request, kept in self._sent if not request.Test()]
        for rank in world_ranks:
            try:
                self._sent.append((self._comm.Isend(data, rank, _TAG), data))
            except self.MPI.Exception:
                self.broken = True

    def take(self, status: Any) -> None:
        """File the notice that ``request`` received (``status`` its status) and post the next receive."""
        notice = pickle.loads(self._buffer[:status.Get_count(self.MPI.BYTE)])
        self.arrived.setdefault(notice.group, []).append(notice)
        self.request = self._comm.Irecv(self._buffer, self.MPI.ANY_SOURCE, _TAG)

    def collect(self) -> None:
        """File every notice that has arrived, unless another thread is waiting on the board."""
        if self.broken or not self.lock.acquire(blocking=False):
            return
        try:
            while self.request.Test(self.status):
                self.take(self.status)
        except self.MPI.Exception:
            self.broken = True
        finally:
            self.lock.release()

    def close(self) -> None:
        """Stop receiving; cancel what no rank received (every rank, as it leaves; not collective)."""
        for request in [self.request, *(request for request, _ in self._sent)]:
            try:
                if not request.Test():
                    request.Cancel()
                    request.Wait()
            except self.MPI.Exception:
                pass
        self._sent = []
        self._comm.Free()
        self.broken = True  # groups destroyed after the board (torch destroys the default group first) find it shut


class RefusalWatch:
    """One group's side of the notices: what it refused, what it was told, and its waits."""

    def __init__(self, board: NoticeBoard, pg: Any) -> None:
        self._board = board
        self._pg = pg
        self.raising = board.raising  # blocking calls wait here too (and raise), instead of in MPI
        self._others = [rank for rank in pg._global_ranks if rank != pg._global_ranks[pg._rank]]
        self._refused: deque[int] = deque(maxlen=_REMEMBERED)  # sequence numbers this rank refused
        self._abandoned: list[Any] = []  # requests (and buffers) of waits a notice ended
        self._unanswered: set[int] = set()  # members yet to say what they did with this rank's latest refusal
        self._answering_seq = 0  # the sequence number of that refusal
        self.unusable: str | None = None
        self.unsettled = False  # unusable, or a refusal not yet answered by every member: see settle()

    @property
    def _error(self) -> type[Exception]:
        """What the group raises for a transport's failure (torch's DistBackendError under torch)."""
        return getattr(self._pg, "_backend_error", DistBackendError)

    # ---- this rank refuses -----------------------------------------------------------------
    def refused(self, op: str, seq: int, error: Exception, before: bool) -> None:
        """Tell the others this rank refused call ``seq`` (``op``) with ``error`` (``before``: see Notice)."""
        self._refused.append(seq)
        if self._others:
            self._unanswered = {rank for rank in range(self._pg._size) if rank != self._pg._rank}
            self._answering_seq, self.unsettled = seq, True
            self._board.post(self._others, Notice("refused", self._pg._name, seq, op, self._pg._rank,
                                                  f"{type(error).__name__}: {error}", before))

    def drop_message(self, peer: int | None, tag: int) -> None:
        """Take and drop the message a refused receive named, if it has arrived (one sent later
        stays for the next receive): no later receive gets the message meant for the refused one."""
        MPI = self._board.MPI
        status = MPI.Status()
        message = self._pg.comm.Improbe(MPI.ANY_SOURCE if peer is None else peer, tag, status)
        if message is not None:
            message.Recv([bytearray(status.Get_count(MPI.BYTE)), MPI.BYTE])

    # ---- what the others said ----------------------------------------------------------------
    def check(self, waiting: Any = None) -> None:
        """Raise if a notice means this rank waits for, or went past, a call another rank refused;
        ``waiting`` (what a wait's requests use) is then kept alive, as MPI may still write there."""
        try:
            self._check()
        except self._error:
            if waiting is not None:
                self._abandoned.append(waiting)
            raise

    def _check(self) -> None:
        self._board.collect()
        if self.unusable is not None:
            raise self._error(self.unusable)
        arrived = self._board.arrived
        notices = arrived.pop(self._pg._name, None)  # taken whole: the watchdog's thread may file more meanwhile
        if not notices:
            return
        seq, pending = self._pg._seq, []
        for notice in notices:
            if notice.kind == "refused" and notice.seq in self._refused:
                if notice.seq == self._answering_seq:
                    self._unanswered.discard(notice.rank)
                continue  # this rank refused that call too
            if notice.kind == "refused" and notice.seq > seq:
                pending.append(notice)  # a call this rank has not reached yet
                continue
            self._give_up(notice)
        if pending:
            arrived.setdefault(self._pg._name, []).extend(pending)

    def refusal_against(self, seq: int) -> str | None:
        """What a notice says of call ``seq``, which this rank is inside (for the watchdog, about
        a thread in MPI's blocking call): the refusal or the group's unusability, else None. Only
        a refusal before the call began counts: one after may end an exchange that this rank,
        still inside it, is about to end refusing alike."""
        self._board.collect()
        if self.unusable is not None:
            return self.unusable
        for notice in self._board.arrived.get(self._pg._name, ()):
            if notice.kind == "unusable" or notice.before and notice.seq <= seq and notice.seq not in self._refused:
                return _refusal(notice) if notice.kind == "refused" else notice.message
        return None

    def settle(self) -> None:
        """Before this rank's next call after a refusal: wait until every member refused the same
        call (go on) or one says it took part (raise: the group is out of step), at most the
        group's timeout. Its next call would otherwise match what the others still wait in."""
        deadline = time.monotonic() + self._pg._timeout.total_seconds()
        pause = 1e-6
        self.check()
        while self._unanswered:
            if time.monotonic() > deadline:
                self.unusable = (f"group {self._pg._name!r}: ranks {sorted(self._unanswered)} did not say within the "
                                 f"timeout whether they refused call #{self._answering_seq} too, as this rank did")
                raise self._error(self.unusable)
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
            self.check()
        self.unsettled = False

    def leave(self) -> None:
        """As the group is destroyed: answer a refusal this rank took part in (the refusing rank
        waits for the answer in its next call, which may come before its own destroy)."""
        try:
            self.check()
        except self._error:
            pass

    def _give_up(self, notice: Notice) -> None:
        pg = self._pg
        self.unsettled = True
        if notice.kind == "refused":
            self.unusable = f"{_refusal(notice)} while rank {pg._rank} took part; the group is unusable now"
            self._board.post(self._others, notice._replace(kind="unusable", rank=pg._rank, message=self.unusable))
        else:
            self.unusable = notice.message
        raise self._error(self.unusable)

    # ---- waits -------------------------------------------------------------------------------
    def finish(self, request: Any, keep: Any = None) -> None:
        """A blocking call's wait (the transport's ``finish_within``): a short spin first, which
        ends most small calls (half the cost of a wait watching the notices, 2 ranks, MPICH)."""
        if not spin(request.Test):
            self.wait([request], None, keep)

    def wait(self, requests: list, status: Any, keep: Any) -> None:
        """Wait for every one of ``requests`` (``status``: the last one's), or raise for a notice."""
        board = self._board
        if board.broken:  # no notices come any more: MPI's own wait
            if len(requests) == 1:
                requests[0].Wait(status)
            else:
                board.MPI.Request.Waitall(requests)
            return
        try:
            if not board.lock.acquire(blocking=False):
                self._poll(requests, status)
                return
            try:
                self._wait_any(requests, board.status if status is None else status)
            finally:
                board.lock.release()
        except self._error:
            self._abandoned.append((requests, keep))
            raise

    def _wait_any(self, requests: list, status: Any) -> None:
        """``wait``'s loop, holding the board: ``MPI_Waitany`` over the requests not yet complete
        and the notice receive (an MPI error there stops the notices: ULFM's dead rank)."""
        board = self._board
        MPI = board.MPI
        live = [request for request in requests if request]
        while live:
            live.append(board.request)
            try:
                index = MPI.Request.Waitany(live, status)
            except MPI.Exception:
                board.broken = True
                raise
            if index == len(live) - 1:
                board.take(status)
                self.check()
            live = [request for request in live[:-1] if request]

    def _poll(self, requests: list, status: Any) -> None:
        """The wait of a thread that cannot watch the notice request (another thread does)."""
        pause, Request = 1e-6, self._board.MPI.Request
        while not (requests[0].Test(status) if len(requests) == 1 else Request.Testall(requests)):
            self.check()
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)


def _watched(pg: Any, watch: RefusalWatch, name: str, op: str) -> Callable[..., Any]:
    """``pg``'s validating method ``name``: a refusal is told to the others and uses up its sequence
    number (as on every rank that refuses alike); an unusable group raises before anything."""
    method = getattr(pg, name)

    @wraps(method)
    def watched(*args: Any) -> Any:
        if watch.unsettled:
            watch.settle()
        seq = pg._seq
        try:
            return method(*args)
        except (TypeError, ValueError) as error:
            before = pg._seq == seq
            pg._seq = seq + 1
            watch.refused(op, seq + 1, error, before)
            raise

    return watched


def _watched_receive(pg: Any, watch: RefusalWatch) -> Callable[..., Any]:
    """``pg._recv``: a refused receive (its peer and tag valid) drops the message it names, if it came."""
    method = pg._recv

    @wraps(method)
    def watched(tensor: Any, peer: Any, tag: Any, async_op: bool) -> Any:
        if watch.unsettled:
            watch.settle()
        try:
            return method(tensor, peer, tag, async_op)
        except (TypeError, ValueError):
            if (peer is None or type(peer) is int and 0 <= peer < pg._size) and type(tag) is int and (
                    0 <= tag <= pg._tag_ub):
                watch.drop_message(peer, tag)
            raise

    return watched


def watch_refusals(pg: Any, board: NoticeBoard) -> RefusalWatch:
    """Install the notices on ``pg`` (before its debug wrappers): its validating methods tell
    refusals, its transports' waits (in mode ``raise``, its blocking calls' too) watch for the others'."""
    watch = RefusalWatch(board, pg)
    for name, op in VALIDATING.items():  # instance attributes, in front of the class's methods
        setattr(pg, name, _watched(pg, watch, name, op))
    pg._recv = _watched_receive(pg, watch)
    pg._watch_with(watch)
    return watch
