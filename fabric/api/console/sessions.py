"""Console sessions: a random session id in a cookie, the token it stands for held in memory.

The cookie carries only the id (256 random bits); the token stays in this process and is
checked again with the service's token verifier on every request, so a revoked token ends
its sessions at once. The store is bounded: at most :data:`MAX_SESSIONS` sessions, the least
recently used dropped first, each for at most :data:`SESSION_SECONDS` after sign-in. Sessions
do not outlive the process.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

#: The session cookie (path ``/ui``, HttpOnly, SameSite=Strict).
COOKIE = "fabric_console"
#: A cookie set by the sign-in form and echoed in it, so a sign-in cannot be forged cross-site.
PRE_COOKIE = "fabric_console_signin"
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 10_000


@dataclass
class Session:
    sid: str
    token: str | None  # None: authentication is off
    csrf: str
    expires: float


class SessionStore:
    def __init__(self, max_sessions: int = MAX_SESSIONS, lifetime: float = SESSION_SECONDS) -> None:
        self.max_sessions = max_sessions
        self.lifetime = lifetime
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def create(self, token: str | None) -> Session:
        s = Session(secrets.token_urlsafe(32), token, secrets.token_urlsafe(24), time.monotonic() + self.lifetime)
        with self._lock:
            self._sessions[s.sid] = s
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return None
            if s.expires <= time.monotonic():
                del self._sessions[sid]
                return None
            self._sessions.move_to_end(sid)
            return s

    def drop(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._sessions.pop(sid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def same(a: str | None, b: str | None) -> bool:
    """Constant-time comparison of two secrets (False when either is missing)."""
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())
