"""Copies this spoke keeps of another spoke's writes: the ``replicated`` durability tier.

A write with ``replicated`` durability is on its spoke's disk (queued in its write-back,
:mod:`spoke.writeback`) and on the disk of one peer spoke of the group before it is
acknowledged (:mod:`spoke.replication` is the sending side). The peer keeps the copy
here, on standby: the chunk frames pinned in its cache and the entries as rows of
``replicas.db`` (SQLite, synchronous=FULL), each with the URL of the spoke it came from
(its *origin*). Nothing is sent to the hub while the origin is alive: the origin
pushes its own writes, and tells this spoke which of them landed (:meth:`ReplicaStore.landed`),
which drops those rows and unpins their chunks.

When the origin stops answering (``/healthz`` fails) for ``promote_after`` seconds, its
rows are *promoted*: queued in this spoke's own write-back, which pushes them to the hub
as if they had been written here. So losing a spoke machine loses no acknowledged write.

A row newer than another of the same origin, branch and path replaces it (only the last
version of a path is kept). A row whose origin stays alive but never reports it landed
is dropped after ``hold`` seconds (the origin had it on its own disk all along).

Known limit: a promoted write is staged at the hub unconditionally; had another client
written the same path at the hub after the origin died and before the promotion, that
newer version would be overwritten.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import httpx

from fabric.cache.disk import DiskCache
from fabric.format.model import Entry, stored_ids
from fabric.util import sqlite

from .holds import Holds

log = logging.getLogger("fabric.spoke.replicas")

#: Seconds an origin may fail its health checks before its writes are pushed from here.
PROMOTE_AFTER = 30.0
#: Seconds a copy whose origin is alive is kept without word that it landed.
HOLD = 3600.0
#: Seconds between two health checks of an origin with copies here.
PROBE_EVERY = 2.0

Enqueue = Callable[[str, str, dict[str, Entry | None]], None]


class ReplicaStore:
    def __init__(self, path: str, promote_after: float = PROMOTE_AFTER, hold: float = HOLD) -> None:
        self.promote_after = promote_after
        self.hold = hold
        self._lock = threading.Lock()
        self._db = sqlite.connect(path, durability="full")  # guarded by self._lock
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS standby (id INTEGER PRIMARY KEY AUTOINCREMENT, origin TEXT NOT NULL, "
            "repo TEXT NOT NULL, branch TEXT NOT NULL, path TEXT NOT NULL, entry BLOB, received REAL NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS standby_path ON standby (origin, repo, branch, path)")
        self._down_since: dict[str, float] = {}  # origin -> monotonic time of the first failed probe
        self._holds = Holds(hold)  # chunks of copied packs, waiting for their entries
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.promoted = 0
        self.dropped = 0

    # -- what the origin sends -------------------------------------------------------
    def add(self, origin: str, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> None:
        """Keep copies of these writes (their chunks already pinned here), each replacing
        an older copy of its path from the same origin."""
        now = time.time()
        with self._lock, sqlite.transaction(self._db) as cur:
            for path, entry in changes.items():
                cur.execute("DELETE FROM standby WHERE origin = ? AND repo = ? AND branch = ? AND path = ?", (origin, repo, branch, path))
                cur.execute(
                    "INSERT INTO standby (origin, repo, branch, path, entry, received) VALUES (?, ?, ?, ?, ?, ?)",
                    (origin, repo, branch, path, entry.encode() if entry is not None else None, now),
                )

    def landed(self, origin: str, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> list[bytes]:
        """Drop the copies of these writes (they are at the hub); the chunk ids they used.
        A copy of a newer version of a path stays."""
        freed: list[bytes] = []
        with self._lock, sqlite.transaction(self._db) as cur:
            for path, entry in changes.items():
                enc = entry.encode() if entry is not None else None
                rows = cur.execute(
                    "SELECT id, entry FROM standby WHERE origin = ? AND repo = ? AND branch = ? AND path = ?",
                    (origin, repo, branch, path),
                ).fetchall()
                for row_id, kept in rows:
                    if kept == enc:
                        cur.execute("DELETE FROM standby WHERE id = ?", (row_id,))
                        if entry is not None:
                            freed += stored_ids(entry.chunks)
        return freed

    def hold_pack(self, ids: list[bytes]) -> None:
        """The chunks of a copied pack stay pinned for ``hold`` seconds, waiting for the
        entries that use them (an origin that dies before sending them does not keep them)."""
        self._holds.add(ids)

    # -- state ----------------------------------------------------------------------------
    def pinned_chunks(self) -> set[bytes]:
        """Chunk ids the copies need (pinned in the cache across restarts)."""
        with self._lock:
            rows = self._db.execute("SELECT entry FROM standby WHERE entry IS NOT NULL").fetchall()
        return {cid for (enc,) in rows for cid in stored_ids(Entry.decode(enc).chunks)}

    def stats(self) -> dict[str, int]:
        with self._lock:
            held = self._db.execute("SELECT COUNT(*) FROM standby").fetchone()[0]
        return {"replicas_held": held, "replicas_promoted": self.promoted, "replicas_dropped": self.dropped}

    def origins(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT origin FROM standby").fetchall()]

    # -- watching origins ---------------------------------------------------------------
    def start(self, cache: DiskCache, enqueue: Enqueue, still_needed: Callable[[], set[bytes]]) -> None:
        """Watch the origins of the copies: ``enqueue`` queues a dead origin's writes in this
        spoke's write-back; ``still_needed`` names the chunks queued writes need (kept pinned)."""
        self.cache, self._enqueue, self._still_needed = cache, enqueue, still_needed
        self._thread = threading.Thread(target=self._run, name="replicas", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def release(self, chunk_ids: Iterable[bytes]) -> None:
        """Unpin chunks no copy and no queued write needs any more."""
        ids = list(chunk_ids)
        if not ids:
            return
        keep = self.pinned_chunks() | self._still_needed()
        for cid in ids:
            if cid not in keep:
                self.cache.unpin(cid)

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while not self._stop.wait(PROBE_EVERY):
                try:
                    self._check(client)
                except Exception:  # never let the watcher die; try again next round
                    log.exception("replicas: checking the origins of held copies failed")

    def _check(self, client: httpx.Client) -> None:
        now = time.monotonic()
        for origin in self.origins():
            if _alive(client, origin):
                self._down_since.pop(origin, None)
                continue
            since = self._down_since.setdefault(origin, now)
            if now - since >= self.promote_after:
                self._promote(origin)
                self._down_since.pop(origin, None)
        self._drop_expired()

    def _promote(self, origin: str) -> None:
        """Queue a dead origin's writes here, branch by branch in the order they came."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, repo, branch, path, entry FROM standby WHERE origin = ? ORDER BY id", (origin,)
            ).fetchall()
        by_branch: dict[tuple[str, str], dict[str, Entry | None]] = {}
        for _, repo, branch, path, enc in rows:
            by_branch.setdefault((repo, branch), {})[path] = Entry.decode(enc) if enc is not None else None
        for (repo, branch), changes in by_branch.items():
            self._enqueue(repo, branch, changes)  # pinned here: the queue keeps them pinned now
        with self._lock, sqlite.transaction(self._db) as cur:
            cur.executemany("DELETE FROM standby WHERE id = ?", [(r[0],) for r in rows])
        self.promoted += len(rows)
        log.warning("replicas: %s has not answered for %.0f s: %d of its write(s) queued here for the hub", origin, self.promote_after, len(rows))

    def _drop_expired(self) -> None:
        self.release(self._holds.expired())
        cutoff = time.time() - self.hold
        with self._lock, sqlite.transaction(self._db) as cur:
            rows = cur.execute("SELECT id, entry FROM standby WHERE received < ?", (cutoff,)).fetchall()
            cur.executemany("DELETE FROM standby WHERE id = ?", [(r[0],) for r in rows])
        if rows:
            self.dropped += len(rows)
            self.release(cid for _, enc in rows if enc is not None for cid in stored_ids(Entry.decode(enc).chunks))


def _alive(client: httpx.Client, origin: str) -> bool:
    try:
        return client.get(origin.rstrip("/") + "/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def open_replicas(cache_dir: str, promote_after: float = PROMOTE_AFTER) -> ReplicaStore:
    return ReplicaStore(os.path.join(cache_dir, "replicas.db"), promote_after)
