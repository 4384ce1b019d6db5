"""Multipart upload state, kept by the gateway itself (hub or spoke alike).

Parts are chunked and stored as they arrive (through the data plane's chunk
sink), so only their chunk lists and MD5s live here: a small SQLite database
in the gateway's state directory. Completing an upload concatenates the parts'
chunk lists into one file entry; nothing is copied. A completed upload is
remembered for :data:`COMPLETED_TTL` (S3 answers a repeated completion with the
same result), and the object keeps its part sizes (:func:`encode_part_sizes`) so
that GET/HEAD ``?partNumber=N`` can serve one part.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass

import msgpack

from fabric.util.sqlite import SharedConnection

SCHEMA = """
CREATE TABLE IF NOT EXISTS uploads (
    id TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    path TEXT NOT NULL,
    meta TEXT NOT NULL,
    initiator TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket, key, id);
CREATE TABLE IF NOT EXISTS parts (
    upload_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    etag TEXT NOT NULL,
    size INTEGER NOT NULL,
    chunks BLOB NOT NULL,
    modified REAL NOT NULL,
    PRIMARY KEY (upload_id, number)
);
CREATE TABLE IF NOT EXISTS completed (
    id TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    path TEXT NOT NULL,
    etag TEXT NOT NULL,
    mtime_ns INTEGER NOT NULL,
    done REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS completed_by_time ON completed (done);
"""

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_SIZE = 5 * 1024 * 1024 * 1024
MAX_PARTS = 10000
#: How long a completed upload is remembered, to answer a repeated CompleteMultipartUpload.
COMPLETED_TTL = 24 * 3600.0


@dataclass(frozen=True)
class Upload:
    id: str
    bucket: str
    key: str
    repo: str
    branch: str
    path: str
    meta: dict
    initiator: str
    created: float


@dataclass(frozen=True)
class Part:
    number: int
    etag: str
    size: int
    modified: float


@dataclass(frozen=True)
class Completed:
    """A completed upload: where its object went, and that object's identity (ETag, mtime)."""

    id: str
    bucket: str
    key: str
    repo: str
    branch: str
    path: str
    etag: str
    mtime_ns: int
    done: float


def encode_part_sizes(sizes: list[int]) -> str:
    """Part sizes as ``SIZE*COUNT`` runs joined by ',' (``5242880*3,17``): short for the usual
    uploads, whose parts are all one size but the last."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ",".join(f"{size}*{count}" if count > 1 else str(size) for size, count in runs)


def decode_part_sizes(text: str) -> list[int] | None:
    """The sizes :func:`encode_part_sizes` wrote; ``None`` for anything malformed."""
    sizes: list[int] = []
    try:
        for run in text.split(","):
            size, _, count = run.partition("*")
            n = int(count) if count else 1
            if n < 1 or int(size) < 0 or len(sizes) + n > MAX_PARTS:
                return None
            sizes.extend([int(size)] * n)
    except ValueError:
        return None
    return sizes or None


def multipart_etag(part_md5s: list[str]) -> str:
    """S3's ETag of a multipart object: MD5 of the parts' binary MD5s, then ``-N``."""
    return hashlib.md5(b"".join(bytes.fromhex(m) for m in part_md5s)).hexdigest() + f"-{len(part_md5s)}"


class Uploads:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "multipart.db")
        self._db = SharedConnection(self.path, durability="normal", schema=SCHEMA)

    def close(self) -> None:
        self._db.close()

    def create(self, bucket: str, key: str, repo: str, branch: str, path: str, meta: dict, initiator: str) -> str:
        upload_id = secrets.token_urlsafe(24)
        self._db.execute(
            "INSERT INTO uploads (id, bucket, key, repo, branch, path, meta, initiator, created) VALUES (?,?,?,?,?,?,?,?,?)",
            (upload_id, bucket, key, repo, branch, path, json.dumps(meta), initiator, time.time()),
        )
        return upload_id

    def get(self, upload_id: str) -> Upload | None:
        rows = self._db.execute(
            "SELECT id, bucket, key, repo, branch, path, meta, initiator, created FROM uploads WHERE id = ?", (upload_id,)
        )
        if not rows:
            return None
        r = rows[0]
        return Upload(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8])

    def put_part(self, upload_id: str, number: int, etag: str, size: int, chunks: list[tuple[bytes, int]]) -> None:
        blob = msgpack.packb([[c, n] for c, n in chunks], use_bin_type=True)
        self._db.execute(
            "INSERT INTO parts (upload_id, number, etag, size, chunks, modified) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT (upload_id, number) DO UPDATE SET etag = excluded.etag, size = excluded.size, "
            "chunks = excluded.chunks, modified = excluded.modified",
            (upload_id, number, etag, size, blob, time.time()),
        )

    def parts(self, upload_id: str, after: int = 0, limit: int = 1000) -> list[Part]:
        rows = self._db.execute(
            "SELECT number, etag, size, modified FROM parts WHERE upload_id = ? AND number > ? ORDER BY number LIMIT ?",
            (upload_id, after, limit),
        )
        return [Part(*r) for r in rows]

    def part_chunks(self, upload_id: str) -> dict[int, tuple[str, int, list[tuple[bytes, int]]]]:
        rows = self._db.execute("SELECT number, etag, size, chunks FROM parts WHERE upload_id = ?", (upload_id,))
        return {n: (etag, size, [(bytes(c), k) for c, k in msgpack.unpackb(blob, raw=False)]) for n, etag, size, blob in rows}

    def complete(self, up: Upload, etag: str, mtime_ns: int) -> None:
        """Forget the upload and its parts, and remember that it completed (see :meth:`completed`)."""
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM parts WHERE upload_id = ?", (up.id,))
            cur.execute("DELETE FROM uploads WHERE id = ?", (up.id,))
            cur.execute(
                "INSERT OR REPLACE INTO completed (id, bucket, key, repo, branch, path, etag, mtime_ns, done) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (up.id, up.bucket, up.key, up.repo, up.branch, up.path, etag, mtime_ns, time.time()),
            )

    def completed(self, upload_id: str, now: float | None = None) -> Completed | None:
        """The completed upload of this id, if it completed less than :data:`COMPLETED_TTL` ago."""
        now = time.time() if now is None else now
        rows = self._db.execute(
            "SELECT id, bucket, key, repo, branch, path, etag, mtime_ns, done FROM completed WHERE id = ? AND done > ?",
            (upload_id, now - COMPLETED_TTL),
        )
        return Completed(*rows[0]) if rows else None

    def prune_completed(self, now: float | None = None) -> int:
        """Forget completions older than :data:`COMPLETED_TTL`; how many were forgotten."""
        now = time.time() if now is None else now
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM completed WHERE done <= ?", (now - COMPLETED_TTL,))
            return cur.rowcount

    def delete(self, upload_id: str) -> bool:
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM parts WHERE upload_id = ?", (upload_id,))
            cur.execute("DELETE FROM uploads WHERE id = ?", (upload_id,))
            return cur.rowcount > 0

    def all(self) -> list[Upload]:
        rows = self._db.execute("SELECT id, bucket, key, repo, branch, path, meta, initiator, created FROM uploads ORDER BY created")
        return [Upload(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8]) for r in rows]

    def list(self, bucket: str, prefix: str = "", key_marker: str = "", id_marker: str = "", limit: int = 1000) -> list[Upload]:
        rows = self._db.execute(
            "SELECT id, bucket, key, repo, branch, path, meta, initiator, created FROM uploads "
            "WHERE bucket = ? AND key >= ? ORDER BY key, id",
            (bucket, key_marker),
        )
        out = []
        for r in rows:
            up = Upload(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8])
            if not up.key.startswith(prefix):
                continue
            if key_marker and up.key == key_marker and (not id_marker or up.id <= id_marker):
                continue
            out.append(up)
            if len(out) > limit:
                break
        return out
