"""Accounting of every byte that crosses between a spoke and its hub.

Bytes are counted at the HTTP transport (request line, headers and body one
way; status line, headers and body the other), by direction and by the
purpose the calling code declared with :meth:`Traffic.purpose`. Bytes between
spokes of one group (the LAN) go into a second :class:`Traffic` named ``peer``,
never into the hub's (the WAN).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

DEMAND = "demand"
PREFETCH = "prefetch"
PUSH = "push"
METADATA = "metadata"

_purpose: contextvars.ContextVar[str] = contextvars.ContextVar("fabric_upstream_purpose", default=METADATA)


def current_purpose() -> str:
    """What the calls to the hub made now are for (:meth:`Traffic.purpose`)."""
    return _purpose.get()


class Traffic:
    def __init__(self, name: str = "upstream") -> None:
        """``name`` prefixes the keys of :meth:`snapshot`: ``upstream`` (the hub), ``peer``."""
        self.name = name
        self._lock = threading.Lock()
        self.bytes: dict[tuple[str, str], int] = {}
        self.requests = 0

    def add(self, direction: str, purpose: str, n: int) -> None:
        with self._lock:
            key = (direction, purpose)
            self.bytes[key] = self.bytes.get(key, 0) + n

    @contextmanager
    def purpose(self, name: str) -> Iterator[None]:
        token = _purpose.set(name)
        try:
            yield
        finally:
            _purpose.reset(token)

    def total(self, direction: str) -> int:
        with self._lock:
            return sum(n for (d, _), n in self.bytes.items() if d == direction)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            out = {f"{self.name}_bytes_{'received' if d == 'in' else 'sent'}_{p}": n for (d, p), n in self.bytes.items()}
        out[f"{self.name}_bytes_received"] = self.total("in")
        out[f"{self.name}_bytes_sent"] = self.total("out")
        out[f"{self.name}_requests"] = self.requests
        return out


def _header_bytes(headers: httpx.Headers) -> int:
    return sum(len(k) + len(v) + 4 for k, v in headers.raw)


class _CountedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, count) -> None:  # noqa: ANN001 - a callable
        self._inner = inner
        self._count = count

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._inner:
            self._count(len(piece))
            yield piece

    def close(self) -> None:
        self._inner.close()


class CountingTransport(httpx.BaseTransport):
    """An httpx transport that counts bytes in both directions into a :class:`Traffic`."""

    def __init__(self, traffic: Traffic, inner: httpx.BaseTransport | None = None) -> None:
        self.traffic = traffic
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        purpose = _purpose.get()
        with self.traffic._lock:
            self.traffic.requests += 1
        head = len(request.method) + len(request.url.raw_path) + 12 + _header_bytes(request.headers)
        self.traffic.add("out", purpose, head)
        if isinstance(request.stream, httpx.SyncByteStream) and not isinstance(request.stream, httpx.ByteStream):
            request.stream = _CountedStream(request.stream, lambda n: self.traffic.add("out", purpose, n))
        else:
            self.traffic.add("out", purpose, len(request.content))
        response = self.inner.handle_request(request)
        self.traffic.add("in", purpose, 15 + _header_bytes(response.headers))
        response.stream = _CountedStream(response.stream, lambda n: self.traffic.add("in", purpose, n))  # type: ignore[arg-type]
        return response

    def close(self) -> None:
        self.inner.close()
