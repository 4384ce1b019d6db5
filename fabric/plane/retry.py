"""Riding out server restarts: a data plane that retries transient failures until the server timeout.

A client of a remote plane (a mount) must outlive its server. Every call made
through :class:`RetryingPlane` retries connection errors and
:class:`~fabric.errors.Unavailable` with backoff, so a request in flight while
the spoke (or hub) restarts waits and then resumes. The outage is shared by all
callers (:class:`Health`): once the server has been unreachable for longer than
``timeout`` seconds, calls fail at once (after one quick try) with
:class:`ServerGone` (a mount turns it into ``EIO``); the first call that gets
through ends the outage.

A call that returns an iterator (``walk``, ``frames``, ``read_stream``,
``diff``...) is retried while it is created, not while it is consumed: a caller
that needs the consumption retried as well runs that unit of work through
:meth:`RetryingPlane.retried`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx

from fabric.errors import FabricError, Unavailable
from fabric.plane.wrapper import PlaneWrapper

log = logging.getLogger("fabric.plane")

T = TypeVar("T")

#: Backoff between retries: starts small (a restart takes a second or two), capped.
FIRST_DELAY = 0.05
MAX_DELAY = 1.0


class ServerGone(Exception):
    """The server stayed unreachable for longer than the server timeout."""


def is_transient(exc: BaseException) -> bool:
    """Failures that a restart of the server explains: worth retrying."""
    if isinstance(exc, Unavailable):
        return True
    if isinstance(exc, FabricError):
        return exc.status in (502, 503, 504)
    return isinstance(exc, (httpx.TransportError, httpx.StreamError, ConnectionError, TimeoutError))


class Health:
    """Shared view of the server's reachability: when the current outage began, and counters."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.retries = 0
        self.outages = 0

    def ok(self) -> None:
        """A call got through: the outage (if any) is over."""
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


class RetryingPlane(PlaneWrapper):
    """A plane whose every public call is retried on transient failures, under ``health``'s outage."""

    def __init__(self, inner: Any, health: Health) -> None:
        super().__init__(inner)
        self.health = health

    def around(self, name: str, call: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> Any:
        return self._retry(call, *args, **kwargs)

    def retried(self, unit: Callable[[Any], T]) -> T:
        """``unit(inner)`` retried as a whole, for work one retried call cannot cover (consuming
        an iterator, several calls that must succeed together).

        ``unit`` is given the inner (unwrapped) plane: its calls are not retried one by one, so a call
        that answers at once without reaching the server (creating a lazy iterator) cannot end
        the outage while the unit as a whole still fails.
        """
        return self._retry(unit, self.inner)

    def _retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried on transient failures until the outage exceeds the timeout."""
        delay = FIRST_DELAY
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                give_up_at = self.health.failed(exc)
                now = time.monotonic()
                if now >= give_up_at:
                    raise ServerGone(f"server unreachable for over {self.health.timeout:.0f}s: {_short(exc)}") from exc
                time.sleep(min(delay, give_up_at - now))
                delay = min(delay * 2, MAX_DELAY)
                continue
            self.health.ok()
            return result


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "..."
