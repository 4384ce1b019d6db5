"""A list of servers for one client: the nearest healthy one, and the next when it fails.

A client may name several servers of one fabric, nearest first: the spokes of its region,
then the hub (``http://spoke-a:8700,http://spoke-b:8700,http://hub:8600``). A
:class:`ServerSet` of more than one server probes each one's ``/healthz`` in a background
thread (every ``interval`` seconds, each probe bounded by ``probe_timeout``) and names the
*current* server: the healthy one with the lowest measured round trip, where round trips
within :func:`_near` of the best count as ties, which the earlier server in the list wins.
:meth:`ServerSet.send` sends one request to the current server and, when that fails at the
transport level or answers 502/503/504, marks it down and sends the request to the next
server, as long as sending it again is safe: always when it never left (the connection was
refused), otherwise only for requests its caller declares repeatable. A server marked down
stays last in the order until a probe finds it healthy again.

A set of one server sends straight to it: no probes, no thread, its errors unchanged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from fabric import errors
from fabric.client.breaker import CircuitOpen

log = logging.getLogger("fabric.client")

#: Seconds between probe rounds, and the most one probe may take.
PROBE_INTERVAL = 10.0
PROBE_TIMEOUT = 2.0
#: Round trips remembered per server.
SAMPLES = 3
#: Statuses that say "this server cannot serve now; another may".
FAILOVER_STATUSES = frozenset({502, 503, 504})


class Unreachable(httpx.TransportError):
    """No server of the list could take the request; the message names each and why."""


def parse_servers(spec: str | Sequence[str]) -> list[str]:
    """``"URL[,URL...]"`` (or a sequence of URLs) as a list of base URLs without a trailing
    slash; BadRequest naming the offending entry for an empty list, an empty entry, a URL
    that is not ``http(s)://host[:port][/path]``, or a server named twice."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    shown = spec if isinstance(spec, str) else ",".join(spec)
    out: list[str] = []
    for item in items:
        url = item.strip().rstrip("/")
        if not url:
            raise errors.BadRequest(f"server list {shown!r} has an empty entry: give URLs separated by commas")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise errors.BadRequest(f"server {url!r} in {shown!r} is not a URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise errors.BadRequest(f"server {url!r} in {shown!r} is not an http:// or https:// URL with a host")
        if parsed.query or parsed.fragment:
            raise errors.BadRequest(f"server {url!r} in {shown!r} has a query or fragment; give its base URL")
        if url in out:
            raise errors.BadRequest(f"server {url!r} is named twice in {shown!r}")
        out.append(url)
    return out


def _not_sent(exc: httpx.TransportError) -> bool:
    """Did the request surely not reach the server (so any request may go to another)?"""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, CircuitOpen))


def _near(rtt: float, best: float) -> bool:
    """Round trips this close to the best one are a tie (jitter of a loaded host or LAN);
    a server across a WAN is well outside it."""
    return rtt <= best * 2 + 0.010


@dataclass
class _Server:
    url: str
    up: bool = True
    samples: list[float] = field(default_factory=list)  # round trips of the last good probes, seconds
    error: str = ""  # why it was last marked down

    @property
    def rtt(self) -> float | None:
        """The least of the recent round trips: what the path costs, without the spikes."""
        return min(self.samples) if self.samples else None


