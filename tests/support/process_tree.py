"""A stage's whole process tree, read from /proc (Linux): to end it, and to tie a child to its parent."""
from __future__ import annotations

import os
import signal
import subprocess
import time

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the child is SIGKILLed when its parent dies (Linux's prctl); nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _parent_and_state(pid: str) -> tuple[int, bytes]:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command may hold spaces and parentheses
    return int(fields[1]), fields[0]


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            children.setdefault(_parent_and_state(entry)[0], []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _parent_and_state(str(pid))[1] != b"Z"
    except (OSError, ValueError, IndexError):
        return True


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, the process group of ``proc`` and every descendant."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [proc.pid, *descendants(proc.pid)]
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            time.sleep(0.5)  # the launcher is gone; no rank may outlive it
            if not any(alive(pid) for pid in pids):
                return
