"""A circuit breaker for every request to one server, as an httpx transport.

A server that hangs (a stopped process, a silent network path) costs each
request its full timeout. With a :class:`CircuitBreaker` shared by all requests
to that server, the first request that times out opens the circuit; further
requests fail at once with :class:`CircuitOpen` (an ``httpx.TransportError``,
which :class:`~fabric.client.http.HttpPlane` turns into ``Unavailable``) instead
of each waiting for its own timeout. Every ``retry_after`` seconds one request
is let through as a probe (half-open); the first answer closes the circuit.

Only timeouts open it: a refused or reset connection fails fast by itself, so
a server that restarts is used again as soon as it listens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx

#: Seconds between probes while the circuit is open.
RETRY_AFTER = 2.0


class CircuitOpen(httpx.TransportError):
    """The server has not answered recently: the request was not sent."""


class CircuitBreaker:
    """Open after a timeout, closed by the next answer; one probe per ``retry_after`` while open.

    Thread-safe; shared by every request to one server."""

    def __init__(self, retry_after: float = RETRY_AFTER, clock: Callable[[], float] = time.monotonic) -> None:
        if retry_after <= 0:
            raise ValueError("retry_after must be positive")
        self.retry_after = retry_after
        self._clock = clock
        self._lock = threading.Lock()
        self._open_since: float | None = None  # wall-clock time, for display
        self._next_probe = 0.0
        self._last_error = ""
        self.trips = 0

    def admit(self) -> None:
        """Let a request through, or raise :class:`CircuitOpen` when the circuit is open and it is not time to probe."""
        with self._lock:
            if self._open_since is None:
                return
            now = self._clock()
            if now >= self._next_probe:
                self._next_probe = now + self.retry_after  # this request is the probe; the next one waits
                return
            since = time.time() - self._open_since
        raise CircuitOpen(f"no answer for {since:.1f}s ({self._last_error}); not asking again yet")

    def succeeded(self) -> None:
        """The server answered (any status): close the circuit."""
        with self._lock:
            self._open_since = None
            self._last_error = ""

    def failed(self, exc: BaseException) -> None:
        """A request timed out: open the circuit (or keep it open until the next probe)."""
        with self._lock:
            if self._open_since is None:
                self._open_since = time.time()
                self.trips += 1
            self._next_probe = self._clock() + self.retry_after
            self._last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._open_since is None

    def state(self) -> dict:
        """``reachable``, ``open_since`` (Unix time or None), ``trips`` (times it opened), ``last_error``."""
        with self._lock:
            return {
                "reachable": self._open_since is None,
                "open_since": self._open_since,
                "trips": self.trips,
                "last_error": self._last_error,
            }


def _trips(exc: httpx.TransportError) -> bool:
    """Does this failure say the server is not answering? (A full local pool does not.)"""
    return isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.PoolTimeout)


class _WatchedStream(httpx.SyncByteStream):
    """A response body whose stall (a read timeout between chunks) opens the circuit too."""

    def __init__(self, inner: httpx.SyncByteStream, breaker: CircuitBreaker) -> None:
        self._inner = inner
        self._breaker = breaker

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except httpx.TransportError as exc:
            if _trips(exc):
                self._breaker.failed(exc)
            raise

    def close(self) -> None:
        self._inner.close()


class BreakerTransport(httpx.BaseTransport):
    """An httpx transport that sends requests through ``inner`` only while ``breaker`` lets them."""

    def __init__(self, breaker: CircuitBreaker, inner: httpx.BaseTransport) -> None:
        self.breaker = breaker
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.breaker.admit()
        try:
            response = self._inner.handle_request(request)
        except httpx.TransportError as exc:
            if _trips(exc):
                self.breaker.failed(exc)
            raise
        self.breaker.succeeded()
        if isinstance(response.stream, httpx.SyncByteStream):
            response.stream = _WatchedStream(response.stream, self.breaker)
        return response

    def close(self) -> None:
        self._inner.close()
