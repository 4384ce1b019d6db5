"""Sending copies of ``replicated`` writes to a peer spoke of the group (the origin's side).

With ``replicated`` durability a write is acknowledged once it is queued on this spoke's
disk *and* kept by one other spoke of the group (:mod:`spoke.replicas`). The peer is the
first live one in rendezvous order of this spoke's own URL, so while the group does not
change every copy goes to the same peer. Packs are copied as they arrive
(:meth:`Replication.send_pack`), so the copy overlaps the client's upload; entries are
copied when they are staged (:meth:`Replication.send_entries`), after the peer has been
sent, from this spoke's cache, every chunk they need that it lacks (a chunk the client
did not upload because this spoke had it, or a pack that went to a peer that has since
failed). A peer that fails is tried after the others for ``DOWN_SECONDS``; when no
peer takes the copy the write fails (Unavailable): it is never acknowledged as
replicated while it is not.

When a write lands at the hub, the peers that hold copies are told (:meth:`Replication.landed`,
in the background; a peer that misses it, restarting say, is told again for about a minute),
so they drop them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence

import httpx

from fabric.cache.disk import DiskCache
from fabric.client.http import Timeouts, raise_for_error
from fabric.client.transport import HttpClientTransport
from fabric.errors import FabricError, Unavailable
from fabric.format import packs
from fabric.format.model import Entry, stored_ids
from fabric.plane.wire import pack_changes

from .group import rank
from .peers import Members
from .traffic import CountingTransport, Traffic

log = logging.getLogger("fabric.spoke.replication")

API = "/api/v1/replica"
#: Seconds a peer that failed is asked to keep copies only after the others.
DOWN_SECONDS = 10.0
#: A copy crosses the LAN: longer than a peer's frame request, short enough to fail over.
REPLICA_TIMEOUTS = Timeouts(connect=1.0, read=30.0, write=30.0, pool=5.0, slow=30.0)
#: Landed notices waiting to be sent (beyond this they are dropped: the peer's hold ends them).
NOTICE_BACKLOG = 1000
#: A notice a peer did not take (it is restarting, say) is sent again this often, this many times.
NOTICE_RETRY, NOTICE_TRIES = 2.0, 30
#: Chunk ids per question to the peer (its limit per request).
MAX_IDS = 10_000


class Replication:
    def __init__(self, membership: Members, token: str | None, cache: DiskCache, traffic: Traffic, timeouts: Timeouts = REPLICA_TIMEOUTS) -> None:
        self.membership = membership
        self.cache = cache
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            headers=headers, timeout=timeouts.as_httpx(slow=True), transport=CountingTransport(traffic, HttpClientTransport())
        )
        self._down: dict[str, float] = {}
        self._lock = threading.Lock()
        self._holders: set[str] = set()  # peers that were sent copies (they hear of landed writes)
        #: (repo, branch, changes, the peers to tell, tries so far); None stops the notifier.
        self._notices: queue.Queue[tuple[str, str, dict[str, Entry | None], list[str], int] | None] = queue.Queue(NOTICE_BACKLOG)
        self._notifier = threading.Thread(target=self._notify, name="replication-notices", daemon=True)
        self._notifier.start()
        self.copied_bytes = 0

    def close(self) -> None:
        self._notices.put(None)
        self._http.close()

    # -- copies -------------------------------------------------------------------------
    def send_pack(self, repo: str, pack: bytes) -> None:
        """Have a peer keep this (verified) pack of ``repo``'s chunks."""
        self._to_a_peer(lambda peer: self._post(peer, "/packs", repo, content=pack))
        self.copied_bytes += len(pack)

    def send_entries(self, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> None:
        """Have a peer keep these writes: first every chunk they need that it lacks, then the entries."""
        needed = list(dict.fromkeys(cid for e in changes.values() if e is not None for cid in stored_ids(e.chunks)))
        body = pack_changes(dict(changes))

        def copy(peer: str) -> None:
            lacking: list[bytes] = []
            for i in range(0, len(needed), MAX_IDS):
                batch = [c.hex() for c in needed[i : i + MAX_IDS]]
                lacking += [bytes.fromhex(c) for c in self._post(peer, "/missing", repo, json={"ids": batch}).json()["missing"]]
            self._send_frames(peer, repo, lacking)
            self._post(peer, "/entries", repo, branch, content=body)

        self._to_a_peer(copy)

    def _send_frames(self, peer: str, repo: str, ids: Sequence[bytes]) -> None:
        builder = packs.PackBuilder()
        for cid in ids:
            frame = self.cache.get(cid)
            if frame is None:
                raise Unavailable(f"chunk {cid.hex()} of a replicated write is gone from this spoke's cache")
            builder.add(cid, frame)
            if builder.size >= packs.TARGET_SIZE // 2:
                self._post(peer, "/packs", repo, content=builder.finish())
                builder = packs.PackBuilder()
        if len(builder):
            self._post(peer, "/packs", repo, content=builder.finish())

    def _to_a_peer(self, copy) -> None:  # noqa: ANN001 - Callable[[str], None]
        tried: list[str] = []
        for peer in self.peers():
            try:
                copy(peer)
            except (httpx.HTTPError, FabricError) as exc:
                tried.append(f"{peer}: {getattr(exc, 'message', None) or exc}")
                with self._lock:
                    self._down[peer] = time.monotonic() + DOWN_SECONDS
                continue
            with self._lock:
                self._holders.add(peer)
            return
        why = "; ".join(tried) if tried else "no other member of the group is up"
        raise Unavailable(f"no peer spoke of the group took a copy of this write (replicated durability): {why}")

    def peers(self) -> list[str]:
        """The other members, in the order a copy is offered to them (rendezvous order of
        this spoke's URL, those that failed lately last)."""
        me = self.membership.me
        now = time.monotonic()
        with self._lock:
            down = {p for p, until in self._down.items() if until > now}
        ranked = rank(me.encode(), [m for m in self.membership.members() if m != me])
        # One that failed lately is tried last, not never: it may be back (a restart).
        return [m for m in ranked if m not in down] + [m for m in ranked if m in down]

    def _post(self, peer: str, route: str, repo: str, branch: str | None = None, **kwargs) -> httpx.Response:  # noqa: ANN003
        params = {"repo": repo, "origin": self.membership.me}
        if branch is not None:
            params["branch"] = branch
        response = self._http.post(f"{peer}{API}{route}", params=params, **kwargs)
        raise_for_error(response)
        return response

    # -- landed writes -----------------------------------------------------------------
    def landed(self, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> None:
        """Tell the peers holding copies that these writes are at the hub (in the background)."""
        with self._lock:
            holders = sorted(self._holders)
        if holders:
            self._notice((repo, branch, dict(changes), holders, 0))

    def _notice(self, item: tuple[str, str, dict[str, Entry | None], list[str], int]) -> None:
        try:
            self._notices.put_nowait(item)
        except queue.Full:
            log.warning("replication: landed notices are behind; peers will drop their copies after their hold")

    def _notify(self) -> None:
        while (item := self._notices.get()) is not None:
            repo, branch, changes, peers, tries = item
            missed = []
            for peer in peers:
                try:
                    self._post(peer, "/landed", repo, branch, content=pack_changes(changes))
                except (httpx.HTTPError, FabricError) as exc:
                    log.info("replication: %s did not hear that %d write(s) landed: %s", peer, len(changes), exc)
                    missed.append(peer)
            if missed and tries + 1 < NOTICE_TRIES:  # told again later, without holding up the others
                retry = threading.Timer(NOTICE_RETRY, self._notice, ((repo, branch, changes, missed, tries + 1),))
                retry.daemon = True
                retry.start()
