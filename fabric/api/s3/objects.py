"""S3 object operations: Get/Head/Put/Delete/CopyObject and DeleteObjects.

Writes land in the branch's staging area (committed through REST/CLI or by the
:class:`~fabric.api.s3.autocommit.AutoCommitter`); user metadata and the
standard headers S3 keeps with an object live in the entry's metadata.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from fabric.api.headers import InvalidRange, http_date, parse_range
from fabric.api.s3 import xml as X
from fabric.api.s3.auth import require
from fabric.api.s3.autocommit import AutoCommitter
from fabric.api.s3.conditions import KeyLocks, check_read_conditions, check_write_conditions, is_conditional_write
from fabric.api.s3.entrymeta import INTERNAL_PREFIX, internal, part_range, slash_key
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.namespace import Bucket, Namespace, stored_entry
from fabric.api.s3.request import Ctx, iso8601, xml_response
from fabric.api.s3.specials import special_headers
from fabric.api.s3.transport import GatewayStats, Response
from fabric.api.s3.versions import deleted_xml, plan_deletes, read_version, version_headers
from fabric.errors import FabricError, NotFound, RangeNotSatisfiable
from fabric.format.ingest import file_entry, ingest_stream
from fabric.format.model import DIR, FILE, Entry, stored_ids
from fabric.plane.dataplane import DataPlane
from fabric.util.pieces import READ_WHOLE_MAX

MAX_META_BYTES = 2048
#: Standard headers kept with an object (stored in its metadata under ``s3:NAME``).
STORED_HEADERS = ("content-type", "content-encoding", "content-disposition", "content-language", "cache-control", "expires")
SYS_PREFIX = "s3:"
DEFAULT_CONTENT_TYPE = "binary/octet-stream"
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


def requested_range(header: str, size: int) -> tuple[int, int] | None:
    """``Range`` as S3 answers it: ``(offset, length)``; ``None`` to ignore a header that is
    not one valid bytes range (the whole object is sent); :class:`S3Error` InvalidRange
    (416, with ``Content-Range: bytes */SIZE``) when it cannot be satisfied."""
    try:
        return parse_range(header, size)
    except InvalidRange:
        return None
    except RangeNotSatisfiable as exc:
        raise from_fabric(exc) from None


def meta_from_headers(headers: dict[str, str]) -> dict[str, str]:
    """The metadata a write keeps: ``x-amz-meta-*`` and the :data:`STORED_HEADERS`."""
    meta: dict[str, str] = {}
    size = 0
    for name, value in headers.items():
        if name.startswith("x-amz-meta-"):
            k = name[len("x-amz-meta-") :]
            meta[k] = value
            size += len(k) + len(value)
        elif name in STORED_HEADERS:
            if name == "content-encoding":
                value = ",".join(p for p in (s.strip() for s in value.split(",")) if p and p.lower() != "aws-chunked")
                if not value:
                    continue
            meta[SYS_PREFIX + name] = value
    if size > MAX_META_BYTES:
        raise S3Error("MetadataTooLarge", f"user metadata is limited to {MAX_META_BYTES} bytes", 400)
    return meta


def object_headers(e: Entry, size: int) -> dict[str, str]:
    h = {
        "ETag": f'"{e.md5}"',
        "Last-Modified": http_date(e.mtime_ns / 1e9),
        "Accept-Ranges": "bytes",
        "Content-Type": DEFAULT_CONTENT_TYPE,
        "Content-Length": str(size),
    }
    for k, v in e.meta.items():
        if k.startswith(INTERNAL_PREFIX):
            continue
        if k.startswith(SYS_PREFIX):
            name = k[len(SYS_PREFIX) :]
            h["-".join(p.capitalize() for p in name.split("-"))] = v
        else:
            h["x-amz-meta-" + k] = v
    h.update(special_headers(e))
    return h


class ObjectHandlers:
    """The object operations, and the write path (:meth:`ingest`, :meth:`stage`) multipart uploads share."""

    def __init__(
        self, plane: DataPlane, namespace: Namespace, stats: GatewayStats, autocommit: AutoCommitter | None
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.stats = stats
        self.autocommit = autocommit
        self._key_locks = KeyLocks()

    # -- the write path ---------------------------------------------------------------------
    def ingest(self, repo: str, stream: Any) -> tuple[list[tuple[bytes, int]], str]:
        """Chunk and store a body as chunks of ``repo``: its chunk list and MD5."""
        sink = self.plane.chunk_sink(repo)
        chunks, md5 = ingest_stream(stream, sink)
        sink.close()
        return chunks, md5

    def share(self, source_repo: str, repo: str, chunks: Sequence[tuple[bytes, int]]) -> None:
        """Before a copy between repositories: the source's chunks become the target's too
        (the caller may read the source: :meth:`copy_source` checked)."""
        if source_repo != repo and chunks:
            self.plane.share_chunks(source_repo, repo, stored_ids(chunks))

    def stage(self, ctx: Ctx, repo: str, branch: str, path: str, key: str, entry: Entry) -> None:
        """Stage ``entry`` at ``path`` if the request's write conditions hold: checked and staged
        atomically by the plane (at the hub, across hub processes), under the key's lock here
        for planes that only check, then stage."""
        if is_conditional_write(ctx):
            with self._key_locks.lock(repo, branch, path):
                self.plane.stage_if(
                    repo, branch, {path: entry}, lambda: check_write_conditions(self.plane, ctx, repo, branch, path, key)
                )
        else:
            self.plane.stage(repo, branch, {path: entry})
        self.wrote(ctx, repo, branch)

    def wrote(self, ctx: Ctx, repo: str, branch: str) -> None:
        if self.autocommit is not None:
            self.autocommit.wrote(repo, branch, ctx.who.name)

    def copy_source(self, ctx: Ctx) -> tuple[Bucket, str, str, Entry]:
        """The object named by ``x-amz-copy-source`` (checked for read access): (bucket, ref, path, entry)."""
        raw = ctx.header("x-amz-copy-source") or ""
        src = unquote(raw.partition("?")[0]).lstrip("/")
        bucket_name, _, key = src.partition("/")
        if not bucket_name or not key:
            raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: sourcebucket/sourcekey", 400)
        sb = self.namespace.bucket(bucket_name)
        ref, path, is_dir = self.namespace.split(sb, key, write=False)
        require(ctx.who, sb.repo, "read")
        try:
            entry = self.plane.stat_chunks(sb.repo, ref, path)
        except NotFound:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key) from None
        except FabricError as exc:
            raise from_fabric(exc) from None
        if entry.kind not in (FILE, DIR) or slash_key(entry) != is_dir:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
        check_read_conditions(ctx, entry, "x-amz-copy-source-")
        return sb, ref, path, entry

    # -- reading ------------------------------------------------------------------------------
    def get_object(self, ctx: Ctx, b: Bucket, key: str, head: bool) -> Response:
        vid = ctx.q.get("versionId")
        if vid is None:
            ref, path, _, e = self.namespace.locate_read(ctx.who, b, key)
        else:  # read at the commit that made the version (the branch, for its staged state)
            ref, path, e = read_version(self.plane, self.namespace, ctx.who, b, key, vid)
        check_read_conditions(ctx, e, "")
        size = e.size if e.kind == FILE else 0
        offset, length, status = 0, size, 200
        headers = object_headers(e, size)
        if vid is not None:
            headers["x-amz-version-id"] = vid
        rng = ctx.header("range")
        part = ctx.q.get("partNumber")
        if part is not None:
            if rng:
                raise S3Error("InvalidRequest", "Cannot specify both Range header and partNumber query parameter", 400)
            offset, length, count = part_range(e, part)
            if size:
                status = 206
                headers["Content-Range"] = f"bytes {offset}-{offset + length - 1}/{size}"
                headers["Content-Length"] = str(length)
            if count is not None:
                headers["x-amz-mp-parts-count"] = str(count)
        elif rng and e.kind == FILE:
            parsed = requested_range(rng, size)
            if parsed is not None:
                offset, length = parsed
                status = 206
                headers["Content-Range"] = f"bytes {offset}-{offset + length - 1}/{size}"
                headers["Content-Length"] = str(length)
        for qname, hname in RESPONSE_OVERRIDES.items():
            if qname in ctx.q:
                headers[hname] = ctx.q[qname]
        if head or length == 0:
            return Response(status, headers, b"")
        if length <= READ_WHOLE_MAX:
            data = b"".join(self.plane.open_file(b.repo, ref, path, e, offset, length))
            return Response(status, headers, data)
        headers.pop("Content-Length")
        return Response(status, headers, iter(self.plane.open_file(b.repo, ref, path, e, offset, length)), length)

    def get_tagging(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        """Objects have no tags: an empty tag set for a key that exists."""
        self.namespace.locate_read(ctx.who, b, key)
        return xml_response(X.doc("Tagging", "<TagSet></TagSet>"))

    # -- writing ------------------------------------------------------------------------------
    def put_object(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, is_dir = self.namespace.locate_write(ctx.who, b, key)
        meta = meta_from_headers(ctx.req.headers)
        check_write_conditions(self.plane, ctx, b.repo, ref, path, key)  # fail fast, before the body
        stream = ctx.payload()
        try:
            chunks, md5 = self.ingest(b.repo, stream)
            entry = stored_entry(file_entry(chunks, md5, 0o644, time.time_ns(), meta), is_dir)
            self.stage(ctx, b.repo, ref, path, key, entry)
        except FabricError as exc:
            raise from_fabric(exc) from None
        self.stats.bytes_in += entry.size
        headers = {"ETag": f'"{entry.md5}"'}
        for algo, value in stream.checks.checksums.items():
            headers[f"x-amz-checksum-{algo}"] = value
        return Response(200, headers)

    def delete_object(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        vid = ctx.q.get("versionId")
        headers: dict[str, str] = {}
        if vid is not None:  # only the current version deletes anything (see plan_deletes)
            plan = plan_deletes(self.plane, self.namespace, ctx.who, b, [(key, vid)])[0]
            if plan.error is not None:
                raise plan.error
            headers = version_headers(plan)
            if not plan.delete_key:
                return Response(204, headers)
        ref, path, is_dir = self.namespace.locate_write(ctx.who, b, key)
        self._delete_one(b.repo, ref, path, is_dir)
        self.wrote(ctx, b.repo, ref)
        return Response(204, headers)

    def _delete_one(self, repo: str, branch: str, path: str, is_dir: bool) -> None:
        try:
            e = self.plane.stat(repo, branch, path)
        except NotFound:
            return
        if slash_key(e) != is_dir:
            return
        try:
            self.plane.delete_object(repo, branch, path)
        except NotFound:
            pass

    def delete_objects(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "write")
        objects, quiet = X.parse_delete_objects(ctx.read_small())
        plans = iter(plan_deletes(self.plane, self.namespace, ctx.who, b, [(k, v) for k, v in objects if v is not None]))
        out = []
        touched: set[tuple[str, str]] = set()
        for key, vid in objects:
            plan = next(plans) if vid is not None else None
            try:
                if plan is not None and plan.error is not None:
                    raise plan.error
                if plan is None or plan.delete_key:
                    ref, path, is_dir = self.namespace.locate_write(ctx.who, b, key)
                    self._delete_one(b.repo, ref, path, is_dir)
                    touched.add((b.repo, ref))
                if not quiet:
                    out.append(f"<Deleted>{X.el('Key', key)}{deleted_xml(plan) if plan else ''}</Deleted>")
            except (S3Error, FabricError) as exc:
                err = exc if isinstance(exc, S3Error) else from_fabric(exc)
                version = X.el("VersionId", vid) if vid is not None else ""
                out.append(f"<Error>{X.el('Key', key)}{version}{X.el('Code', err.code)}{X.el('Message', err.message)}</Error>")
        for repo, branch in touched:
            self.wrote(ctx, repo, branch)
        return xml_response(X.doc("DeleteResult", "".join(out)))

    def copy_object(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, is_dir = self.namespace.locate_write(ctx.who, b, key)
        sb, sref, spath, entry = self.copy_source(ctx)
        directive = (ctx.header("x-amz-metadata-directive") or "COPY").upper()
        if directive not in ("COPY", "REPLACE"):
            raise S3Error("InvalidArgument", "Unknown metadata directive.", 400)
        if directive == "COPY" and sb.repo == b.repo and sref == ref and spath == path:
            raise S3Error(
                "InvalidRequest",
                "This copy request is illegal because it is trying to copy an object to itself without changing the "
                "object's metadata, storage class, website redirect location or encryption attributes.",
                400,
            )
        meta = entry.meta if directive == "COPY" else {**meta_from_headers(ctx.req.headers), **internal(entry.meta)}
        now = time.time_ns()
        new = stored_entry(entry.with_(mtime_ns=now, meta=dict(meta), mode=0o644, uid=None, gid=None), is_dir)
        try:
            self.share(sb.repo, b.repo, entry.chunks)
            self.stage(ctx, b.repo, ref, path, key, new)
        except FabricError as exc:
            raise from_fabric(exc) from None
        return xml_response(
            X.doc("CopyObjectResult", X.el("LastModified", iso8601(now / 1e9)) + X.el("ETag", f'"{new.md5}"'))
        )
