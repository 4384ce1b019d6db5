"""Whether a process is still there (a zombie is not), and ending one."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; False once it exited, also as a zombie (one of ours is reaped)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass  # not our child: ask /proc
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def end_process(pid: int, send: Callable[[int], None] | None = None, term_wait: float = 10.0, kill_wait: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if ``pid`` is still there after ``term_wait`` seconds; returns once
    it is gone, or ``kill_wait`` seconds after that. ``send(signal)`` sends them (default: to
    ``pid`` alone; a caller may signal its process group)."""
    send = send or (lambda sig: os.kill(pid, sig))
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, kill_wait)):
        with contextlib.suppress(ProcessLookupError):
            send(sig)
        deadline = time.monotonic() + wait
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not process_alive(pid):
            return
