"""The write-back queue: writes accepted with ``local`` durability.

A write is durable once its chunk frames are pinned (fsynced) in the cache
and its entry is a row in ``writeback.db`` (SQLite, synchronous=FULL). A
background flusher pushes queued writes to the hub in order: it asks which
chunks the hub lacks, uploads one pack of those frames, stages the entries,
then deletes the rows and unpins the frames. Staging is an upsert, so a crash
between staging and deleting the row re-stages the same entry: the write
lands once. Until a write lands, reads of its branch at this spoke see it.

Chunks uploaded with ``local`` durability are also sent on early (see
:meth:`WriteBack.send_early`): the push to the hub overlaps the client's
upload instead of starting when its entries are queued. They stay pinned for
``upload_hold`` seconds waiting for the entries that use them; a client that
never stages them (it crashed) does not keep them pinned for longer.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from fabric.cache.disk import DiskCache
from fabric.client.http import HttpPlane
from fabric.errors import FabricError, Unavailable
from fabric.format import packs
from fabric.format.model import FILE, Entry
from fabric.util import sqlite

from .traffic import PUSH, Traffic

log = logging.getLogger("fabric.spoke")

BATCH = 256
#: Chunks sent on early per round of the flusher (about 32 MiB of 64 KiB chunks).
EARLY_BATCH = 512
#: How long uploaded chunks stay pinned waiting for an entry that uses them.
UPLOAD_HOLD = 3600.0


class WriteBack:
    def __init__(self, path: str, upload_hold: float = UPLOAD_HOLD) -> None:
        self.path = path
        self.upload_hold = upload_hold
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._db = sqlite.connect(path, durability="full")  # guarded by self._lock
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS ops (id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL, "
            "branch TEXT NOT NULL, path TEXT NOT NULL, entry BLOB, created REAL NOT NULL)"
        )
        self._queued = self._db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._early: collections.deque[bytes] = collections.deque()
        self._holds: collections.deque[tuple[float, list[bytes]]] = collections.deque()  # (ends, chunks), in time order
        self.early_sent = 0
        self.landed = 0
        self.last_error: str | None = None

    # -- start-up ------------------------------------------------------------
    def pinned_chunks(self) -> set[bytes]:
        """Chunk ids that queued writes need (pinned in the cache across restarts)."""
        out: set[bytes] = set()
        with self._lock:
            rows = self._db.execute("SELECT entry FROM ops WHERE entry IS NOT NULL").fetchall()
        for (enc,) in rows:
            out.update(cid for cid, _ in Entry.decode(enc).chunks)
        return out

    def start(
        self,
        cache: DiskCache,
        upstream: HttpPlane,
        traffic: Traffic,
        on_landed: Callable[[str, str, dict[str, Entry | None], int | None], None],
    ) -> None:
        """Start the flusher; ``on_landed(repo, branch, changes, staging seq)`` hears of each
        batch staged at the hub, before its rows leave the queue."""
        self.cache, self.upstream, self.traffic, self.on_landed = cache, upstream, traffic, on_landed
        self._thread = threading.Thread(target=self._run, name="writeback", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()

    # -- queueing ------------------------------------------------------------
    def enqueue(self, repo: str, branch: str, changes: dict[str, Entry | None]) -> None:
        """Append writes (entries whose chunks are already pinned in the cache)."""
        now = time.time()
        rows = [(repo, branch, p, e.encode() if e is not None else None, now) for p, e in changes.items()]
        with self._wake:
            with sqlite.transaction(self._db) as cur:
                cur.executemany("INSERT INTO ops (repo, branch, path, entry, created) VALUES (?, ?, ?, ?, ?)", rows)
            self._queued += len(rows)
            self._wake.notify_all()

    def send_early(self, ids: Sequence[bytes]) -> None:
        """Push these just uploaded, pinned chunks to the hub as soon as it can take them,
        before any entry that uses them is queued (best effort: one that is gone from the
        cache is skipped), and hold their pins for ``upload_hold`` seconds."""
        ends = time.monotonic() + self.upload_hold
        with self._wake:
            self._early.extend(ids)
            self._holds.append((ends, list(ids)))
            self._wake.notify_all()

    def pending(self, repo: str, branch: str) -> dict[str, bytes | None]:
        """Queued writes of a branch, latest per path (no query while nothing is queued)."""
        with self._lock:
            if not self._queued:
                return {}
            rows = self._db.execute(
                "SELECT path, entry FROM ops WHERE repo = ? AND branch = ? ORDER BY id", (repo, branch)
            ).fetchall()
        return {p: e for p, e in rows}

    def count(self) -> int:
        with self._lock:
            return self._queued

    def flush(self, repo: str | None = None, branch: str | None = None) -> None:
        """Push queued writes (of one branch, or all) now; Unavailable while the hub is away."""
        while self._flush_batch(repo, branch):
            pass

    # -- flushing ------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            self._release_expired_holds()
            with self._wake:
                if not self._early and self._db.execute("SELECT 1 FROM ops LIMIT 1").fetchone() is None:
                    self._wake.wait(timeout=min(5.0, self.upload_hold))
                    continue
            try:
                self.flush()
                self._send_early_batch()
                backoff = 0.2
                self.last_error = None
            except FabricError as exc:
                self.last_error = exc.message
                log.info("write-back: hub not reachable yet (%s); retrying in %.1fs", exc.message, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _flush_batch(self, repo: str | None, branch: str | None) -> bool:
        with self._lock:
            sql, params = "SELECT id, repo, branch, path, entry FROM ops", []
            if repo is not None:
                sql += " WHERE repo = ? AND branch = ?"
                params = [repo, branch]
            first = self._db.execute(sql + " ORDER BY id LIMIT 1", params).fetchone()
            if first is None:
                return False
            rows = self._db.execute(
                "SELECT id, path, entry FROM ops WHERE repo = ? AND branch = ? ORDER BY id LIMIT ?",
                (first[1], first[2], BATCH),
            ).fetchall()
        target_repo, target_branch = first[1], first[2]
        changes: dict[str, Entry | None] = {}
        for _, path, enc in rows:
            changes.pop(path, None)
            changes[path] = Entry.decode(enc) if enc is not None else None
        chunk_ids = list(dict.fromkeys(cid for e in changes.values() if e is not None and e.kind == FILE for cid, _ in e.chunks))
        with self.traffic.purpose(PUSH):
            self._push_chunks(chunk_ids)
            seq = self.upstream.stage(target_repo, target_branch, changes)
        # Before the rows go, so that readers find the writes in the staging they see.
        self.on_landed(target_repo, target_branch, changes, seq)
        with self._lock:
            with sqlite.transaction(self._db) as cur:
                cur.executemany("DELETE FROM ops WHERE id = ?", [(r[0],) for r in rows])
            self._queued -= len(rows)
        still = self.pinned_chunks()
        for cid in chunk_ids:
            if cid not in still:
                self.cache.unpin(cid)
        self.landed += len(rows)
        return True

    def _release_expired_holds(self) -> None:
        """Unpin uploaded chunks whose hold ended and that no queued write needs."""
        now = time.monotonic()
        expired: list[bytes] = []
        with self._lock:
            while self._holds and self._holds[0][0] <= now:
                expired += self._holds.popleft()[1]
        if expired:
            needed = self.pinned_chunks()
            for cid in expired:
                if cid not in needed:
                    self.cache.unpin(cid)

    def _send_early_batch(self) -> None:
        with self._lock:
            batch = [self._early[i] for i in range(min(EARLY_BATCH, len(self._early)))]
        if not batch:
            return
        with self.traffic.purpose(PUSH):
            sent = self._push_chunks(batch, skip_absent=True)
        with self._lock:
            for _ in batch:
                self._early.popleft()
        self.early_sent += sent

    def _push_chunks(self, ids: list[bytes], skip_absent: bool = False) -> int:
        """Upload the chunks of ``ids`` the hub lacks, from the cache; how many were sent."""
        builder = packs.PackBuilder()
        sent = 0
        for cid in self.upstream.missing_chunks(ids) if ids else []:
            frame = self.cache.get(cid)
            if frame is None and skip_absent:
                continue
            if frame is None:
                raise Unavailable(f"queued chunk {cid.hex()} is missing from the spoke cache")
            sent += 1
            builder.add(cid, frame)
            if builder.size >= packs.TARGET_SIZE // 2:
                self.upstream.receive_pack(builder.finish())
                builder = packs.PackBuilder()
        if len(builder):
            self.upstream.receive_pack(builder.finish())
        return sent


def open_writeback(cache_dir: str, upload_hold: float = UPLOAD_HOLD) -> WriteBack:
    return WriteBack(os.path.join(cache_dir, "writeback.db"), upload_hold)
