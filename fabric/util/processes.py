"""Whether a process is still there (a zombie is not)."""

from __future__ import annotations

import os


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
