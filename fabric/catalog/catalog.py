"""Catalog operations. All mutable state of a hub goes through this module.

Refs change only by compare-and-swap. Staging rows carry the branch's
``staging_seq`` at the time they were written, so a commit folds exactly the
rows it read and leaves later writes staged (see :meth:`Catalog.fold_staging`).

Ref events (the watch stream's history) are pruned as they are written: the
last :data:`EVENT_KEEP` are always kept, older ones while they are younger
than :data:`EVENT_RETENTION` seconds, and never more than :data:`EVENT_MAX`.
The highest pruned seq is recorded (:meth:`Catalog.events_pruned_through`), so
a subscriber resuming from before it can be told to resync. Event seqs are
assigned under a lock held to commit (:meth:`Catalog._event`): they commit in
order and without gaps, so ``seq > last`` misses nothing on PostgreSQL either,
however many hub processes write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from fabric.catalog.db import Cursor, Database, batched, placeholders
from fabric.catalog.schema import SCHEMA, SCHEMA_VERSION
from fabric.errors import Conflict, NotFound

BRANCH = "branch"
TAG = "tag"
#: Event kind of a change to a branch's staging area (``new`` is the staging seq).
STAGING = "staging"

#: Ref events always kept, however old.
EVENT_KEEP = 10_000
#: Seconds an event beyond the last EVENT_KEEP is kept.
EVENT_RETENTION = 3600.0
#: Ref events kept at most, however young.
EVENT_MAX = 1_000_000
#: Events are pruned once every this many events.
PRUNE_EVERY = 256
_PRUNED_THROUGH = "ref_events_pruned_through"
#: The PostgreSQL advisory lock that orders ref events (any constant unique to this use).
EVENT_LOCK = 0x6661627269630001
#: Staging rows read per query while iterating a staging area.
STAGED_BATCH = 1000
#: The setting that counts the transactions that dropped chunks or ownership rows
#: (see :meth:`Catalog.chunk_drops`).
_CHUNK_DROPS = "chunk_drops"


@dataclass(frozen=True)
class RefRow:
    repo: str
    kind: str
    name: str
    commit_id: str
    staging_seq: int
    updated: float


@dataclass(frozen=True)
class ChunkLocation:
    pack: str
    offset: int
    length: int
    raw_len: int


class Catalog:
    """``event_keep``, ``event_retention``, ``event_max``: how much of the ref
    event history is kept (see the module's docstring)."""

    def __init__(
        self,
        db: Database,
        event_keep: int = EVENT_KEEP,
        event_retention: float = EVENT_RETENTION,
        event_max: int = EVENT_MAX,
    ) -> None:
        if not 1 <= event_keep <= event_max:
            raise ValueError(f"ref events: keep ({event_keep}) must be at least 1 and at most the maximum ({event_max})")
        self.db = db
        self.event_keep = event_keep
        self.event_retention = event_retention
        self.event_max = event_max
        db.ddl(SCHEMA)
        with db.tx() as cur:
            cur.execute(
                "INSERT INTO settings (key, value) VALUES ('schema_version', ?) ON CONFLICT (key) DO NOTHING",
                (str(SCHEMA_VERSION),),
            )

    # -- settings ------------------------------------------------------------
    def setting(self, key: str) -> str | None:
        rows = self.db.query("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_setting(self, key: str, value: str) -> None:
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # -- repositories --------------------------------------------------------
    def create_repo(self, name: str, default_branch: str, initial_commit: str) -> None:
        now = time.time()
        with self.db.tx() as cur:
            cur.execute("SELECT 1 FROM repos WHERE name = ?", (name,))
            if cur.fetchone():
                raise Conflict(f"repository {name!r} already exists")
            cur.execute("INSERT INTO repos (name, default_branch, created) VALUES (?, ?, ?)", (name, default_branch, now))
            cur.execute(
                "INSERT INTO refs (repo, kind, name, commit_id, staging_seq, updated) VALUES (?, ?, ?, ?, 0, ?)",
                (name, BRANCH, default_branch, initial_commit, now),
            )
            cur.execute("INSERT INTO commits (repo, id) VALUES (?, ?)", (name, initial_commit))
            self._event(cur, name, BRANCH, default_branch, None, initial_commit)

    def get_repo(self, name: str) -> tuple[str, str, float]:
        rows = self.db.query("SELECT name, default_branch, created FROM repos WHERE name = ?", (name,))
        if not rows:
            raise NotFound(f"repository {name!r} does not exist (see `fabric repo list`)")
        return rows[0]

    def list_repos(self) -> list[tuple[str, str, float]]:
        return self.db.query("SELECT name, default_branch, created FROM repos ORDER BY name")

    def delete_repo(self, name: str) -> None:
        with self.db.tx() as cur:
            cur.execute("DELETE FROM repos WHERE name = ?", (name,))
            if cur.rowcount == 0:
                raise NotFound(f"repository {name!r} does not exist")
            for table in ("refs", "staging", "commits", "repo_chunks"):
                cur.execute(f"DELETE FROM {table} WHERE repo = ?", (name,))
            self._count_drop(cur)
            self._event(cur, name, "repo", name, None, None)

    # -- refs ----------------------------------------------------------------
    def get_ref(self, repo: str, kind: str, name: str) -> RefRow | None:
        rows = self.db.query(
            "SELECT repo, kind, name, commit_id, staging_seq, updated FROM refs WHERE repo = ? AND kind = ? AND name = ?",
            (repo, kind, name),
        )
        return RefRow(*rows[0]) if rows else None

    def list_refs(self, repo: str, kind: str) -> list[RefRow]:
        rows = self.db.query(
            "SELECT repo, kind, name, commit_id, staging_seq, updated FROM refs WHERE repo = ? AND kind = ? ORDER BY name",
            (repo, kind),
        )
        return [RefRow(*r) for r in rows]

    def all_ref_commits(self) -> list[tuple[str, str]]:
        return self.db.query("SELECT repo, commit_id FROM refs")

    def create_ref(self, repo: str, kind: str, name: str, commit_id: str) -> None:
        with self.db.tx() as cur:
            cur.execute("SELECT 1 FROM refs WHERE repo = ? AND kind = ? AND name = ?", (repo, kind, name))
            if cur.fetchone():
                raise Conflict(f"{kind} {name!r} already exists in repository {repo!r}")
            cur.execute(
                "INSERT INTO refs (repo, kind, name, commit_id, staging_seq, updated) VALUES (?, ?, ?, ?, 0, ?)",
                (repo, kind, name, commit_id, time.time()),
            )
            self._event(cur, repo, kind, name, None, commit_id)

    def delete_ref(self, repo: str, kind: str, name: str) -> None:
        with self.db.tx() as cur:
            cur.execute("SELECT commit_id FROM refs WHERE repo = ? AND kind = ? AND name = ?", (repo, kind, name))
            row = cur.fetchone()
            if not row:
                raise NotFound(f"{kind} {name!r} does not exist in repository {repo!r}")
            cur.execute("DELETE FROM refs WHERE repo = ? AND kind = ? AND name = ?", (repo, kind, name))
            if kind == BRANCH:
                cur.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, name))
            self._event(cur, repo, kind, name, row[0], None)

    def move_branch(
        self,
        repo: str,
        branch: str,
        expected: str,
        new: str,
        fold_seq: int | None = None,
        clear_staging: bool = False,
    ) -> None:
        """Compare-and-swap a branch head from ``expected`` to ``new``.

        ``fold_seq``: staging rows written at or before this sequence were folded
        into ``new`` and are removed in the same transaction. ``clear_staging``
        drops all of the branch's staging (a hard reset).
        """
        with self.db.tx() as cur:
            cur.execute(
                "UPDATE refs SET commit_id = ?, updated = ? WHERE repo = ? AND kind = ? AND name = ? AND commit_id = ?",
                (new, time.time(), repo, BRANCH, branch, expected),
            )
            if cur.rowcount != 1:
                cur.execute("SELECT commit_id FROM refs WHERE repo = ? AND kind = ? AND name = ?", (repo, BRANCH, branch))
                row = cur.fetchone()
                if row is None:
                    raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
                raise Conflict(
                    f"branch {branch!r} moved: its head is {row[0][:12]}, not {expected[:12]}; "
                    "fetch the new head and retry",
                    head=row[0],
                )
            cur.execute("INSERT INTO commits (repo, id) VALUES (?, ?) ON CONFLICT DO NOTHING", (repo, new))
            if clear_staging:
                cur.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
            elif fold_seq is not None:
                cur.execute("DELETE FROM staging WHERE repo = ? AND branch = ? AND seq <= ?", (repo, branch, fold_seq))
            self._event(cur, repo, BRANCH, branch, expected, new)

    def record_commit(self, repo: str, commit_id: str) -> None:
        with self.db.tx() as cur:
            cur.execute("INSERT INTO commits (repo, id) VALUES (?, ?) ON CONFLICT DO NOTHING", (repo, commit_id))

    def commits_with_prefix(self, repo: str, prefix: str) -> list[str]:
        rows = self.db.query(
            "SELECT id FROM commits WHERE repo = ? AND id >= ? AND id < ? LIMIT 2", (repo, prefix, prefix + "g")
        )
        return [r[0] for r in rows]

    # -- staging -------------------------------------------------------------
    def stage(
        self,
        repo: str,
        branch: str,
        changes: Sequence[tuple[str, bytes | None]],
        check: Callable[[], None] | None = None,
    ) -> int:
        """Write entries (``None`` = tombstone) to a branch's staging area; returns their seq.

        ``check``, when given, runs inside the transaction once the branch's ref row is
        locked (every stage and commit of the branch, in any hub process, waits for it);
        its catalog reads from this thread see the transaction. It raises to write nothing:
        a condition on what the branch holds (S3's If-None-Match, If-Match) is checked and
        the write made atomically."""
        with self.db.tx() as cur:
            cur.execute(
                "UPDATE refs SET staging_seq = staging_seq + 1 WHERE repo = ? AND kind = ? AND name = ? RETURNING staging_seq",
                (repo, BRANCH, branch),
            )
            row = cur.fetchone()
            if row is None:
                raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
            seq = row[0]
            if check is not None:
                check()
            cur.executemany(
                "INSERT INTO staging (repo, branch, path, entry, seq) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (repo, branch, path) DO UPDATE SET entry = excluded.entry, seq = excluded.seq",
                [(repo, branch, path, entry, seq) for path, entry in changes],
            )
            self._event(cur, repo, STAGING, branch, None, str(seq))
        return seq

    def stage_unless_newer(
        self, repo: str, branch: str, changes: Sequence[tuple[str, bytes | None]], since_seq: int, head: str
    ) -> tuple[int, list[str]]:
        """Stage like :meth:`stage`, but leave out each path staged on the branch after
        staging seq ``since_seq``; returns the new seq and the paths left out.

        ``head`` is the branch head the caller checked commits against: Conflict (retry)
        when the branch moved meanwhile. The branch's ref row is updated first, so stages
        and commits of the branch are serialized with this check."""
        with self.db.tx() as cur:
            cur.execute(
                "UPDATE refs SET staging_seq = staging_seq + 1 WHERE repo = ? AND kind = ? AND name = ? "
                "RETURNING staging_seq, commit_id",
                (repo, BRANCH, branch),
            )
            row = cur.fetchone()
            if row is None:
                raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
            seq, current = row
            if current != head:
                raise Conflict(f"branch {branch!r} moved while staging; retry", head=current)
            newer: set[str] = set()
            paths = [p for p, _ in changes]
            for part in batched(paths):
                cur.execute(
                    f"SELECT path FROM staging WHERE repo = ? AND branch = ? AND seq > ? AND path IN ({placeholders(len(part))})",
                    (repo, branch, since_seq, *part),
                )
                newer.update(r[0] for r in cur.fetchall())
            cur.executemany(
                "INSERT INTO staging (repo, branch, path, entry, seq) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (repo, branch, path) DO UPDATE SET entry = excluded.entry, seq = excluded.seq",
                [(repo, branch, path, entry, seq) for path, entry in changes if path not in newer],
            )
            self._event(cur, repo, STAGING, branch, None, str(seq))
        return seq, sorted(newer)

    def staged(
        self,
        repo: str,
        branch: str,
        start: str = "",
        end: str | None = None,
        max_seq: int | None = None,
        min_seq: int = 0,
        after: str = "",
    ) -> Iterator[tuple[str, bytes | None]]:
        """Staged ``(path, entry bytes or None)`` in path order, ``start <= path < end``
        and ``path > after``, written at a staging seq in ``(min_seq, max_seq]``."""
        # Read in keyset batches: a caller that stops early (a page) reads little.
        sql = "SELECT path, entry FROM staging WHERE repo = ? AND branch = ? AND path {op} ?"
        params: list = []
        if end is not None:
            sql += " AND path < ?"
            params.append(end)
        if max_seq is not None:
            sql += " AND seq <= ?"
            params.append(max_seq)
        if min_seq:
            sql += " AND seq > ?"
            params.append(min_seq)
        sql += f" ORDER BY path LIMIT {STAGED_BATCH}"
        op, key = (">", after) if after and after >= start else (">=", start)
        while True:
            rows = self.db.query(sql.format(op=op), [repo, branch, key, *params])
            for path, entry in rows:
                yield path, bytes(entry) if entry is not None else None
            if len(rows) < STAGED_BATCH:
                return
            op, key = ">", rows[-1][0]

    def staged_entry(self, repo: str, branch: str, path: str) -> tuple[bool, bytes | None]:
        """``(found, entry)``: found with ``None`` means a staged delete."""
        rows = self.db.query(
            "SELECT entry FROM staging WHERE repo = ? AND branch = ? AND path = ?", (repo, branch, path)
        )
        if not rows:
            return False, None
        return True, bytes(rows[0][0]) if rows[0][0] is not None else None

    def all_staged_entries(self, repo: str | None = None) -> Iterator[bytes]:
        """Every staged entry (of ``repo``, or of every repository)."""
        if repo is None:
            rows = self.db.query("SELECT entry FROM staging WHERE entry IS NOT NULL")
        else:
            rows = self.db.query("SELECT entry FROM staging WHERE entry IS NOT NULL AND repo = ?", (repo,))
        for (entry,) in rows:
            yield bytes(entry)

    def discard_staging(self, repo: str, branch: str, paths: Iterable[str] | None = None) -> None:
        with self.db.tx() as cur:
            if paths is None:
                cur.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
            else:
                cur.executemany(
                    "DELETE FROM staging WHERE repo = ? AND branch = ? AND path = ?",
                    [(repo, branch, p) for p in paths],
                )

    # -- chunk index ---------------------------------------------------------
    def locate(self, cid: bytes) -> ChunkLocation | None:
        rows = self.db.query("SELECT pack, off, len, raw_len FROM chunks WHERE id = ?", (cid,))
        return ChunkLocation(*rows[0]) if rows else None

    def locate_many(self, ids: Sequence[bytes]) -> dict[bytes, ChunkLocation]:
        found: dict[bytes, ChunkLocation] = {}
        for batch in batched(list(ids)):
            rows = self.db.query(
                f"SELECT id, pack, off, len, raw_len FROM chunks WHERE id IN ({placeholders(len(batch))})", batch
            )
            for cid, *loc in rows:
                found[bytes(cid)] = ChunkLocation(*loc)
        return found

    def present_and_touch(self, ids: Sequence[bytes], grace: float) -> set[bytes]:
        """Ids among ``ids`` that are indexed; refresh their gc clock when it is getting old."""
        present: set[bytes] = set()
        now = time.time()
        for batch in batched(list(ids)):
            rows = self.db.query(
                f"SELECT id, touched FROM chunks WHERE id IN ({placeholders(len(batch))})", batch
            )
            stale = []
            for cid, touched in rows:
                present.add(bytes(cid))
                if touched < now - grace / 2:
                    stale.append((now, cid))
            if stale:
                with self.db.tx() as cur:
                    cur.executemany("UPDATE chunks SET touched = ? WHERE id = ?", stale)
        return present

    def index_pack(self, pack_id: str, size: int, data_size: int, chunks: Iterable[tuple[bytes, int, int, int]]) -> None:
        """Record a stored pack and its chunks (after the pack object is durable).

        ``data_size`` is the size of the pack's frame area (without its index).
        """
        now = time.time()
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO packs (id, size, data_size, created) VALUES (?, ?, ?, ?)", (pack_id, size, data_size, now)
            )
            cur.executemany(
                "INSERT INTO chunks (id, pack, off, len, raw_len, touched) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING",
                [(cid, pack_id, off, length, raw_len, now) for cid, off, length, raw_len in chunks],
            )

    def packs(self) -> list[tuple[str, int, int, float]]:
        """``(id, size, data_size, created)`` of every indexed pack."""
        return self.db.query("SELECT id, size, data_size, created FROM packs ORDER BY id")

    def chunks_of_pack(self, pack_id: str) -> list[tuple[bytes, int, int, int, float]]:
        rows = self.db.query("SELECT id, off, len, raw_len, touched FROM chunks WHERE pack = ? ORDER BY off", (pack_id,))
        return [(bytes(r[0]), r[1], r[2], r[3], r[4]) for r in rows]

    def iter_chunk_ids(self) -> Iterator[tuple[bytes, str, int, float]]:
        for cid, pack, length, touched in self.db.query("SELECT id, pack, len, touched FROM chunks"):
            yield bytes(cid), pack, length, touched

    def relocate_chunks(
        self, new_pack: str, size: int, data_size: int, rows: Sequence[tuple[bytes, int, int, int]]
    ) -> None:
        """Point chunks at a repacked copy (one transaction)."""
        now = time.time()
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO packs (id, size, data_size, created) VALUES (?, ?, ?, ?)", (new_pack, size, data_size, now)
            )
            cur.executemany(
                "UPDATE chunks SET pack = ?, off = ?, len = ?, raw_len = ? WHERE id = ?",
                [(new_pack, off, length, raw_len, cid) for cid, off, length, raw_len in rows],
            )

    def delete_chunks(self, ids: Sequence[bytes], older_than: float) -> None:
        """Unindex chunks, except those a writer touched at or after ``older_than``."""
        with self.db.tx() as cur:
            cur.executemany("DELETE FROM chunks WHERE id = ? AND touched < ?", [(cid, older_than) for cid in ids])
            cur.executemany(
                "DELETE FROM repo_chunks WHERE chunk = ? AND NOT EXISTS (SELECT 1 FROM chunks WHERE id = ?)",
                [(cid, cid) for cid in ids],
            )
            self._count_drop(cur)

    def chunk_drops(self) -> int:
        """How many transactions so far unindexed chunks or dropped chunks' ownership
        (:meth:`delete_chunks`, :meth:`delete_repo`).

        Each such transaction adds one in the same transaction, so a chunk seen indexed
        (and a repository's) after a first reading is still so while a later reading
        gives the same count."""
        value = self.setting(_CHUNK_DROPS)
        return int(value) if value is not None else 0

    def _count_drop(self, cur: Cursor) -> None:
        cur.execute(
            "INSERT INTO settings (key, value) VALUES (?, '1') ON CONFLICT (key) "
            "DO UPDATE SET value = CAST(CAST(settings.value AS BIGINT) + 1 AS TEXT)",
            (_CHUNK_DROPS,),
        )

    # -- chunk ownership -----------------------------------------------------
    def owned_chunks(self, repo: str, ids: Sequence[bytes]) -> set[bytes]:
        """The ids among ``ids`` recorded as chunks of ``repo``."""
        owned: set[bytes] = set()
        for batch in batched(list(ids)):
            rows = self.db.query(
                f"SELECT chunk FROM repo_chunks WHERE repo = ? AND chunk IN ({placeholders(len(batch))})",
                (repo, *batch),
            )
            owned.update(bytes(cid) for (cid,) in rows)
        return owned

    def add_owned_chunks(self, repo: str, ids: Iterable[bytes]) -> None:
        """Record chunks as chunks of ``repo`` (after they are indexed: objects before references)."""
        rows = [(repo, cid) for cid in dict.fromkeys(ids)]
        if rows:
            with self.db.tx() as cur:
                cur.executemany("INSERT INTO repo_chunks (repo, chunk) VALUES (?, ?) ON CONFLICT DO NOTHING", rows)

    def delete_pack_row(self, pack_id: str) -> None:
        with self.db.tx() as cur:
            cur.execute("SELECT COUNT(*) FROM chunks WHERE pack = ?", (pack_id,))
            (live,) = cur.fetchone()
            if live:
                raise Conflict(f"pack {pack_id} still holds {live} indexed chunks")
            cur.execute("DELETE FROM packs WHERE id = ?", (pack_id,))

    def stats(self) -> dict[str, int]:
        (chunks, raw, stored), = self.db.query("SELECT COUNT(*), COALESCE(SUM(raw_len),0), COALESCE(SUM(len),0) FROM chunks")
        (packs, pack_bytes), = self.db.query("SELECT COUNT(*), COALESCE(SUM(size),0) FROM packs")
        return {
            "chunks": int(chunks),
            "unique_bytes": int(raw),
            "chunk_stored_bytes": int(stored),
            "packs": int(packs),
            "pack_bytes": int(pack_bytes),
        }

    # -- ref events (the watch stream) ---------------------------------------
    def _event(self, cur, repo: str, kind: str, name: str, old: str | None, new: str | None) -> None:
        """Append a ref event; its seq is one more than the last committed one.

        The seq is taken under a lock held until the transaction ends, so events commit
        in seq order with no gaps, whatever the number of hub processes: a reader that
        sees seq N has seen every seq below N (see :meth:`events_after`). The call should
        come last in its transaction: other writers of events wait from here to commit.
        On SQLite a write transaction already holds the database's write lock."""
        if self.db.dialect == "postgres":
            cur.execute("SELECT pg_advisory_xact_lock(?)", (EVENT_LOCK,))
        now = time.time()
        cur.execute(
            "INSERT INTO ref_events (seq, repo, kind, name, old_commit, new_commit, time) "
            "SELECT COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ?, ?, ? FROM ref_events RETURNING seq",
            (repo, kind, name, old, new, now),
        )
        (seq,) = cur.fetchone()
        if seq % PRUNE_EVERY == 0:
            self._prune_events(cur, seq, now)

    def _prune_events(self, cur, last: int, now: float) -> None:
        """Delete events older than the retention beyond the last ``event_keep``, and
        any beyond the last ``event_max``; record the highest seq deleted."""
        cur.execute(
            "SELECT MAX(seq) FROM ref_events WHERE time < ? AND seq <= ?",
            (now - self.event_retention, last - self.event_keep),
        )
        horizon = max(cur.fetchone()[0] or 0, last - self.event_max)
        cur.execute("SELECT value FROM settings WHERE key = ?", (_PRUNED_THROUGH,))
        row = cur.fetchone()
        if horizon <= (int(row[0]) if row else 0):
            return
        cur.execute("DELETE FROM ref_events WHERE seq <= ?", (horizon,))
        cur.execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_PRUNED_THROUGH, str(horizon)),
        )

    def events_pruned_through(self) -> int:
        """The highest event seq pruned (0: none): a subscriber whose last seen seq is
        below it has missed events and must reload the refs it follows."""
        value = self.setting(_PRUNED_THROUGH)
        return int(value) if value is not None else 0

    def last_event_seq(self) -> int:
        return int(self.db.query("SELECT COALESCE(MAX(seq), 0) FROM ref_events")[0][0])

    def events_after(self, seq: int, repo: str | None = None, limit: int = 1000) -> list[tuple]:
        sql = "SELECT seq, repo, kind, name, old_commit, new_commit, time FROM ref_events WHERE seq > ?"
        params: list = [seq]
        if repo:
            sql += " AND repo = ?"
            params.append(repo)
        return self.db.query(sql + " ORDER BY seq LIMIT ?", params + [limit])

    # -- spoke groups ------------------------------------------------------------
    def group_heartbeat(
        self, group: str, url: str, token_id: str | None, now: float, expired_before: float, max_members: int
    ) -> None:
        """Record that ``url`` is a live member of ``group`` at ``now``; members last seen
        before ``expired_before`` (of any group) are dropped first. Conflict when the group
        already has ``max_members`` other live members."""
        with self.db.tx() as cur:
            cur.execute("DELETE FROM group_members WHERE seen < ?", (expired_before,))
            cur.execute("SELECT COUNT(*) FROM group_members WHERE group_name = ? AND url <> ?", (group, url))
            if cur.fetchone()[0] >= max_members:
                raise Conflict(f"group {group!r} already has {max_members} members, the most it may have")
            cur.execute(
                "INSERT INTO group_members (group_name, url, token_id, seen) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (group_name, url) DO UPDATE SET token_id = excluded.token_id, seen = excluded.seen",
                (group, url, token_id, now),
            )

    def group_members(self, group: str, seen_since: float) -> list[str]:
        """URLs of the members of ``group`` last seen at or after ``seen_since``, sorted."""
        rows = self.db.query(
            "SELECT url FROM group_members WHERE group_name = ? AND seen >= ? ORDER BY url", (group, seen_since)
        )
        return [url for (url,) in rows]

    def leave_group(self, group: str, url: str) -> bool:
        """Drop ``url`` from ``group``; whether it was a member."""
        with self.db.tx() as cur:
            cur.execute("DELETE FROM group_members WHERE group_name = ? AND url = ?", (group, url))
            return cur.rowcount > 0

    # -- S3 bucket bindings ----------------------------------------------------
    def create_bucket(self, name: str, repo: str, ref: str, created_by_s3: bool = False) -> None:
        with self.db.tx() as cur:
            cur.execute("SELECT 1 FROM buckets WHERE name = ?", (name,))
            if cur.fetchone():
                raise Conflict(f"bucket {name!r} already exists (see `fabric bucket list`)")
            cur.execute(
                "INSERT INTO buckets (name, repo, ref, created_by_s3, created) VALUES (?, ?, ?, ?, ?)",
                (name, repo, ref, int(created_by_s3), time.time()),
            )

    def get_bucket(self, name: str) -> tuple[str, str, str, bool, float] | None:
        rows = self.db.query("SELECT name, repo, ref, created_by_s3, created FROM buckets WHERE name = ?", (name,))
        if not rows:
            return None
        n, repo, ref, by_s3, created = rows[0]
        return n, repo, ref, bool(by_s3), created

    def list_buckets(self) -> list[tuple[str, str, str, bool, float]]:
        rows = self.db.query("SELECT name, repo, ref, created_by_s3, created FROM buckets ORDER BY name")
        return [(n, repo, ref, bool(by_s3), created) for n, repo, ref, by_s3, created in rows]

    def delete_bucket(self, name: str) -> None:
        with self.db.tx() as cur:
            cur.execute("DELETE FROM buckets WHERE name = ?", (name,))
            if cur.rowcount == 0:
                raise NotFound(f"bucket {name!r} does not exist (see `fabric bucket list`)")
            cur.execute("DELETE FROM bucket_locations WHERE name = ?", (name,))
