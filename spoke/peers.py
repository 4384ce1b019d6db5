"""Fetching chunks through a spoke group: each chunk from its owner, so it crosses the WAN once.

:meth:`GroupFetch.fetch` is the fetch scheduler's upstream call (``group_frames``)
for a spoke in a group. It splits a batch by owner (:mod:`spoke.group`): ids this
spoke owns go to the hub; the others go to their owner over the LAN, as a peer
request (``X-Fabric-Peer: 1`` with this spoke's hub token, :mod:`fabric.api.peers`).
The owner serves them from its cache or fetches them from its hub once, and keeps
them. For a demand read this spoke keeps a copy too (the scheduler caches what it
fetched): a job reads its next chunks from local disk, at the cost of a second copy
in the region. A prefetch (:meth:`GroupFetch.fetch` tells which frames an owner sent)
fills only the owner's cache: the scheduler hands those frames to any reader already
waiting and keeps no copy, so the job's reads of them come over the LAN from the owner.

A peer's frames are verified (checksum and id) before they are passed on, with their
bytes, so the scheduler does not decode them again. An owner that cannot be reached,
answers with an error, is slow (short timeouts) or sends a bad frame is marked down for
:data:`DOWN_SECONDS`; the ids it did not send go to the next owner in rendezvous order
that is up, or to the hub: never an error to the reader. An id the owner says is stored
nowhere (404) is asked of the hub, whose answer is the reader's.

A spoke asked by a peer fetches what it lacks from its hub, never from a third
spoke (:meth:`spoke.plane.SpokePlane.frames`), in the request's own thread: a
request makes at most one LAN hop, even while two members see the group
differently, and a spoke whose fetch workers all wait on its peers still serves
them.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import httpx

from fabric.api.peers import PEER_HEADER
from fabric.client.http import HttpPlane, Timeouts
from fabric.client.transport import HttpClientTransport
from fabric.errors import FabricError, NotFound
from fabric.format import frames

from .group import rank
from .traffic import CountingTransport, Traffic

log = logging.getLogger("fabric.spoke.group")

#: Seconds a peer that failed is left out of the group by this spoke.
DOWN_SECONDS = 10.0
#: How long a peer may take: a slow owner costs a fallback, not a stalled read.
PEER_TIMEOUTS = Timeouts(connect=1.0, read=2.0, write=2.0, pool=2.0, slow=2.0)

FetchFrames = Callable[[list[bytes]], Iterator[tuple[bytes, bytes]]]
#: ``(id, frame, raw)``: ``raw`` (verified) when an owner sent the frame, None when the hub did.
Frames = Iterator[tuple[bytes, bytes, bytes | None]]


class Members(Protocol):
    """What :class:`GroupFetch` needs of a membership (:mod:`spoke.membership`): this
    spoke's name and the members now, itself included."""

    me: str

    def members(self) -> tuple[str, ...]: ...


