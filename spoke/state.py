"""What a spoke remembers across restarts besides cached blobs: refs it has seen,
which commits belong to which repository, the last snapshot of each branch's staging
area it read, and callers' token verdicts.

All of it is a cache of the hub's answers. It lets a spoke that restarts while
the hub is away keep serving what it served before (marked stale), and keep
enforcing the roles it knew: a token it never saw stays refused. So a write of
it that finds the disk full is skipped (logged), never the request's failure:
the answer is still served from memory, and a restart with the hub away may
not remember it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping

from fabric.errors import StorageFull
from fabric.util.sqlite import SharedConnection

log = logging.getLogger("fabric.spoke")

#: (repository, commit) pairs known to belong together kept in memory, at most.
KNOWN_COMMITS = 100_000
#: A full disk is logged at most this often (seconds).
FULL_LOG_INTERVAL = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS refs (repo TEXT, kind TEXT, name TEXT, commit_id TEXT, PRIMARY KEY (repo, kind, name));
CREATE TABLE IF NOT EXISTS commits (repo TEXT, commit_id TEXT, PRIMARY KEY (repo, commit_id));
CREATE TABLE IF NOT EXISTS tokens (token_hash TEXT PRIMARY KEY, principal TEXT);
CREATE TABLE IF NOT EXISTS staging_heads (repo TEXT, branch TEXT, head TEXT, seq INTEGER, PRIMARY KEY (repo, branch));
CREATE TABLE IF NOT EXISTS staging_rows (repo TEXT, branch TEXT, path TEXT, entry BLOB, PRIMARY KEY (repo, branch, path))
"""


class SpokeState:
    def __init__(self, cache_dir: str) -> None:
        self._db = SharedConnection(os.path.join(cache_dir, "state.db"), durability="normal", schema=SCHEMA)
        self._full_logged = float("-inf")
        self.skipped_writes = 0
        self._commits: set[tuple[str, str]] = set()

    @contextlib.contextmanager
    def _best_effort(self, what: str) -> Iterator[None]:
        try:
            yield
        except StorageFull as exc:
            self.skipped_writes += 1
            now = time.monotonic()
            if now - self._full_logged >= FULL_LOG_INTERVAL:
                self._full_logged = now
                log.warning("spoke state: %s not recorded (%s); kept in memory only", what, exc.message)

    # -- refs ----------------------------------------------------------------
    def save_ref(self, repo: str, kind: str, name: str, commit: str | None) -> None:
        with self._best_effort(f"{kind} {repo}@{name}"):
            if commit is None:
                self._db.execute("DELETE FROM refs WHERE repo = ? AND kind = ? AND name = ?", (repo, kind, name))
            else:
                self._db.execute("INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)", (repo, kind, name, commit))

    def forget_repo(self, repo: str) -> None:
        self._commits = {(r, c) for r, c in self._commits if r != repo}
        with self._best_effort(f"the removal of {repo}"):
            for table in ("refs", "commits", "staging_heads", "staging_rows"):
                self._db.execute(f"DELETE FROM {table} WHERE repo = ?", (repo,))

    def refs(self) -> list[tuple[str, str, str, str]]:
        return self._db.execute("SELECT repo, kind, name, commit_id FROM refs")

    # -- commit membership ---------------------------------------------------
    def add_commit(self, repo: str, commit: str) -> None:
        self._remember(repo, commit)
        with self._best_effort(f"commit {commit[:12]} of {repo}"):
            self._db.execute("INSERT OR IGNORE INTO commits VALUES (?, ?)", (repo, commit))

    def has_commit(self, repo: str, commit: str) -> bool:
        """Whether ``commit`` is known to be in ``repo`` (asked at every read by commit id: the
        answers are kept in memory, bounded, in front of the database)."""
        if (repo, commit) in self._commits:
            return True
        if self._db.execute("SELECT 1 FROM commits WHERE repo = ? AND commit_id = ?", (repo, commit)):
            self._remember(repo, commit)
            return True
        return False

    def _remember(self, repo: str, commit: str) -> None:
        if len(self._commits) >= KNOWN_COMMITS:
            self._commits = set()
        self._commits.add((repo, commit))

    # -- staging snapshots ---------------------------------------------------
    def save_staging(self, repo: str, branch: str, head: str, seq: int, rows: Mapping[str, bytes | None], replace: bool) -> bool:
        """Record a branch's staging snapshot: ``rows`` on top of the recorded one, or instead of
        it. False when the disk is full and nothing was recorded: a later change recorded on top
        of this record would then claim a seq whose rows it lacks (see ``StagingCache``)."""
        with self._best_effort(f"staging of {repo}@{branch}"):
            with self._db.transaction() as cur:
                if replace:
                    cur.execute("DELETE FROM staging_rows WHERE repo = ? AND branch = ?", (repo, branch))
                cur.execute("INSERT OR REPLACE INTO staging_heads VALUES (?, ?, ?, ?)", (repo, branch, head, seq))
                cur.executemany("INSERT OR REPLACE INTO staging_rows VALUES (?, ?, ?, ?)", [(repo, branch, p, e) for p, e in rows.items()])
            return True
        return False

    def staging(self, repo: str, branch: str) -> tuple[str, int, dict[str, bytes | None]] | None:
        """``(head, seq, rows)`` of the last recorded snapshot of a branch's staging area."""
        heads = self._db.execute("SELECT head, seq FROM staging_heads WHERE repo = ? AND branch = ?", (repo, branch))
        if not heads:
            return None
        rows = self._db.execute("SELECT path, entry FROM staging_rows WHERE repo = ? AND branch = ?", (repo, branch))
        return heads[0][0], heads[0][1], {p: e for p, e in rows}

    # -- token verdicts ------------------------------------------------------
    def save_token(self, token_hash: str, principal: dict | None) -> None:
        if principal is None:  # (never skipped: a restart must not honour a verdict the hub withdrew)
            self._db.execute("DELETE FROM tokens WHERE token_hash = ?", (token_hash,))
            return
        with self._best_effort("a token verdict"):
            self._db.execute("INSERT OR REPLACE INTO tokens VALUES (?, ?)", (token_hash, json.dumps(principal)))

    def tokens(self) -> dict[str, dict]:
        return {h: json.loads(p) for h, p in self._db.execute("SELECT token_hash, principal FROM tokens")}
