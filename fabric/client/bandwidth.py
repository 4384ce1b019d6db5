"""A cap on the bytes a client moves per second: ``--bwlimit`` (the command line, a mount) and
``fabric spoke --hub-bwlimit`` (a spoke's traffic with its hub).

A job sharing a WAN link with others (a training job's own reads, another region's copy) may
take only part of it, as rsync's and rclone's ``--bwlimit`` and JuiceFS's
``--upload-limit``/``--download-limit`` allow. The limit is a token bucket per direction,
shared by every request of the client: a piece of a response body is handed over, and a piece
of a request body sent, once the bucket holds its bytes. A reader that stops reading makes
the server wait (TCP's own back-pressure), so nothing piles up in memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

from fabric.errors import BadRequest
from fabric.util.sizes import parse_size

#: What the bucket may hold, in seconds of its rate: a burst after a pause is this long.
BURST_SECONDS = 0.1


class TokenBucket:
    """``rate`` bytes a second; :meth:`take` waits until the bytes taken so far are due.

    Background takers (a spoke's prefetch) come after the others: one takes only while the
    bucket owes nothing, so a demand read waits for at most one background piece, never for
    a queue of them (issue 14: background prefetch never delays a demand read)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError("a rate is more than 0 bytes a second")
        self.rate = float(rate)
        self._burst = self.rate * BURST_SECONDS
        self._clock = clock
        self._sleep = sleep
        self._tokens = self._burst
        self._last = clock()
        self._lock = threading.Lock()

    def take(self, n: int, background: bool = False) -> None:
        """Count ``n`` bytes, waiting as long as they are ahead of the rate. The bucket may go
        into debt for a piece larger than it holds: the next taker waits for that too. A
        ``background`` taker first waits until the bucket owes nothing."""
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self._burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if not background or self._tokens >= 0:
                    self._tokens -= n
                    wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
                    break
                owed = -self._tokens / self.rate
            self._sleep(owed)  # then look again: a demand taker may have gone into debt meanwhile
        if wait > 0:
            self._sleep(wait)


@dataclass(frozen=True)
class Bandwidth:
    """The caps of a client: bytes a second sent (``up``) and received (``down``); None: no cap."""

    up: TokenBucket | None = None
    down: TokenBucket | None = None

    def __bool__(self) -> bool:
        return self.up is not None or self.down is not None


def parse_bwlimit(text: str) -> Bandwidth:
    """``RATE`` (both directions) or ``UP:DOWN``, each bytes a second with an optional K, M or
    G (binary: 10M is 10 MiB/s) or ``off``; BadRequest for anything else."""
    parts = text.strip().split(":")
    if len(parts) > 2:
        raise BadRequest(f"--bwlimit {text!r}: give RATE or UP:DOWN, e.g. 50M or 10M:100M")
    rates = [_rate(part, text) for part in parts]
    up, down = (rates[0], rates[0]) if len(rates) == 1 else rates
    return Bandwidth(TokenBucket(up) if up else None, TokenBucket(down) if down else None)


def _rate(part: str, text: str) -> int:
    """Bytes a second of one side of ``--bwlimit`` (a size, :func:`parse_size`, with an optional
    ``/s``); 0 for ``off``."""
    part = part.strip()
    if part.lower() == "off":
        return 0
    try:
        rate = parse_size(part.removesuffix("/s"))
    except BadRequest:
        rate = 0
    if rate <= 0:
        raise BadRequest(f"--bwlimit {text!r}: a rate is a number of bytes a second above 0, with K, M or G (e.g. 50M), or 'off'")
    return rate


class ThrottledTransport(httpx.BaseTransport):
    """An httpx transport that sends and receives bodies no faster than ``bandwidth``.
    ``background()``, asked as a request starts, tells one that gives way to the others
    (:meth:`TokenBucket.take`)."""

    def __init__(self, inner: httpx.BaseTransport, bandwidth: Bandwidth, background: Callable[[], bool] | None = None) -> None:
        self.inner = inner
        self.bandwidth = bandwidth
        self._background = background

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        up, down = self.bandwidth.up, self.bandwidth.down
        background = self._background is not None and self._background()
        if up is not None:
            if isinstance(request.stream, httpx.SyncByteStream) and not isinstance(request.stream, httpx.ByteStream):
                request.stream = _Paced(request.stream, up, background)
            else:
                up.take(len(request.content), background)
        response = self.inner.handle_request(request)
        if down is not None:
            response.stream = _Paced(response.stream, down, background)  # type: ignore[arg-type]
        return response

    def close(self) -> None:
        self.inner.close()


class _Paced(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, bucket: TokenBucket, background: bool) -> None:
        self._inner = inner
        self._bucket = bucket
        self._background = background

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._inner:
            self._bucket.take(len(piece), self._background)
            yield piece

    def close(self) -> None:
        self._inner.close()
