"""S3 multipart uploads: Create/UploadPart(Copy)/Complete/Abort, ListParts and
ListMultipartUploads, over the upload state of :mod:`fabric.api.s3.multipart`.

Parts are chunked into the plane as they arrive; completing an upload stages one
file entry whose chunk list is the parts' lists end to end, with the part sizes in
its metadata (for GET/HEAD ``?partNumber=``). A repeated completion of an upload
answers as the first did while the key still holds that object. Chunks of uploads in
progress are kept from garbage collection, and old uploads aborted, by
:meth:`MultipartHandlers.maintain_uploads` (run every 20 minutes in a thread).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator

from fabric.api.s3 import xml as X
from fabric.api.s3.auth import require
from fabric.api.s3.entrymeta import PARTS, slash_key
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.multipart import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, encode_part_sizes, multipart_etag
from fabric.api.s3.namespace import Bucket, Namespace, stored_entry
from fabric.api.s3.objects import ObjectHandlers, meta_from_headers
from fabric.api.s3.request import Ctx, iso8601, owner_xml, xml_response
from fabric.api.s3.transport import GatewayStats, Response
from fabric.catalog.uploads import Upload, UploadStore
from fabric.errors import ChunksMissing, FabricError, NotFound
from fabric.format.ingest import file_entry
from fabric.plane.dataplane import DataPlane

log = logging.getLogger("fabric.s3")

MAINTENANCE_INTERVAL = 1200.0


class _RangeReader:
    """A file-like view of an iterator of byte pieces (a range of an object being copied)."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._it = pieces
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            piece = next(self._it, None)
            if piece is None:
                break
            self._buf += bytes(piece)
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


