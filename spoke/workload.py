"""What jobs read at a spoke: per dataset, which files and in which order (the model of learned prefetch).

A *dataset* is a repository and a prefix: the directory a job reads under, taken as the
longest common directory of its first :data:`PREFIX_READS` file opens (``""``: the
repository's root). A job whose first open falls under the prefix of a dataset already
known joins that dataset (the longest such prefix). Per dataset the model keeps:

- the *working set*: the files jobs opened, with their sizes (often a subset of the
  repository);
- *successor pairs*: after file A, jobs opened B next; one majority-vote counter per
  file (a successor seen again gains a vote, another one takes a vote away and replaces
  it when none are left), so a fixed order is learnt and a shuffled one fades out;
- *directory order* needs nothing stored: the working set sorted by path.

:meth:`Dataset.predict` follows successors from the last file opened and continues in
directory order, so a fixed order, a sorted walk and a shuffled epoch (which still reads
the working set) are all covered. Sequential reads within a file are the reader's
readahead, not this module's.

The model is not tied to a commit: paths usually survive new commits, so it is used
across them (a path gone is skipped).

Persisted in SQLite in the spoke's cache directory (``workload.db``; synchronous
``normal``: a crash may lose the last few observations, never the database), so it
survives a restart. Bounded: at most :data:`MAX_FILES` files per dataset and
:data:`MAX_ROWS` files in all (the least recently read datasets go first).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, field

from fabric.util.sqlite import SharedConnection

#: File opens that fix a new dataset's prefix.
PREFIX_READS = 8
#: Files kept per dataset, and in all datasets together.
MAX_FILES = 100_000
MAX_ROWS = 200_000
#: Datasets kept in memory at once (loaded from the database on use).
LOADED_DATASETS = 8

SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    id INTEGER PRIMARY KEY,
    repo TEXT NOT NULL,
    prefix TEXT NOT NULL,
    used REAL NOT NULL,
    UNIQUE (repo, prefix)
);
CREATE TABLE IF NOT EXISTS files (
    dataset INTEGER NOT NULL,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    seen REAL NOT NULL,
    next TEXT,
    votes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dataset, path)
);
"""


def common_directory(paths: Sequence[str]) -> str:
    """The longest directory (ending in ``/``, or ``""``) that holds every path."""
    dirs = [p.split("/")[:-1] for p in paths]
    if not dirs:
        return ""
    common = dirs[0]
    for d in dirs[1:]:
        n = 0
        while n < min(len(common), len(d)) and common[n] == d[n]:
            n += 1
        common = common[:n]
    return "".join(part + "/" for part in common)


@dataclass
class Dataset:
    id: int
    repo: str
    prefix: str
    sizes: dict[str, int] = field(default_factory=dict)
    successor: dict[str, str] = field(default_factory=dict)
    _sorted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sorted = sorted(self.sizes)

    def __contains__(self, path: str) -> bool:
        return path in self.sizes

    def predict(self, after: str | None, skip: Container[str]) -> Iterator[str]:
        """Files of the working set not in ``skip``, in the order they are expected after
        ``after``: its chain of successors, then directory order from it (wrapping round)."""
        yielded: set[str] = set()
        cur, hops = after, 0
        while cur is not None and hops < len(self.sizes):
            cur = self.successor.get(cur)
            hops += 1
            if cur is None or cur in yielded:
                break
            if cur in self.sizes and cur not in skip:
                yielded.add(cur)
                yield cur
        start = bisect.bisect_right(self._sorted, after or "")
        for path in (*self._sorted[start:], *self._sorted[:start]):
            if path not in skip and path not in yielded:
                yield path


