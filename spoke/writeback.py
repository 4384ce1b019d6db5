"""The write-back queue: writes accepted with ``local`` durability.

A write is durable once its chunk frames are pinned (fsynced) in the cache
and its entry is a row in ``writeback.db`` (SQLite, synchronous=FULL). A
background flusher pushes queued writes to the hub, each branch in its own
order and independently of the others: it asks which chunks the hub lacks,
uploads those frames in packs (a few at once), stages the entries, then deletes the rows
and unpins the frames. Until a write lands, reads of its branch at this spoke
see it.

Errors (see :mod:`spoke.hub_errors`): a transient one (hub away, 5xx, timeout)
is retried with backoff for that branch only; a permanent one (branch or
repository gone, token may not write, bad request) *parks* the batch: its rows
stay in the queue with the error, shown by ``stats()`` (``writeback_parked``)
and ``/api/v1/writeback/parked``, until an operator retries or drops them. The
later writes of a parked branch are *held* (queued, not sent) behind it, so
they never overtake it; other branches go on.

Exactly once: before a batch is first sent, its rows record the branch's
staging seq and head at the hub (``tried``). A batch whose outcome is unknown
(the spoke crashed between staging and deleting its rows, or the answer was
lost) is replayed as a conditional stage that leaves out every path written
at the hub since then, so a replay never overwrites newer data. Paths left out
(the first try landed, or a newer write came since) are logged and counted
(``writeback_superseded``). A first try that certainly never reached the hub
(no connection) clears the mark.

Chunks uploaded with ``local`` durability are also sent on early (see
:meth:`WriteBack.send_early`): the push to the hub overlaps the client's
upload instead of starting when its entries are queued. Once at the hub they
are unpinned (unless a queued write needs them), so the room they held in the
cache's pinned budget is free for the next writes: a writer that fills the
budget waits for the push (back-pressure, see ``SpokePlane.full_wait``), at
the pace of the link. Chunks not sent on early stay pinned for
``upload_hold`` seconds waiting for the entries that use them; a client that
never stages them (it crashed) does not keep them pinned for longer. Chunks sent
on early are recorded in ``writeback.db`` (table ``early``) until they reach the
hub or their hold ends, so a restarted spoke pins them again and sends them on:
a client that uploaded them before the restart can still stage them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from fabric.cache.disk import DiskCache
from fabric.client.http import HttpPlane
from fabric.errors import Conflict, FabricError, NotFound, Unavailable
from fabric.format import packs
from fabric.format.model import FILE, Entry, stored_ids
from fabric.util import sqlite
from fabric.util.inflight import Inflight

from .holds import Holds
from .hub_errors import is_permanent, never_sent
from .traffic import PUSH, Traffic

log = logging.getLogger("fabric.spoke")

BATCH = 256
#: Chunks sent on early per round of the flusher (about 128 MiB of 64 KiB chunks): one question
#: to the hub per round, and the round's last packs land before the next round starts, so a
#: small round leaves the link idle for a larger share of the time. Each pack's chunks are
#: unpinned as soon as it lands, so a round's size does not hold room a writer waits for.
EARLY_BATCH = 2048
#: Packs (of half the target pack size) uploaded to the hub at once by the flusher.
PUSH_DEPTH = 3
#: The longest a push waits for the same chunks' upload by another push to end.
UPLOAD_WAIT = 300.0
#: Rounds of early chunks follow one another without a pause for this long (seconds): the
#: next round's question goes while the last round's packs are still on the link. Then the
#: flusher turns to the branches' queued writes before it sends more early chunks.
EARLY_CHAIN_SECONDS = 10.0
#: How long uploaded chunks stay pinned waiting for an entry that uses them.
UPLOAD_HOLD = 3600.0
#: Backoff of a branch whose writes fail transiently: first and longest wait.
BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0
#: Asking the hub for a staging snapshot newer than this returns no entries (only seq and head).
_NO_ENTRIES = 1 << 62

_COLUMNS = {"tried": "TEXT", "parked": "TEXT", "parked_at": "REAL"}

Branch = tuple[str, str]


class WriteBack:
    def __init__(self, path: str, upload_hold: float = UPLOAD_HOLD) -> None:
        self.path = path
        self.upload_hold = upload_hold
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: One batch goes to the hub at a time (the flusher, or a commit's flush of its branch).
        self._sending = threading.Lock()
        #: Chunks a push is asking the hub about or sending it, by repository: a push of the same
        #: ones waits until they are released (:meth:`_claim`).
        self._claimed: collections.Counter[tuple[str, bytes]] = collections.Counter()
        self._landing = threading.Condition(self._lock)
        self._db = sqlite.connect(path, durability="full")  # guarded by self._lock
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS ops (id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL, "
            "branch TEXT NOT NULL, path TEXT NOT NULL, entry BLOB, created REAL NOT NULL)"
        )
        have = {r[1] for r in self._db.execute("PRAGMA table_info(ops)").fetchall()}
        for column, kind in _COLUMNS.items():
            if column not in have:  # a queue written by an older spoke
                self._db.execute(f"ALTER TABLE ops ADD COLUMN {column} {kind}")
        # Chunks sent on early and not at the hub yet, with when their hold ends (wall clock):
        # pinned again, and sent on, after a restart.
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS early (repo TEXT NOT NULL, chunk BLOB NOT NULL, until REAL NOT NULL, "
            "PRIMARY KEY (repo, chunk))"
        )
        self._queued = self._db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
        self._parked = self._db.execute("SELECT COUNT(*) FROM ops WHERE parked IS NOT NULL").fetchone()[0]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._early: collections.deque[tuple[str, bytes]] = collections.deque()  # (repo, chunk id)
        self._holds = Holds(upload_hold)  # chunks sent on early, waiting for their entries
        self._retry_at: dict[Branch | None, tuple[float, float]] = {}  # branch (None: early chunks) -> (when, backoff)
        self._load_early()
        self.early_sent = 0
        self.landed = 0
        self.superseded = 0
        self.last_error: str | None = None

    # -- start-up ------------------------------------------------------------
    def _load_early(self) -> None:
        """The chunks sent on early before a restart that had not reached the hub: sent on
        again, held for what is left of their hold (those whose hold ended are forgotten)."""
        now = time.time()
        with sqlite.transaction(self._db) as cur:
            cur.execute("DELETE FROM early WHERE until <= ?", (now,))
            rows = cur.execute("SELECT repo, chunk, until FROM early ORDER BY until").fetchall()
        for repo, chunk, until in rows:
            self._early.append((repo, bytes(chunk)))
            self._holds.add([bytes(chunk)], until - now)

    def pinned_chunks(self) -> set[bytes]:
        """Chunk ids that queued writes need, or that were sent on early and are not at the hub
        yet (pinned in the cache across restarts)."""
        out: set[bytes] = set()
        with self._lock:
            rows = self._db.execute("SELECT entry FROM ops WHERE entry IS NOT NULL").fetchall()
            out.update(bytes(c) for (c,) in self._db.execute("SELECT chunk FROM early").fetchall())
        for (enc,) in rows:
            out.update(stored_ids(Entry.decode(enc).chunks))
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

    def send_early(self, repo: str, ids: Sequence[bytes]) -> None:
        """Push these just uploaded, pinned chunks of ``repo`` to the hub as soon as it can
        take them, before any entry that uses them is queued (best effort: one that is gone
        from the cache is skipped), and hold their pins for ``upload_hold`` seconds."""
        until = time.time() + self.upload_hold
        with self._wake:
            with sqlite.transaction(self._db) as cur:
                cur.executemany("INSERT OR REPLACE INTO early (repo, chunk, until) VALUES (?, ?, ?)", [(repo, cid, until) for cid in ids])
            self._early.extend((repo, cid) for cid in ids)
            self._wake.notify_all()
        self._holds.add(ids)

    def pending(self, repo: str, branch: str) -> dict[str, bytes | None]:
        """Queued writes of a branch (parked ones too), latest per path (no query while nothing is queued)."""
        with self._lock:
            if not self._queued:
                return {}
            rows = self._db.execute(
                "SELECT path, entry FROM ops WHERE repo = ? AND branch = ? ORDER BY id", (repo, branch)
            ).fetchall()
        return {p: e for p, e in rows}

    def count(self) -> int:
        """Writes waiting to be sent (parked ones not included)."""
        with self._lock:
            return self._queued - self._parked

    def stats(self) -> dict[str, int]:
        """Counters for the spoke's stats: parked writes, and replays left out as superseded."""
        with self._lock:
            return {"writeback_parked": self._parked, "writeback_superseded": self.superseded}

    def flush(self, repo: str, branch: str) -> None:
        """Push the queued writes of one branch now: Unavailable while the hub is away, the
        hub's error when it refuses them (they are parked), Conflict when some are parked."""
        while True:
            with self._lock:
                parked = self._db.execute(
                    "SELECT COUNT(*), MIN(parked) FROM ops WHERE repo = ? AND branch = ? AND parked IS NOT NULL",
                    (repo, branch),
                ).fetchone()
            if parked[0]:
                raise Conflict(
                    f"{parked[0]} queued write(s) to {repo}@{branch} were refused by the hub and are parked "
                    f"({parked[1]}); see `fabric writeback list` to retry or drop them"
                )
            if not self._flush_batch(repo, branch):
                return

    # -- parked writes (operators) -------------------------------------------
    def parked(self) -> list[dict]:
        """Parked writes, oldest first: id, repo, branch, path, error, created, parked_at, and
        ``held``, how many later writes of its branch wait behind the branch's parked ones."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, repo, branch, path, entry IS NULL, parked, created, parked_at FROM ops "
                "WHERE parked IS NOT NULL ORDER BY id"
            ).fetchall()
            held = dict(
                ((r, b), n)
                for r, b, n in self._db.execute(
                    "SELECT repo, branch, COUNT(*) FROM ops WHERE parked IS NULL GROUP BY repo, branch"
                ).fetchall()
            )
        return [
            {
                "id": i,
                "repo": r,
                "branch": b,
                "path": p,
                "delete": bool(d),
                "error": err,
                "created": c,
                "parked_at": at,
                "held": held.get((r, b), 0),
            }
            for i, r, b, p, d, err, c, at in rows
        ]

    def retry(self, op_id: int | None = None) -> int:
        """Queue parked writes again (one, or all with ``None``); how many. NotFound for an id that is not parked."""
        with self._wake:
            sql, params = "UPDATE ops SET parked = NULL, parked_at = NULL WHERE parked IS NOT NULL", []
            if op_id is not None:
                sql, params = sql + " AND id = ?", [op_id]
            with sqlite.transaction(self._db) as cur:
                n = cur.execute(sql, params).rowcount
            if op_id is not None and not n:
                raise NotFound(f"no parked write-back entry {op_id}")
            self._parked -= n
            self._retry_at = {k: v for k, v in self._retry_at.items() if k is None}
            self._wake.notify_all()
        return n

    def drop(self, op_id: int | None = None) -> int:
        """Delete parked writes (one, or all with ``None``) and unpin the chunks no queued write
        needs any more; how many. NotFound for an id that is not parked."""
        sql, params = "parked IS NOT NULL", []
        if op_id is not None:
            sql, params = sql + " AND id = ?", [op_id]
        n = self._delete_where(sql, params)
        if op_id is not None and not n:
            raise NotFound(f"no parked write-back entry {op_id}")
        if n:
            log.warning("write-back: %d parked write(s) dropped by an operator", n)
        return n

    @contextlib.contextmanager
    def discarding(self, repo: str, branch: str) -> Iterator[None]:
        """Around a reset or discard of a branch at the hub, which drops its uncommitted
        changes: no batch is sent meanwhile, and when the body succeeds the branch's queued
        writes (uncommitted changes too) leave the queue, so none lands after it."""
        with self._sending:
            yield
            n = self._delete_where("repo = ? AND branch = ?", [repo, branch])
        if n:
            log.info("write-back: %d queued write(s) to %s@%s discarded with the branch's changes", n, repo, branch)

    def _delete_where(self, where: str, params: list) -> int:
        """Delete the queued writes that match ``where``, unpinning the chunks no other needs; how many."""
        with self._wake:
            rows = self._db.execute(f"SELECT id, entry, parked FROM ops WHERE {where}", params).fetchall()
            with sqlite.transaction(self._db) as cur:
                cur.executemany("DELETE FROM ops WHERE id = ?", [(r[0],) for r in rows])
            self._parked -= sum(1 for r in rows if r[2] is not None)
            self._queued -= len(rows)
            self._wake.notify_all()
        self._unpin_unneeded(cid for _, enc, _ in rows if enc is not None for cid in stored_ids(Entry.decode(enc).chunks))
        return len(rows)

    # -- flushing ------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._release_expired_holds()
            now = time.monotonic()
            with self._wake:
                due = [b for b in self._sendable() if self._retry_at.get(b, (0.0, 0.0))[0] <= now]
                early = bool(self._early) and self._retry_at.get(None, (0.0, 0.0))[0] <= now
                if not due and not early:
                    waits = [when - now for when, _ in self._retry_at.values()]
                    self._wake.wait(timeout=max(0.01, min([5.0, self.upload_hold, *waits])))
                    continue
            for repo, branch in due:
                if self._stop.is_set():
                    return
                self._attempt((repo, branch), lambda r=repo, b=branch: self._flush_batch(r, b))
            if early:
                self._attempt(None, self._send_early_batch)

    def _sendable(self) -> list[Branch]:
        """Branches with queued writes and none parked, oldest write first (under the lock)."""
        rows = self._db.execute(
            "SELECT repo, branch FROM ops GROUP BY repo, branch HAVING COUNT(parked) = 0 ORDER BY MIN(id)"
        ).fetchall()
        return [(r, b) for r, b in rows]

    def _attempt(self, key: Branch | None, step: Callable[[], object]) -> None:
        """Run one step of the flusher for a branch (or the early chunks); on a transient
        error, back that key off; a permanent one was handled by the step."""
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - the flusher must outlive any error
            message = exc.message if isinstance(exc, FabricError) else repr(exc)
            if not isinstance(exc, FabricError):
                log.exception("write-back: unexpected error")
            if isinstance(exc, FabricError) and is_permanent(exc):
                self.last_error = message
                return
            _, backoff = self._retry_at.get(key, (0.0, BACKOFF_MIN / 2))
            backoff = min(backoff * 2, BACKOFF_MAX)
            self._retry_at[key] = (time.monotonic() + backoff, backoff)
            self.last_error = message
            log.info("write-back: %s not sent yet (%s); retrying in %.1fs", key or "early chunks", message, backoff)
        else:
            self._retry_at.pop(key, None)
            if not self._retry_at:
                self.last_error = None

    def _flush_batch(self, repo: str, branch: str) -> bool:
        """Send the oldest batch of a branch's sendable writes (those before its first parked
        one, all with the same ``tried``); False when there is none. A permanent error parks
        the batch, then propagates."""
        with self._sending:
            with self._lock:
                rows = self._db.execute(
                    "SELECT id, path, entry, tried FROM ops WHERE repo = ? AND branch = ? AND parked IS NULL "
                    "AND id < COALESCE((SELECT MIN(id) FROM ops WHERE repo = ? AND branch = ? AND parked IS NOT NULL), "
                    "9223372036854775807) ORDER BY id LIMIT ?",
                    (repo, branch, repo, branch, BATCH),
                ).fetchall()
            if not rows:
                return False
            tried = rows[0][3]
            rows = rows[: next((i for i, r in enumerate(rows) if r[3] != tried), len(rows))]  # one replay mark per batch
            changes: dict[str, Entry | None] = {}
            for _, path, enc, _ in rows:
                changes.pop(path, None)
                changes[path] = Entry.decode(enc) if enc is not None else None
            chunk_ids = list(
                dict.fromkeys(cid for e in changes.values() if e is not None and e.kind == FILE for cid in stored_ids(e.chunks))
            )
            ids = [r[0] for r in rows]
            try:
                with self.traffic.purpose(PUSH):
                    self._push_chunks(repo, chunk_ids)
                    seq, skipped = self._stage(repo, branch, changes, ids, tried)
            except FabricError as exc:
                if is_permanent(exc):
                    self._park(ids, exc)
                raise
            landed = {p: e for p, e in changes.items() if p not in skipped}
            if skipped:
                self.superseded += len(skipped)
                log.warning(
                    "write-back: %d replayed write(s) to %s@%s left out: the path was written at the hub since the "
                    "first try (by that try, or by a newer write) (%s)",
                    len(skipped), repo, branch, ", ".join(skipped[:10]),
                )
            # Before the rows go, so that readers find the writes in the staging they see.
            self.on_landed(repo, branch, landed, seq)
            with self._lock:
                with sqlite.transaction(self._db) as cur:
                    cur.executemany("DELETE FROM ops WHERE id = ?", [(i,) for i in ids])
                    # At the hub now: an early push still waiting on its backoff need not hold them.
                    cur.executemany("DELETE FROM early WHERE repo = ? AND chunk = ?", [(repo, c) for c in chunk_ids])
                self._queued -= len(ids)
            self._unpin_unneeded(chunk_ids)
            self.landed += len(rows)
            return True

    def _stage(
        self, repo: str, branch: str, changes: dict[str, Entry | None], ids: list[int], tried: str | None
    ) -> tuple[int | None, list[str]]:
        """Stage a batch: a replay (``tried`` set) conditionally, a first try after recording
        the branch's staging seq and head at the hub in its rows."""
        if tried is not None:
            seq, head = tried.split()
            return self.upstream.stage_unless_newer(repo, branch, changes, int(seq), head)
        head, seq, _ = self.upstream.staging_snapshot(repo, branch, _NO_ENTRIES)
        self._set_tried(ids, f"{seq} {head}")
        try:
            return self.upstream.stage(repo, branch, changes), []
        except FabricError as exc:
            if never_sent(exc):
                self._set_tried(ids, None)
            raise

    def _set_tried(self, ids: list[int], tried: str | None) -> None:
        with self._lock:
            with sqlite.transaction(self._db) as cur:
                cur.executemany("UPDATE ops SET tried = ? WHERE id = ?", [(tried, i) for i in ids])

    def _park(self, ids: list[int], exc: FabricError) -> None:
        """Keep these rows out of the flush with the hub's error (nothing of them was applied)."""
        message = f"{exc.code}: {exc.message}"
        with self._lock:
            with sqlite.transaction(self._db) as cur:
                cur.executemany(
                    "UPDATE ops SET parked = ?, parked_at = ?, tried = NULL WHERE id = ?",
                    [(message, time.time(), i) for i in ids],
                )
            self._parked += len(ids)
        log.warning("write-back: %d write(s) parked: the hub refused them (%s)", len(ids), message)

    def _unpin_unneeded(self, chunk_ids: Iterable[bytes]) -> None:
        """Unpin the chunks of ``chunk_ids`` that no queued write needs."""
        ids = list(chunk_ids)
        if not ids:
            return
        still = self.pinned_chunks()
        for cid in ids:
            if cid not in still:
                self.cache.unpin(cid)

    def _release_expired_holds(self) -> None:
        """Unpin uploaded chunks whose hold ended and that no queued write needs."""
        expired = self._holds.expired()
        if expired:
            with self._lock, sqlite.transaction(self._db) as cur:
                cur.executemany("DELETE FROM early WHERE chunk = ?", [(cid,) for cid in expired])
        self._unpin_unneeded(expired)

    def _send_early_batch(self) -> None:
        """Push the early chunks queued, a round (one question to the hub, up to
        :data:`EARLY_BATCH` chunks) after another, for up to :data:`EARLY_CHAIN_SECONDS`. All
        rounds share one set of :data:`PUSH_DEPTH` uploads, so the question of the next round
        (chunks that came in meanwhile) goes while the last packs of this one are still on the
        link: waiting for them first would leave the link idle for a round trip and the time
        to fill it again."""
        taken: list[tuple[str, bytes]] = []
        sent = 0
        until = time.monotonic() + EARLY_CHAIN_SECONDS
        try:
            with self.traffic.purpose(PUSH), Inflight(PUSH_DEPTH, "writeback-push") as uploads:
                while not self._stop.is_set() and (not taken or time.monotonic() < until):
                    with self._lock:
                        batch = list(itertools.islice(self._early, len(taken), len(taken) + EARLY_BATCH))
                    if not batch:
                        break
                    taken += batch
                    by_repo: dict[str, list[bytes]] = {}
                    for repo, cid in batch:
                        by_repo.setdefault(repo, []).append(cid)
                    for repo, ids in by_repo.items():
                        landed = functools.partial(self._early_landed, repo)
                        sent += self._push_chunks(repo, ids, skip_absent=True, landed=landed, uploads=uploads)
        except FabricError as exc:
            if is_permanent(exc):  # best effort: their entries, when queued, push them again
                log.warning("write-back: %d chunk(s) not sent on early: %s", len(taken), exc.message)
                self._done_early(taken)
            raise
        self._done_early(taken)
        self.early_sent += sent

    def _early_landed(self, repo: str, ids: list[bytes]) -> None:
        """A pack of early chunks is at the hub (whose gc spares new chunks for hours): they
        need not hold room among the pinned bytes, which a writer may be waiting for. A queued
        entry keeps its own pinned."""
        with self._lock:
            with sqlite.transaction(self._db) as cur:
                cur.executemany("DELETE FROM early WHERE repo = ? AND chunk = ?", [(repo, cid) for cid in ids])
        self._unpin_unneeded(ids)

    def _done_early(self, batch: list[tuple[str, bytes]]) -> None:
        """The first early chunks, ``batch``, are at the hub, or never will be sent early:
        out of the queue, and unpinned unless a queued write needs them (those the hub had
        already were not unpinned as a pack landed)."""
        with self._lock:
            with sqlite.transaction(self._db) as cur:
                cur.executemany("DELETE FROM early WHERE repo = ? AND chunk = ?", batch)
            for _ in batch:
                self._early.popleft()
        self._unpin_unneeded(cid for _, cid in batch)

    def _push_chunks(
        self,
        repo: str,
        ids: list[bytes],
        skip_absent: bool = False,
        landed: Callable[[list[bytes]], None] | None = None,
        uploads: Inflight | None = None,
    ) -> int:
        """Upload the chunks of ``ids`` the hub lacks as chunks of ``repo``, from the cache;
        how many were sent. :data:`PUSH_DEPTH` packs are on the link at once: one at a time
        would leave it idle for a round trip and the hub's time on each pack. ``landed`` is
        called (from an upload thread) with the ids of each pack the hub took. With
        ``uploads`` (the caller's), the packs go through it and may still be on the link when
        this returns; otherwise this returns once the hub has them all."""
        if uploads is None:
            with Inflight(PUSH_DEPTH, "writeback-push") as own:
                return self._push_chunks(repo, ids, skip_absent, landed, own)
        ids = list(dict.fromkeys(ids))
        self._claim(repo, ids)
        claimed = set(ids)  # released here unless handed to a pack submitted, which releases its own
        sent = 0
        builder = packs.PackBuilder()
        try:
            for cid in self.upstream.missing_chunks(ids, repo=repo) if ids else []:
                frame = self.cache.get(cid)
                if frame is None and skip_absent:
                    continue
                if frame is None:
                    raise Unavailable(f"queued chunk {cid.hex()} is missing from the spoke cache")
                sent += 1
                builder.add(cid, frame)
                if builder.size >= packs.TARGET_SIZE // 2:
                    claimed -= builder.ids
                    self._submit_pack(uploads, repo, builder, landed)
                    builder = packs.PackBuilder()
            if len(builder):
                claimed -= builder.ids
                self._submit_pack(uploads, repo, builder, landed)
        finally:
            self._release(repo, claimed)
        return sent

    def _submit_pack(self, uploads: Inflight, repo: str, builder: packs.PackBuilder, landed: Callable[[list[bytes]], None] | None) -> None:
        uploads.submit(functools.partial(self._upload_pack, repo, builder, landed),
                       on_cancel=functools.partial(self._release, repo, list(builder.ids)))

    def _upload_pack(self, repo: str, builder: packs.PackBuilder, landed: Callable[[list[bytes]], None] | None) -> None:
        """Send a full pack (from an upload thread); tell ``landed`` its ids once the hub has it."""
        try:
            self.upstream.receive_pack(builder.finish(), repo=repo)
        finally:
            self._release(repo, builder.ids)
        if landed is not None:
            landed(list(builder.ids))

    def _claim(self, repo: str, ids: list[bytes]) -> None:
        """Mark ``ids`` (unique) as being pushed, once no other push has any of them (or
        :data:`UPLOAD_WAIT` passed): a commit flushing its branch while the chunks it needs go
        up early then asks the hub which it lacks only once they are there, and sends none
        twice. A pack that failed leaves its chunks missing, and they are sent."""
        with self._landing:
            if self._claimed:
                self._landing.wait_for(lambda: not any((repo, cid) in self._claimed for cid in ids), UPLOAD_WAIT)
            for cid in ids:
                self._claimed[(repo, cid)] += 1

    def _release(self, repo: str, ids: Iterable[bytes]) -> None:
        """``ids`` of ``repo`` are no longer being pushed (at the hub, not sent, or failed)."""
        with self._landing:
            for cid in ids:
                key = (repo, cid)
                if self._claimed[key] > 1:
                    self._claimed[key] -= 1
                else:
                    self._claimed.pop(key, None)
            self._landing.notify_all()


def open_writeback(cache_dir: str, upload_hold: float = UPLOAD_HOLD) -> WriteBack:
    return WriteBack(os.path.join(cache_dir, "writeback.db"), upload_hold)
