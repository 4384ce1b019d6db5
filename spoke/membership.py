"""Who is in this spoke's group: a static list, or the hub's answer to its heartbeats.

:class:`StaticMembership` (``fabric spoke --peers``) never changes.
:class:`HubMembership` (``fabric spoke --group``) sends a heartbeat to the hub
(:mod:`hub.groups`) at the interval the hub asks for; each answer is the
group's live member list. While the hub cannot be reached the last list is
kept: the peers are still there, and the group keeps serving the region. On
close the spoke leaves the group at once.
"""

from __future__ import annotations

import logging
import threading

import httpx

from fabric.client.http import raise_for_error
from fabric.client.servers import ServerSet
from fabric.errors import BadRequest, FabricError, Forbidden, Unauthorized
from fabric.util.groups import check_group_name, member_url

from .traffic import METADATA, Traffic

log = logging.getLogger("fabric.spoke.group")

#: Seconds between heartbeats until the hub says otherwise, and the bounds on what it may say.
DEFAULT_HEARTBEAT, MIN_HEARTBEAT, MAX_HEARTBEAT = 2.0, 0.2, 60.0


class StaticMembership:
    """A fixed group: this spoke and the peers it was given."""

    def __init__(self, me: str, peers: list[str]) -> None:
        self.me = member_url(me)
        self._members = tuple(sorted({self.me, *(member_url(p) for p in peers)}))

    def members(self) -> tuple[str, ...]:
        return self._members

    def describe(self) -> dict:
        return {"group": None, "source": "static", "me": self.me, "members": list(self._members)}

    def close(self) -> None:
        return None


class HubMembership:
    """Membership of group ``group`` as registered at the hub, refreshed by heartbeats."""

    def __init__(
        self,
        me: str,
        group: str,
        hub_url: str,
        token: str | None,
        traffic: Traffic,
        transport: httpx.BaseTransport,
        timeout: float = 5.0,
    ) -> None:
        self.me = member_url(me)
        self.group = check_group_name(group)
        self.traffic = traffic
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._hubs = ServerSet(hub_url)  # one hub, or several sharing one catalog (and so one membership)
        self._http = httpx.Client(headers=headers, timeout=timeout, transport=transport)
        self._path = f"/api/v1/groups/{self.group}/members"
        self._members: tuple[str, ...] = (self.me,)
        self._interval = DEFAULT_HEARTBEAT
        self._stop = threading.Event()
        self.heartbeats = self.failures = 0
        self.last_error: str | None = None
        # Known at once when the hub answers; a hub that refuses (a token without the spoke
        # right, a bad URL) stops the spoke here; one that cannot be reached is asked again.
        self._beat(refusals=True)
        self._thread = threading.Thread(target=self._run, name="group-heartbeat", daemon=True)
        self._thread.start()

    def members(self) -> tuple[str, ...]:
        return self._members

    def describe(self) -> dict:
        return {
            "group": self.group,
            "source": "hub",
            "me": self.me,
            "members": list(self._members),
            "heartbeats": self.heartbeats,
            "heartbeat_failures": self.failures,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        """Stop the heartbeats and leave the group (best effort: it expires at the hub anyway)."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            with self.traffic.purpose(METADATA):
                self._hubs.send(lambda hub: self._http.delete(hub + self._path, params={"url": self.me}), True)
        except (httpx.HTTPError, FabricError):
            pass
        self._http.close()
        self._hubs.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._beat()

    def _beat(self, refusals: bool = False) -> None:
        """One heartbeat; ``refusals``: raise the hub's refusals instead of logging them."""
        try:
            with self.traffic.purpose(METADATA):
                _, response = self._hubs.send(lambda hub: self._http.post(hub + self._path, json={"url": self.me}), True)
            raise_for_error(response)
            body = response.json()
            members = tuple(sorted({self.me, *(member_url(m) for m in body["members"])}))
            self._interval = min(MAX_HEARTBEAT, max(MIN_HEARTBEAT, float(body["heartbeat_seconds"])))
        except (BadRequest, Forbidden, Unauthorized) as exc:
            if refusals:
                raise
            self._failed(exc)
            return
        except (httpx.HTTPError, FabricError, KeyError, TypeError, ValueError) as exc:
            self._failed(exc)
            return
        self.heartbeats += 1
        self.last_error = None
        if members != self._members:
            log.info("group %s: %d members: %s", self.group, len(members), ", ".join(members))
            self._members = members

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        if message != self.last_error:
            log.warning("group %s: heartbeat to the hub failed (keeping %d members): %s", self.group, len(self._members), message)
        self.last_error = message
