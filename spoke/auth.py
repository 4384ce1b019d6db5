"""Callers' tokens at a spoke: checked with the hub, cached briefly, enforced while it is away.

A spoke never lets its own token stand in for a caller's: every request is
authenticated as the caller (``/auth/whoami`` at the hub with the caller's
token) and the caller's roles are enforced here. A verdict is reused for
``ttl`` seconds; while the hub is unreachable the last verdict for a token
keeps being used (also across a restart of the spoke), and a token the spoke
has never seen is refused.
"""

from __future__ import annotations

import hashlib
import threading
import time

import httpx

from fabric.auth.principal import Principal
from fabric.client.http import raise_for_error
from fabric.client.servers import ServerSet
from fabric.errors import Unauthorized, Unavailable

from .state import SpokeState
from .traffic import METADATA, CountingTransport, Traffic


class SpokeAuth:
    def __init__(
        self,
        hub_url: str,
        traffic: Traffic,
        state: SpokeState,
        ttl: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout | float = 10.0,
    ) -> None:
        """``transport`` defaults to counting traffic; a spoke passes the one behind its hub
        circuit breaker, so token checks fail fast (and fall back) while the hub is hung."""
        self.traffic = traffic
        self.state = state
        self.ttl = ttl
        self._hubs = ServerSet(hub_url)  # one hub, or several sharing one catalog: the next when one fails
        self._http = httpx.Client(timeout=timeout, transport=transport or CountingTransport(traffic))
        self._lock = threading.Lock()
        # Verdicts from before a restart are expired: used only while the hub is away.
        self._seen: dict[str, tuple[float, Principal | None]] = {
            h: (float("-inf"), Principal.from_dict(p)) for h, p in state.tokens().items()
        }

    def authenticate(self, token: str) -> Principal:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._seen.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return _verdict(hit[1])
        try:
            with self.traffic.purpose(METADATA):
                headers = {"Authorization": f"Bearer {token}"}
                _, response = self._hubs.send(lambda hub: self._http.get(hub + "/api/v1/auth/whoami", headers=headers), True)
        except httpx.TransportError:
            if hit is not None:
                return _verdict(hit[1])
            raise Unavailable(
                "cannot check your token: the hub is unreachable and this spoke has not seen the token recently"
            ) from None
        if response.status_code == 401:
            principal = None
        else:
            raise_for_error(response)
            d = response.json()
            principal = Principal.from_dict(d)
        if hit is None or hit[1] != principal:
            self.state.save_token(key, principal.describe() if principal else None)
        with self._lock:
            if len(self._seen) > 10000:
                self._seen.clear()
            self._seen[key] = (now, principal)
        return _verdict(principal)

    def forget(self, token_id: str) -> None:
        """Ask the hub again about ``token_id`` next time (its roles just changed: it created a
        repository); the old verdict stays for while the hub is away."""
        with self._lock:
            for key, (_, principal) in list(self._seen.items()):
                if principal is not None and principal.token_id == token_id:
                    self._seen[key] = (float("-inf"), principal)


def _verdict(principal: Principal | None) -> Principal:
    if principal is None:
        raise Unauthorized("unknown or revoked token (checked with the hub)")
    return principal