class ServerSet:
    """The servers one client may use, in the order given; thread-safe."""

    def __init__(
        self,
        spec: str | Sequence[str],
        probe_timeout: float = PROBE_TIMEOUT,
        interval: float = PROBE_INTERVAL,
        verify: Any = None,
    ) -> None:
        """``verify``: how probes check TLS certificates (default: ``$FABRIC_CA_BUNDLE``, else the system's)."""
        self.urls = parse_servers(spec)
        self._servers = [_Server(u) for u in self.urls]
        self._lock = threading.Lock()
        self.failovers = 0
        self._probe_timeout = probe_timeout
        self._interval = interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._probed = threading.Event()
        self._thread: threading.Thread | None = None
        if self.multiple:
            ca = verify if verify is not None else (os.environ.get("FABRIC_CA_BUNDLE") or True)
            self._probe_client = httpx.Client(timeout=probe_timeout, verify=ca)
            self._thread = threading.Thread(target=self._probe_loop, name="fabric-server-probe", daemon=True)
            self._thread.start()

    @property
    def multiple(self) -> bool:
        return len(self.urls) > 1

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(self._probe_timeout + 1)
            self._probe_client.close()
            self._thread = None

    # -- choosing -------------------------------------------------------------
    def order(self) -> list[str]:
        """The servers to try, in turn: the current one, the other healthy ones in list
        order, then those marked down (a mark may be stale). Waits for the first probe
        round (at most the probe timeout) so the first choice is an informed one."""
        if not self.multiple:
            return list(self.urls)
        self._probed.wait(self._probe_timeout + 0.5)
        with self._lock:
            up = [s for s in self._servers if s.up]
            measured = [s.rtt for s in up if s.rtt is not None]
            best = min(measured) if measured else None
            first = next((s for s in up if best is None or (s.rtt is not None and _near(s.rtt, best))), None)
            rest = [s for s in up if s is not first] + [s for s in self._servers if not s.up]
            return ([first.url] if first else []) + [s.url for s in rest]

    def current(self) -> str:
        """The server requests go to now."""
        return self.order()[0]

    def state(self) -> list[dict]:
        """Per server: ``url``, ``up``, ``rtt_ms`` (last good probe), ``error`` (last failure)."""
        with self._lock:
            return [
                {"url": s.url, "up": s.up, "rtt_ms": None if s.rtt is None else s.rtt * 1000, "error": s.error}
                for s in self._servers
            ]

    def mark_down(self, url: str, why: str) -> None:
        """``url`` failed a request: try the others first until a probe finds it healthy."""
        with self._lock:
            changed = [s for s in self._servers if s.url == url and s.up]
            for s in changed:
                s.up, s.error = False, why
                self.failovers += 1
                log.warning("server %s marked down (%s)", url, why)
        if changed:
            self._wake.set()  # probe the others now: the next choice should be an informed one

    def _mark_up(self, url: str) -> None:
        with self._lock:
            for s in self._servers:
                if s.url == url and not s.up:
                    s.up = True
                    log.info("server %s is back", url)

    # -- sending --------------------------------------------------------------
    def send(self, attempt: Callable[[str], httpx.Response], repeatable: bool) -> tuple[str, httpx.Response]:
        """``attempt(base_url)`` on each server in :meth:`order` until one answers with a
        status other than 502/503/504: ``(base_url, response)``.

        A failure after the request may have reached a server moves on only when
        ``repeatable``; otherwise its error is raised. When every server fails, the last
        answer is returned if there was one, else :class:`Unreachable` names them all. With one
        server, its answer or error as is.
        """
        if not self.multiple:
            return self.urls[0], attempt(self.urls[0])
        order = self.order()
        failures: list[str] = []
        answer: tuple[str, httpx.Response] | None = None
        for url in order:
            try:
                response = attempt(url)
            except httpx.TransportError as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self.mark_down(url, why)
                if not (repeatable or _not_sent(exc)):
                    raise Unreachable(f"{url} failed during a request that is not safe to repeat ({why})") from exc
                failures.append(f"{url}: {why}")
                continue
            if response.status_code not in FAILOVER_STATUSES or not repeatable:
                self._mark_up(url)
                return url, response
            self.mark_down(url, f"answered {response.status_code}")
            failures.append(f"{url}: answered {response.status_code}")
            if answer is not None:
                answer[1].close()
            answer = (url, response)
        if answer is not None:
            return answer
        raise Unreachable(f"cannot reach any of {', '.join(self.urls)}: " + "; ".join(failures))

    # -- probing --------------------------------------------------------------
    def _probe_loop(self) -> None:
        with ThreadPoolExecutor(len(self.urls), thread_name_prefix="fabric-probe") as pool:
            while not self._stop.is_set():
                results = list(pool.map(self._probe, self.urls))
                with self._lock:
                    for s, (rtt, error) in zip(self._servers, results, strict=True):
                        if error is None:
                            if not s.up:
                                log.info("server %s is back (probe: %.1f ms)", s.url, rtt * 1000)
                            s.up, s.samples = True, [*s.samples[1 - SAMPLES :], rtt]
                        else:
                            s.up, s.samples, s.error = False, [], error
                self._probed.set()
                self._wake.wait(self._interval)
                self._wake.clear()

    def _probe(self, url: str) -> tuple[float, str | None]:
        """``(round trip seconds, None)`` for a healthy server, ``(0, why)`` otherwise. Two
        requests on one connection; the faster counts (the first may pay for connecting)."""
        best = float("inf")
        for _ in range(2):
            start = time.monotonic()
            try:
                response = self._probe_client.get(url + "/healthz")
            except httpx.HTTPError as exc:
                return 0.0, f"probe: {type(exc).__name__}: {exc}"
            if response.status_code != 200:
                return 0.0, f"probe: /healthz answered {response.status_code}"
            best = min(best, time.monotonic() - start)
        return best, None
