"""S3 multipart uploads in progress, their parts, and recently completed uploads.

:class:`UploadStore` keeps them in a :class:`~fabric.catalog.db.Database`: the hub's
catalog (SQLite or PostgreSQL), so an upload started through one hub process takes
parts and completes through any other, or a gateway's own SQLite file (a spoke,
which has no catalog: :class:`fabric.api.s3.multipart.Uploads`).

Parts are chunked and stored as they arrive, so only their chunk lists and MD5s
are kept here. A completed upload is remembered for :data:`COMPLETED_TTL` (S3
answers a repeated completion with the same result).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

import msgpack

from fabric.catalog.db import Database
from fabric.catalog.schema import UPLOADS_SCHEMA

#: How long a completed upload is remembered, to answer a repeated CompleteMultipartUpload.
COMPLETED_TTL = 24 * 3600.0

_UPLOAD_COLUMNS = "id, bucket, key, repo, branch, path, meta, initiator, created"
_COMPLETED_COLUMNS = "id, bucket, key, repo, branch, path, etag, mtime_ns, done"


@dataclass(frozen=True)
class _Target:
    """An upload's id and where its object goes (the fields :class:`Upload` and :class:`Completed` share)."""

    id: str
    bucket: str
    key: str
    repo: str
    branch: str
    path: str


@dataclass(frozen=True)
class Upload(_Target):
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
class Completed(_Target):
    """A completed upload: where its object went, and that object's identity (ETag, mtime)."""

    etag: str
    mtime_ns: int
    done: float


def _upload(row: tuple) -> Upload:
    return Upload(row[0], row[1], row[2], row[3], row[4], row[5], json.loads(row[6]), row[7], row[8])


class UploadStore:
    """Multipart state in ``db``; ``owned``: :meth:`close` closes ``db`` (else it is the caller's)."""

    def __init__(self, db: Database, owned: bool = False) -> None:
        self.db = db
        self._owned = owned
        db.ddl(UPLOADS_SCHEMA)

    def close(self) -> None:
        if self._owned:
            self.db.close()

    def create(self, bucket: str, key: str, repo: str, branch: str, path: str, meta: dict, initiator: str) -> str:
        upload_id = secrets.token_urlsafe(24)
        with self.db.tx() as cur:
            cur.execute(
                f"INSERT INTO s3_uploads ({_UPLOAD_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                (upload_id, bucket, key, repo, branch, path, json.dumps(meta), initiator, time.time()),
            )
        return upload_id

    def get(self, upload_id: str) -> Upload | None:
        rows = self.db.query(f"SELECT {_UPLOAD_COLUMNS} FROM s3_uploads WHERE id = ?", (upload_id,))
        return _upload(rows[0]) if rows else None

    def put_part(self, upload_id: str, number: int, etag: str, size: int, chunks: list[tuple[bytes, int]]) -> None:
        """Record a part (replacing one of the same number); a no-op once the upload is gone."""
        blob = msgpack.packb([[c, n] for c, n in chunks], use_bin_type=True)
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO s3_parts (upload_id, number, etag, size, chunks, modified) "
                "SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM s3_uploads WHERE id = ?) "
                "ON CONFLICT (upload_id, number) DO UPDATE SET etag = excluded.etag, size = excluded.size, "
                "chunks = excluded.chunks, modified = excluded.modified",
                (upload_id, number, etag, size, blob, time.time(), upload_id),
            )

    def parts(self, upload_id: str, after: int = 0, limit: int = 1000) -> list[Part]:
        rows = self.db.query(
            "SELECT number, etag, size, modified FROM s3_parts WHERE upload_id = ? AND number > ? ORDER BY number LIMIT ?",
            (upload_id, after, limit),
        )
        return [Part(*r) for r in rows]

    def part_chunks(self, upload_id: str) -> dict[int, tuple[str, int, list[tuple[bytes, int]]]]:
        rows = self.db.query("SELECT number, etag, size, chunks FROM s3_parts WHERE upload_id = ?", (upload_id,))
        return {
            n: (etag, size, [(bytes(c), k) for c, k in msgpack.unpackb(bytes(blob), raw=False)])
            for n, etag, size, blob in rows
        }

    def complete(self, up: Upload, etag: str, mtime_ns: int) -> None:
        """Forget the upload and its parts, and remember that it completed (see :meth:`completed`)."""
        with self.db.tx() as cur:
            cur.execute("DELETE FROM s3_parts WHERE upload_id = ?", (up.id,))
            cur.execute("DELETE FROM s3_uploads WHERE id = ?", (up.id,))
            cur.execute(
                f"INSERT INTO s3_completed ({_COMPLETED_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (id) DO UPDATE SET etag = excluded.etag, mtime_ns = excluded.mtime_ns, done = excluded.done",
                (up.id, up.bucket, up.key, up.repo, up.branch, up.path, etag, mtime_ns, time.time()),
            )

    def completed(self, upload_id: str, now: float | None = None) -> Completed | None:
        """The completed upload of this id, if it completed less than :data:`COMPLETED_TTL` ago."""
        now = time.time() if now is None else now
        rows = self.db.query(
            f"SELECT {_COMPLETED_COLUMNS} FROM s3_completed WHERE id = ? AND done > ?", (upload_id, now - COMPLETED_TTL)
        )
        return Completed(*rows[0]) if rows else None

    def prune_completed(self, now: float | None = None) -> int:
        """Forget completions older than :data:`COMPLETED_TTL`; how many were forgotten."""
        now = time.time() if now is None else now
        with self.db.tx() as cur:
            cur.execute("DELETE FROM s3_completed WHERE done <= ?", (now - COMPLETED_TTL,))
            return cur.rowcount

    def delete(self, upload_id: str) -> bool:
        with self.db.tx() as cur:
            cur.execute("DELETE FROM s3_parts WHERE upload_id = ?", (upload_id,))
            cur.execute("DELETE FROM s3_uploads WHERE id = ?", (upload_id,))
            return cur.rowcount > 0

    def all(self) -> list[Upload]:
        return [_upload(r) for r in self.db.query(f"SELECT {_UPLOAD_COLUMNS} FROM s3_uploads ORDER BY created")]

    def list(self, bucket: str, prefix: str = "", key_marker: str = "", id_marker: str = "", limit: int = 1000) -> list[Upload]:
        """Uploads of ``bucket`` under ``prefix`` in (key, id) order after the markers: at most
        ``limit + 1`` (one more tells the caller the listing is truncated)."""
        sql = f"SELECT {_UPLOAD_COLUMNS} FROM s3_uploads WHERE bucket = ? AND key >= ?"
        params: list = [bucket, prefix]
        if key_marker and id_marker:
            sql += " AND (key > ? OR (key = ? AND id > ?))"
            params += [key_marker, key_marker, id_marker]
        elif key_marker:
            sql += " AND key > ?"
            params.append(key_marker)
        rows = self.db.query(sql + " ORDER BY key, id LIMIT ?", [*params, limit + 1])
        out = []
        for r in rows:  # keys under the prefix come first, in one run
            if not r[2].startswith(prefix):
                break
            out.append(_upload(r))
        return out