class WorkloadStore:
    """The datasets' models in ``<cache_dir>/workload.db``."""

    def __init__(self, cache_dir: str) -> None:
        self._db = SharedConnection(os.path.join(cache_dir, "workload.db"), "normal", SCHEMA)
        self._lock = threading.Lock()
        self._loaded: dict[int, Dataset] = {}

    def close(self) -> None:
        self._db.close()

    def find(self, repo: str, path: str) -> Dataset | None:
        """The dataset of ``repo`` whose prefix holds ``path`` (the longest), loaded; None if none."""
        rows = self._db.execute("SELECT id, prefix FROM datasets WHERE repo = ? ORDER BY used DESC", (repo,))
        best = None
        for did, prefix in rows:
            if path.startswith(prefix) and (best is None or len(prefix) > len(best[1])):
                best = (did, prefix)
        return self.load(best[0], repo, best[1]) if best is not None else None

    def load(self, did: int, repo: str, prefix: str) -> Dataset:
        with self._lock:
            ds = self._loaded.get(did)
            if ds is not None:
                return ds
        rows = self._db.execute("SELECT path, size, next FROM files WHERE dataset = ?", (did,))
        ds = Dataset(did, repo, prefix, {p: s for p, s, _ in rows}, {p: n for p, _, n in rows if n is not None})
        with self._lock:
            if len(self._loaded) >= LOADED_DATASETS:
                self._loaded.pop(next(iter(self._loaded)))
            self._loaded[did] = ds
        return ds

    def dataset(self, repo: str, prefix: str) -> Dataset:
        """The dataset ``repo``/``prefix`` (made if new)."""
        with self._db.transaction() as cur:
            cur.execute(
                "INSERT INTO datasets (repo, prefix, used) VALUES (?, ?, ?) "
                "ON CONFLICT (repo, prefix) DO UPDATE SET used = excluded.used",
                (repo, prefix, time.time()),
            )
            did = cur.execute("SELECT id FROM datasets WHERE repo = ? AND prefix = ?", (repo, prefix)).fetchone()[0]
        return self.load(did, repo, prefix)

    def record(self, ds: Dataset, files: Sequence[tuple[str, int]], pairs: Sequence[tuple[str, str]]) -> None:
        """Add observations to ``ds``: files opened (path, size) and successor pairs (a, then b)."""
        now = time.time()
        with self._db.transaction() as cur:
            cur.executemany(
                "INSERT INTO files (dataset, path, size, seen) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (dataset, path) DO UPDATE SET size = excluded.size, seen = excluded.seen",
                [(ds.id, p, s, now) for p, s in files],
            )
            for a, b in pairs:
                row = cur.execute("SELECT next, votes FROM files WHERE dataset = ? AND path = ?", (ds.id, a)).fetchone()
                if row is None:
                    continue
                nxt, votes = row
                if nxt == b:
                    votes += 1
                elif votes > 1:
                    votes -= 1
                else:
                    nxt, votes = b, 1
                cur.execute("UPDATE files SET next = ?, votes = ? WHERE dataset = ? AND path = ?", (nxt, votes, ds.id, a))
                ds.successor[a] = nxt
            cur.execute("UPDATE datasets SET used = ? WHERE id = ?", (now, ds.id))
            self._bound(cur, ds.id)
        with self._lock:
            for p, s in files:
                if p not in ds.sizes:
                    bisect.insort(ds._sorted, p)
                ds.sizes[p] = s

    def _bound(self, cur, did: int) -> None:  # noqa: ANN001 - a sqlite3 cursor
        """Keep :data:`MAX_FILES` per dataset (the most recently seen) and :data:`MAX_ROWS` in all."""
        (n,) = cur.execute("SELECT COUNT(*) FROM files WHERE dataset = ?", (did,)).fetchone()
        if n > MAX_FILES:
            cur.execute(
                "DELETE FROM files WHERE dataset = ? AND path IN "
                "(SELECT path FROM files WHERE dataset = ? ORDER BY seen LIMIT ?)",
                (did, did, n - MAX_FILES),
            )
            with self._lock:
                self._loaded.pop(did, None)
        while cur.execute("SELECT COUNT(*) FROM files").fetchone()[0] > MAX_ROWS:
            old = cur.execute("SELECT id FROM datasets WHERE id != ? ORDER BY used LIMIT 1", (did,)).fetchone()
            if old is None:
                break
            cur.execute("DELETE FROM files WHERE dataset = ?", old)
            cur.execute("DELETE FROM datasets WHERE id = ?", old)
            with self._lock:
                self._loaded.pop(old[0], None)

    def stats(self) -> dict:
        (datasets,) = self._db.execute("SELECT COUNT(*) FROM datasets")[0]
        (files,) = self._db.execute("SELECT COUNT(*) FROM files")[0]
        return {"datasets": datasets, "files": files}