class MultipartHandlers:
    def __init__(
        self,
        plane: DataPlane,
        namespace: Namespace,
        objects: ObjectHandlers,
        uploads: UploadStore,
        stats: GatewayStats,
        upload_expiry: float,
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.objects = objects
        self.uploads = uploads
        self.stats = stats
        self.upload_expiry = upload_expiry
        self._stop = threading.Event()
        self._maint = threading.Thread(target=self._maintenance_loop, name="s3-uploads", daemon=True)
        self._maint.start()

    def close(self) -> None:
        """Stop the maintenance thread (the upload state is the gateway's to close)."""
        self._stop.set()

    # -- upload maintenance --------------------------------------------------------------
    def maintain_uploads(self, now: float | None = None) -> dict:
        """Keep the chunks of uploads in progress from garbage collection (asking the plane
        which of them it lacks refreshes them), abort uploads older than ``upload_expiry``, and
        forget old completions."""
        now = time.time() if now is None else now
        self.uploads.prune_completed(now)
        touched = aborted = 0
        for up in self.uploads.all():
            if now - up.created > self.upload_expiry:
                self.uploads.delete(up.id)
                aborted += 1
                continue
            ids = [cid for _, _, chunks in self.uploads.part_chunks(up.id).values() for cid, _ in chunks]
            for i in range(0, len(ids), 10000):
                self.plane.missing_chunks(ids[i : i + 10000])
            touched += len(ids)
        return {"touched_chunks": touched, "aborted_uploads": aborted}

    def _maintenance_loop(self) -> None:
        while not self._stop.wait(MAINTENANCE_INTERVAL):
            try:
                self.maintain_uploads()
            except Exception:
                log.exception("multipart upload maintenance failed")

    # -- operations -----------------------------------------------------------------------
    def create_upload(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, _ = self.namespace.locate_write(ctx.who, b, key)
        meta = meta_from_headers(ctx.req.headers)
        upload_id = self.uploads.create(b.name, key, b.repo, ref, path, meta, ctx.who.token_id or ctx.who.name)
        body = X.el("Bucket", b.name) + X.el("Key", key) + X.el("UploadId", upload_id)
        headers = {}
        algo = ctx.header("x-amz-checksum-algorithm")
        if algo:
            headers["x-amz-checksum-algorithm"] = algo
        resp = xml_response(X.doc("InitiateMultipartUploadResult", body))
        resp.headers.update(headers)  # type: ignore[union-attr]
        return resp

    def _upload(self, ctx: Ctx, b: Bucket, key: str, role: str = "write") -> Upload:
        upload_id = ctx.q.get("uploadId", "")
        up = self.uploads.get(upload_id)
        if up is None or up.bucket != b.name or up.key != key:
            raise S3Error(
                "NoSuchUpload",
                "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
                404,
                UploadId=upload_id,
            )
        require(ctx.who, b.repo, role)
        return up

    def upload_part(self, ctx: Ctx, b: Bucket, key: str, copy: bool) -> Response:
        up = self._upload(ctx, b, key)
        try:
            number = int(ctx.q.get("partNumber", ""))
        except ValueError:
            number = 0
        if not 1 <= number <= MAX_PARTS:
            raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {MAX_PARTS}, inclusive", 400)
        if copy:
            chunks, md5 = self._copy_part(ctx, up.repo)
            size = sum(n for _, n in chunks)
        else:
            declared = ctx.header("content-length")
            if declared and declared.isdigit() and int(declared) > MAX_PART_SIZE + (1 << 20):
                raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size", 400)
            stream = ctx.payload()
            try:
                chunks, md5 = self.objects.ingest(up.repo, stream)
            except FabricError as exc:
                raise from_fabric(exc) from None
            size = sum(n for _, n in chunks)
            self.stats.bytes_in += size
        if size > MAX_PART_SIZE:
            raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size", 400)
        if self.uploads.get(up.id) is None:
            raise S3Error("NoSuchUpload", "The specified upload does not exist.", 404, UploadId=up.id)
        self.uploads.put_part(up.id, number, md5, size, chunks)
        if copy:
            now = time.time()
            return xml_response(X.doc("CopyPartResult", X.el("LastModified", iso8601(now)) + X.el("ETag", f'"{md5}"')))
        headers = {"ETag": f'"{md5}"'}
        for algo, value in stream.checks.checksums.items():
            headers[f"x-amz-checksum-{algo}"] = value
        return Response(200, headers)

    def _copy_part(self, ctx: Ctx, repo: str) -> tuple[list[tuple[bytes, int]], str]:
        """The chunks (made chunks of ``repo``) and MD5 of the copy source, or of
        ``x-amz-copy-source-range``: unlike ``Range``, exactly ``bytes=first-last`` and
        inside the object, or the request fails."""
        sb, sref, spath, entry = self.objects.copy_source(ctx)
        rng = ctx.header("x-amz-copy-source-range")
        whole = True
        offset, length = 0, entry.size
        if rng:
            unit, _, spec = rng.partition("=")
            a, _, z = spec.partition("-")
            try:
                offset, end = int(a), int(z)
            except ValueError:
                raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of the form bytes=first-last", 400) from None
            if unit.strip() != "bytes" or offset < 0 or end < offset or end >= entry.size:
                raise S3Error("InvalidRange", "The requested range is not satisfiable", 416)
            length = end - offset + 1
            whole = offset == 0 and length == entry.size
        try:
            if whole and "-" not in entry.md5 and entry.md5:
                self.objects.share(sb.repo, repo, entry.chunks)
                return list(entry.chunks), entry.md5
            if length == 0:
                return [], hashlib.md5(b"").hexdigest()
            pieces = self.plane.open_file(sb.repo, sref, spath, entry, offset, length)
            return self.objects.ingest(repo, _RangeReader(iter(pieces)))
        except FabricError as exc:
            raise from_fabric(exc) from None

    def list_parts(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        up = self._upload(ctx, b, key, "read")
        try:
            marker = int(ctx.q.get("part-number-marker", "0") or 0)
            max_parts = min(int(ctx.q.get("max-parts", "1000")), 1000)
        except ValueError:
            raise S3Error("InvalidArgument", "part-number-marker and max-parts must be integers", 400) from None
        parts = self.uploads.parts(up.id, marker, max_parts + 1)
        truncated = len(parts) > max_parts
        parts = parts[:max_parts]
        out = [X.el("Bucket", b.name), X.el("Key", key), X.el("UploadId", up.id)]
        out.append(f"<Initiator>{X.el('ID', up.initiator)}{X.el('DisplayName', up.initiator)}</Initiator>")
        out.append(owner_xml(ctx))
        out.append(X.el("StorageClass", "STANDARD"))
        out.append(X.el("PartNumberMarker", marker))
        if parts:
            out.append(X.el("NextPartNumberMarker", parts[-1].number))
        out.append(X.el("MaxParts", max_parts))
        out.append(X.el("IsTruncated", "true" if truncated else "false"))
        for p in parts:
            out.append(
                f"<Part>{X.el('PartNumber', p.number)}{X.el('LastModified', iso8601(p.modified))}"
                f"{X.el('ETag', chr(34) + p.etag + chr(34))}{X.el('Size', p.size)}</Part>"
            )
        return xml_response(X.doc("ListPartsResult", "".join(out)))

    def complete_upload(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        if self.uploads.get(ctx.q.get("uploadId", "")) is None:
            etag = self._completed_before(ctx, b, key)
            if etag is not None:
                return _complete_result(b, key, etag)
        up = self._upload(ctx, b, key)
        chosen = _chosen_parts(X.parse_complete(ctx.read_small()))
        have = self.uploads.part_chunks(up.id)
        chunks: list[tuple[bytes, int]] = []
        md5s: list[str] = []
        sizes: list[int] = []
        for i, (n, etag) in enumerate(chosen):
            part = have.get(n)
            if part is None or part[0] != etag.lower():
                raise S3Error(
                    "InvalidPart",
                    "One or more of the specified parts could not be found. The part may not have been uploaded, "
                    "or the specified entity tag may not match the part's entity tag.",
                    400,
                    PartNumber=str(n),
                )
            if i < len(chosen) - 1 and part[1] < MIN_PART_SIZE:
                raise S3Error(
                    "EntityTooSmall", "Your proposed upload is smaller than the minimum allowed object size.", 400,
                    PartNumber=str(n), ProposedSize=str(part[1]), MinSizeAllowed=str(MIN_PART_SIZE),
                )
            chunks.extend(part[2])
            md5s.append(part[0])
            sizes.append(part[1])
        etag = multipart_etag(md5s)
        meta = {**up.meta, PARTS: encode_part_sizes(sizes)}
        entry = stored_entry(file_entry(chunks, etag, 0o644, time.time_ns(), meta), key.endswith("/"))
        try:
            self.objects.stage(ctx, up.repo, up.branch, up.path, key, entry)
        except ChunksMissing:
            raise S3Error("InvalidPart", "parts of this upload are no longer stored (expired); upload them again", 400) from None
        except FabricError as exc:
            raise from_fabric(exc) from None
        self.uploads.complete(up, etag, entry.mtime_ns)
        return _complete_result(b, key, etag)

    def _completed_before(self, ctx: Ctx, b: Bucket, key: str) -> str | None:
        """The ETag of the object this upload made, if it completed recently into this key
        and the key still holds that object (S3 answers a repeated completion with success)."""
        done = self.uploads.completed(ctx.q.get("uploadId", ""))
        if done is None or done.bucket != b.name or done.key != key:
            return None
        require(ctx.who, b.repo, "write")
        try:
            e = self.plane.stat(done.repo, done.branch, done.path)
        except NotFound:
            return None
        except FabricError as exc:
            raise from_fabric(exc) from None
        if e.md5 != done.etag or e.mtime_ns != done.mtime_ns or slash_key(e) != key.endswith("/"):
            return None
        return done.etag

    def abort_upload(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        up = self._upload(ctx, b, key)
        self.uploads.delete(up.id)
        return Response(204)

    def list_uploads(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        q = ctx.q
        prefix = q.get("prefix", "")
        key_marker = q.get("key-marker", "")
        id_marker = q.get("upload-id-marker", "")
        url = q.get("encoding-type") == "url"
        try:
            max_uploads = min(int(q.get("max-uploads", "1000")), 1000)
        except ValueError:
            raise S3Error("InvalidArgument", "max-uploads must be an integer", 400) from None
        ups = self.uploads.list(b.name, prefix, key_marker, id_marker, max_uploads)
        truncated = len(ups) > max_uploads
        ups = ups[:max_uploads]
        out = [X.el("Bucket", b.name), f"<KeyMarker>{X.key_text(key_marker, url)}</KeyMarker>", X.el("UploadIdMarker", id_marker)]
        if truncated and ups:
            out.append(f"<NextKeyMarker>{X.key_text(ups[-1].key, url)}</NextKeyMarker>")
            out.append(X.el("NextUploadIdMarker", ups[-1].id))
        out.append(f"<Prefix>{X.key_text(prefix, url)}</Prefix>")
        out.append(X.el("MaxUploads", max_uploads))
        out.append(X.el("IsTruncated", "true" if truncated else "false"))
        if url:
            out.append("<EncodingType>url</EncodingType>")
        for up in ups:
            out.append(
                f"<Upload><Key>{X.key_text(up.key, url)}</Key>{X.el('UploadId', up.id)}"
                f"<Initiator>{X.el('ID', up.initiator)}{X.el('DisplayName', up.initiator)}</Initiator>"
                f"{owner_xml(ctx)}<StorageClass>STANDARD</StorageClass>{X.el('Initiated', iso8601(up.created))}</Upload>"
            )
        return xml_response(X.doc("ListMultipartUploadsResult", "".join(out)))


def _chosen_parts(wanted: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The parts a CompleteMultipartUpload list names, in order: part numbers must not go
    down (InvalidPartOrder); a number named more than once counts once, by its last mention
    (a part uploaded twice is completed with its last upload, as S3 does)."""
    numbers = [n for n, _ in wanted]
    if any(later < earlier for earlier, later in zip(numbers, numbers[1:])):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order. Parts must be ordered by part number.", 400)
    return list(dict(wanted).items())


def _complete_result(b: Bucket, key: str, etag: str) -> Response:
    body = X.el("Location", f"/{b.name}/{key}") + X.el("Bucket", b.name) + X.el("Key", key) + X.el("ETag", f'"{etag}"')
    return xml_response(X.doc("CompleteMultipartUploadResult", body))
