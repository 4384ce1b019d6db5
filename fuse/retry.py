"""Riding out server restarts: retry transient failures until the server timeout.

A mount must outlive its server. Every call the filesystem makes to the data
plane goes through :meth:`Health.call`: connection errors and
:class:`~fabric.errors.Unavailable` are retried with backoff, so a request
in flight while the spoke (or hub) restarts waits and then resumes. The
outage is shared by all callers: once the server has been unreachable for
longer than ``timeout`` seconds, calls fail at once (after one quick try)
with :class:`ServerGone`, which the filesystem turns into ``EIO``; the first
call that gets through ends the outage and the mount carries on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from fabric.errors import FabricError, Unavailable

log = logging.getLogger("fabric.fuse")

T = TypeVar("T")

#: Backoff between retries: starts small (a restart takes a second or two), capped.
FIRST_DELAY = 0.05
MAX_DELAY = 1.0


class ServerGone(Exception):
    """The server stayed unreachable for longer than the mount's server timeout."""


def is_transient(exc: BaseException) -> bool:
    """Failures that a restart of the server explains: worth retrying."""
    if isinstance(exc, Unavailable):
        return True
    if isinstance(exc, FabricError):
        return exc.status in (502, 503, 504)
    return isinstance(exc, (httpx.TransportError, httpx.StreamError, ConnectionError, TimeoutError))


class Health:
    """Shared view of the server's reachability, and the retry loop that uses it."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.retries = 0
        self.outages = 0

    def ok(self) -> None:
        if self.down_since is not None:
            with self._lock:
                if self.down_since is not None:
                    log.warning("server reachable again after %.1fs", time.monotonic() - self.down_since)
                    self.down_since = None

    def failed(self, exc: BaseException) -> float:
        """Record a transient failure; return when the current outage runs out of time."""
        with self._lock:
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.outages += 1
                log.warning("server unreachable (%s); retrying for up to %.0fs", _short(exc), self.timeout)
            self.retries += 1
            return self.down_since + self.timeout

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)``, retried on transient failures until the outage exceeds the timeout."""
        delay = FIRST_DELAY
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                give_up_at = self.failed(exc)
                now = time.monotonic()
                if now >= give_up_at:
                    raise ServerGone(f"server unreachable for over {self.timeout:.0f}s: {_short(exc)}") from exc
                time.sleep(min(delay, give_up_at - now))
                delay = min(delay * 2, MAX_DELAY)
                continue
            self.ok()
            return result


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "..."
