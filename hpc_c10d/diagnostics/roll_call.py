"""Which ranks can still be reached once an alarm is raised, found without MPI.

At an alarm each rank opens a UDP socket, leaves a card ``<run>-rank<N>.card`` (host, port,
addresses) in the dump directory and pings every rank with a card; a rank not heard from within
the grace is *silent*: dead, stopped, or cut off. Why not MPI, and the run's secret:
docs/architecture.md, "Hangs" (Who can be reached).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import struct
import threading
import time
from typing import Any

__all__ = ["RollCall", "MAX_RANKS"]

MAX_RANKS = 4096  # above: no roll call (every rank messages every other one)
_MAGIC = b"hpc_c10d-roll2"
_PING, _REPLY = b"P", b"R"  # a ping asks for an answer; a reply answers one and asks nothing
_RECEIVE_BUFFER = 1 << 20


def _ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses on interfaces that are up, loopback left out (Linux ioctls)."""
    found: list[str] = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(probe, 0x8913, request)[16:18])[0]  # SIOCGIFFLAGS
                if not flags & 0x1 or flags & 0x8:  # IFF_UP, IFF_LOOPBACK
                    continue
                address = socket.inet_ntoa(fcntl.ioctl(probe, 0x8915, request)[20:24])  # SIOCGIFADDR
            except OSError:  # no IPv4 address on it
                continue
            if address not in found:
                found.append(address)
    return found


class RollCall:
    """One rank's part in the roll call of a run (``hosts``: every world rank's host, by rank)."""

    def __init__(self, directory: str, run_id: str, rank: int, hosts: list[str], secret: bytes) -> None:
        self.directory, self.run_id, self.rank, self.hosts, self.secret = directory, run_id, rank, hosts, secret
        self.sock: socket.socket | None = None  # bound by open(), at the alarm
        self.targets: dict[int, list[tuple[str, int]]] = {}  # peers whose card was read
        self.heard: set[int] = set()
        self.outcome: dict[str, Any] | None = None  # {"answered", "silent", "waited_s"} once held
        self._lock = threading.Lock()

    def card_path(self, rank: int) -> str:
        return os.path.join(self.directory, f"{self.run_id}-rank{rank}.card")

    def open(self) -> bool:
        """Bind the socket and write this rank's card; False (and no roll call) if either fails."""
        try:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
            self.sock.bind(("0.0.0.0", 0))
            self.sock.setblocking(False)
            card = {"host": socket.gethostname(), "port": self.sock.getsockname()[1], "addresses": _ipv4_addresses()}
            os.makedirs(self.directory, exist_ok=True)
            partial = f"{self.card_path(self.rank)}.{os.getpid()}"
            with open(partial, "w") as f:
                json.dump(card, f)
            os.replace(partial, self.card_path(self.rank))  # readers never see half a card
            return True
        except OSError:
            self.close()
            return False

    def _read_cards(self) -> list[int]:
        """Read the cards that appeared since the last call; return their ranks."""
        new = []
        for peer in range(len(self.hosts)):
            if peer == self.rank or peer in self.targets:
                continue
            try:
                with open(self.card_path(peer)) as f:
                    card = json.load(f)
                port, addresses = int(card["port"]), [str(a) for a in card["addresses"]][:8]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # none yet (or a card of an older run being replaced)
            local = ["127.0.0.1"] if self.hosts[peer] == self.hosts[self.rank] else []
            self.targets[peer] = [(ip, port) for ip in dict.fromkeys(local + addresses)]
            new.append(peer)
        return new

    def _send(self, kind: bytes, peers: list[int]) -> None:
        message = _MAGIC + kind + self.secret + self.rank.to_bytes(4, "big")
        for peer in peers:
            for target in self.targets.get(peer, ()):
                try:
                    self.sock.sendto(message, target)  # type: ignore[union-attr]
                except OSError:  # no route, a full buffer: the silence tells
                    pass

    def drain(self) -> None:
        """Read every datagram waiting: each counts its sender as heard, and each ping is answered."""
        size = len(_MAGIC) + 1 + len(self.secret) + 4
        head = len(_MAGIC)  # magic, kind (1 byte), secret, sender's rank (4 bytes)
        with self._lock:
            while self.sock is not None:
                try:
                    data = self.sock.recv(256)
                except (ConnectionRefusedError, InterruptedError):  # an ICMP error reported once: read on
                    continue
                except OSError:  # nothing left (BlockingIOError)
                    break
                if len(data) != size or data[:head] != _MAGIC or data[head + 1:-4] != self.secret:
                    continue
                kind, peer = data[head:head + 1], int.from_bytes(data[-4:], "big")
                if not 0 <= peer < len(self.hosts) or peer == self.rank:
                    continue
                self.heard.add(peer)
                if kind == _PING:
                    if peer not in self.targets:
                        self._read_cards()
                    self._send(_REPLY, [peer])

    def hold(self, grace: float) -> dict[str, Any] | None:
        """Open, ping every rank with a card (again as cards appear, and once more half-way) and
        wait up to ``grace`` seconds until every other rank is heard from. Returns (and keeps)
        ``{"answered": [...], "silent": [...], "waited_s": s}`` in world ranks; held once, None if
        no socket could be opened."""
        if self.outcome is not None or (self.sock is None and not self.open()):
            return self.outcome
        start = time.monotonic()
        deadline, again = start + grace, start + grace / 2
        peers = set(range(len(self.hosts))) - {self.rank}
        while True:
            with self._lock:
                self._send(_PING, self._read_cards())
            self.drain()
            now = time.monotonic()
            if peers <= self.heard or now >= deadline:
                break
            if now >= again:  # a datagram may be lost: ping the silent once more
                with self._lock:
                    self._send(_PING, sorted(set(self.targets) - self.heard))
                again = deadline
            self.wait(min(0.05, deadline - now))
        self.outcome = {"answered": sorted(self.heard & peers), "silent": sorted(peers - self.heard),
                        "waited_s": round(time.monotonic() - start, 2)}
        return self.outcome

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, answering what arrives meanwhile."""
        if self.sock is None:
            time.sleep(seconds)
            return
        select.select([self.sock], [], [], seconds)
        self.drain()

    def close(self) -> None:
        """Close the socket and take this rank's card away."""
        if self.sock is None:
            return
        self.sock.close()
        self.sock = None
        try:
            os.unlink(self.card_path(self.rank))
        except OSError:
            pass