class GroupFetch:
    def __init__(
        self,
        membership: Members,
        hub_frames: FetchFrames,
        token: str | None,
        traffic: Traffic,
        timeouts: Timeouts = PEER_TIMEOUTS,
        down_seconds: float = DOWN_SECONDS,
    ) -> None:
        """``hub_frames``: the hub's frames call; ``token``: this spoke's hub token, which
        peers check with their hub; ``traffic``: where the LAN bytes are counted."""
        self.membership = membership
        self.me = membership.me
        self._hub = hub_frames
        self._token = token
        self.traffic = traffic
        self._timeouts = timeouts
        self._down_seconds = down_seconds
        self._lock = threading.Lock()
        self._clients: dict[str, HttpPlane] = {}
        self._down: dict[str, float] = {}
        self.peer_chunks = self.fallback_chunks = self.peer_failures = self.served_to_peers = 0

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # -- routing -----------------------------------------------------------------
    def asked_by_peer(self, n: int) -> None:
        """Count ``n`` chunk ids a peer asked this spoke for."""
        with self._lock:
            self.served_to_peers += n

    def owners(self, cid: bytes) -> list[str]:
        """The members that may serve ``cid`` now, in order: its owner first, peers marked
        down left out (this spoke is never down)."""
        now = time.monotonic()
        with self._lock:
            down = {m for m, until in self._down.items() if until > now}
        return [m for m in rank(cid, self.membership.members()) if m == self.me or m not in down]

    def _route(self, ids: Sequence[bytes], tried: set[str]) -> dict[str, list[bytes]]:
        """``ids`` by the member to ask first (this spoke: the hub), leaving out ``tried``."""
        out: dict[str, list[bytes]] = {}
        for cid in ids:
            target = next(m for m in self.owners(cid) if m == self.me or m not in tried)
            out.setdefault(target, []).append(cid)
        return out

    # -- the scheduler's upstream call ---------------------------------------------
    def fetch(self, ids: list[bytes]) -> Frames:
        """``(id, frame, raw)`` for ``ids``: this spoke's own from the hub and the others
        from their owners, all asked at once (one WAN round trip for the batch, not one per
        owner in turn); what an owner did not send comes from the next owner or the hub.
        ``raw``: the frame's bytes, verified, when an owner sent it (it holds a copy in its
        cache); None for a frame of the hub.

        Own ids are asked at once too: a peer may be waiting for them (its request joins
        this fetch), so they must never wait on that peer's answer, or two spokes wait on
        each other. Frames come in the order they arrive; a hub error ends the stream."""
        wanted = set(ids)
        routes = self._route(ids, set())
        own = routes.pop(self.me, [])
        if not routes:
            for cid, frame in self._hub(own):
                yield cid, frame, None
            return
        sources: list[Callable[[], Frames]] = [
            lambda peer=peer, asked=asked: self._from_owner(peer, asked, wanted, {peer}) for peer, asked in routes.items()
        ]
        if own:
            sources.append(lambda: ((cid, frame, None) for cid, frame in self._hub(own)))
        yield from _merged(sources)

    def _from_owner(self, peer: str, asked: list[bytes], wanted: set[bytes], tried: set[str]) -> Frames:
        """``asked`` from ``peer``; what it does not send, from the next owner up or the hub."""
        got: set[bytes] = set()
        failure: BaseException | None = None
        try:
            for cid, frame in self._client(peer).frames(asked):
                if cid not in wanted or cid in got:
                    continue
                raw = frames.decode(frame, cid)  # a peer's frame is checked before it is passed on
                got.add(cid)
                yield cid, frame, raw
        except NotFound:
            pass  # stored nowhere, says the peer's hub: ours has the last word
        except (FabricError, httpx.HTTPError, OSError) as exc:
            failure = exc
        rest = [cid for cid in asked if cid not in got]
        with self._lock:
            self.peer_chunks += len(got)
            self.fallback_chunks += len(rest)
        if not rest:
            return
        routes = {self.me: rest}
        if failure is not None:
            self._mark_down(peer, failure)
            routes = self._route(rest, tried)
        for target, more in routes.items():
            if target == self.me:
                for cid, frame in self._hub(more):
                    yield cid, frame, None
            else:
                yield from self._from_owner(target, more, wanted, tried | {target})

    def _mark_down(self, peer: str, exc: BaseException) -> None:
        with self._lock:
            self.peer_failures += 1
            self._down[peer] = time.monotonic() + self._down_seconds
        log.warning("peer %s failed (%s): left out for %.0f s, its chunks fetched elsewhere", peer, getattr(exc, "message", exc), self._down_seconds)

    def _client(self, peer: str) -> HttpPlane:
        with self._lock:
            client = self._clients.get(peer)
            if client is None:
                transport = CountingTransport(self.traffic, HttpClientTransport())
                client = self._clients[peer] = HttpPlane(peer, self._token, self._timeouts, transport)
                client.http.headers[PEER_HEADER] = "1"
            return client

    def stats(self) -> dict:
        now = time.monotonic()
        with self._lock:
            down = sorted(m for m, until in self._down.items() if until > now)
            return {
                "peers_down": down,
                "peer_chunks": self.peer_chunks,
                "peer_fallback_chunks": self.fallback_chunks,
                "peer_failures": self.peer_failures,
                "chunks_asked_by_peers": self.served_to_peers,
            }


_DONE = object()


def _merged(sources: Sequence[Callable[[], Frames]]) -> Frames:
    """The items of every source, each run in its own thread, in the order they arrive.

    Each thread runs in a copy of the caller's context (the traffic purpose its bytes are
    counted under). At most a few frames wait between the threads and the reader (a bounded
    queue); an error of a source is raised to the reader; a reader that stops early stops them all."""
    out: queue.Queue = queue.Queue(maxsize=16)
    stopped = threading.Event()

    def put(item: object) -> bool:
        while not stopped.is_set():
            try:
                out.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def run(source: Callable[[], Frames]) -> None:
        try:
            for item in source():
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            put(exc)
        finally:
            put(_DONE)

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(run, source), name="group-fetch", daemon=True)
        for source in sources
    ]
    for t in threads:
        t.start()
    running = len(threads)
    try:
        while running:
            item = out.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stopped.set()
