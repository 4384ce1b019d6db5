"""The S3 gateway: an ASGI app that serves every repository as an S3 bucket.

Path-style only: ``/BUCKET/KEY``. A bucket is either a repository, whose keys
are ``REF/PATH`` (a branch, tag or commit id, then the path), or a *bound*
bucket (``fabric bucket create NAME REPO@REF``, or S3 CreateBucket) whose keys
are plain paths on one branch or tag.

The gateway is thin: it translates S3 to :class:`~fabric.plane.dataplane.DataPlane`
calls and never touches a catalog or a pack store, so the hub and every spoke
serve it unchanged over their own plane. It needs three things from its host:

- ``plane``: the data plane;
- ``credentials(access_key_id) -> (Principal, secret)``: raises for an unknown
  key (fabric tokens double as S3 key pairs); ``None`` turns authentication off;
- ``buckets(name) -> dict | None``: the binding of a bucket name
  (``{name, repo, ref, created, created_by_s3}``), ``None`` when the name is
  not bound (it may still be a repository). Default: ``plane.get_bucket``,
  cached for a few seconds.

Multipart state lives in ``state_dir`` (SQLite); objects written over S3 land
in the branch's staging area and are committed through REST/CLI, or by the
gateway itself with ``autocommit`` (``0``: after every write; ``N``: every N
seconds for branches written to).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from typing import Any
from urllib.parse import unquote

from fabric.auth.principal import ANONYMOUS_ADMIN, Principal
from fabric.errors import BadRequest, FabricError, NotFound
from fabric.format.ingest import file_entry, ingest_stream
from fabric.format.model import DIR, FILE, Entry
from fabric.format.paths import check_path, check_prefix, check_repo_name
from fabric.plane.dataplane import DataPlane
from fabric.api.s3 import sigv4
from fabric.api.s3 import xml as X
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.multipart import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, Uploads, multipart_etag

log = logging.getLogger("fabric.s3")
access_log = logging.getLogger("fabric.s3.access")

#: Objects up to this size are read whole in one worker-thread hop; larger ones stream.
SMALL_OBJECT = 1 << 20
#: An unread request body up to this size is read and dropped after an early answer; larger ones close the connection.
DRAIN_LIMIT = 8 << 20
STREAM_PIECE = 1 << 20
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
#: Sub-resources we answer NotImplemented (rather than mistaking them for a plain GET/PUT).
UNSUPPORTED = {
    "policy", "cors", "lifecycle", "website", "logging", "notification", "replication", "encryption",
    "object-lock", "retention", "legal-hold", "versions", "accelerate", "requestPayment", "ownershipControls",
    "publicAccessBlock", "intelligent-tiering", "inventory", "metrics", "analytics", "restore", "select",
    "torrent", "attributes", "policyStatus", "rename",
}

BindingLookup = Callable[[str], "dict | None"]
CredentialLookup = Callable[[str], tuple[Principal, str]]


def iso8601(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def http_date(ts: float) -> str:
    return formatdate(ts, usegmt=True)


@dataclass(frozen=True)
class Bucket:
    name: str
    repo: str
    ref: str | None  # None: keys are REF/PATH
    created: float = 0.0
    created_by_s3: bool = False


@dataclass
class Response:
    status: int = 200
    headers: dict[str, str] | None = None
    body: bytes | Iterator[bytes] = b""
    length: int | None = None  # Content-Length of a streamed body


class TTLCache:
    """A tiny thread-safe cache of recent answers (bucket bindings, credentials)."""

    def __init__(self, ttl: float, limit: int = 10000) -> None:
        self.ttl = ttl
        self.limit = limit
        self._items: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._items.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = compute()
        with self._lock:
            if len(self._items) >= self.limit:
                self._items.clear()
            self._items[key] = (now + self.ttl, value)
        return value

    def drop(self, key: Any = None) -> None:
        with self._lock:
            if key is None:
                self._items.clear()
            else:
                self._items.pop(key, None)


def plane_bindings(plane: DataPlane) -> BindingLookup:
    """The default binding lookup: ``plane.get_bucket``, ``None`` when the name is unbound."""

    def lookup(name: str) -> dict | None:
        try:
            return plane.get_bucket(name)
        except NotFound:
            return None

    return lookup


# -- request plumbing ----------------------------------------------------------------
class AsgiBody:
    """A blocking ``read(n)`` over an ASGI ``receive`` channel, for worker threads."""

    def __init__(self, receive: Callable[[], Any], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._receive = receive
        self._loop = loop
        self._buf = bytearray()
        self._more = True
        self.started = False

    async def _next(self) -> bytes:
        msg = await self._receive()
        if msg["type"] == "http.disconnect":
            self._more = False
            raise S3Error("IncompleteBody", "the client disconnected before the body was complete", 400)
        self._more = bool(msg.get("more_body", False))
        return msg.get("body", b"")

    def unread(self, scope: dict) -> bool:
        """Whether the request declared a body that has not been read to its end."""
        if not self._more:
            return False
        for k, v in scope["headers"]:
            if k == b"content-length" and v.strip() not in (b"", b"0"):
                return True
            if k == b"transfer-encoding":
                return True
        return False

    async def drain(self) -> None:
        while self._more:
            await self._next()
        self._buf = bytearray()

    def read(self, n: int = -1) -> bytes:
        self.started = True
        while self._more and (n < 0 or len(self._buf) < n):
            assert self._loop is not None, "AsgiBody.read() runs in a worker thread of the gateway"
            self._buf += asyncio.run_coroutine_threadsafe(self._next(), self._loop).result()
        if n < 0 or n >= len(self._buf):
            out, self._buf = bytes(self._buf), bytearray()
        else:
            out = bytes(self._buf[:n])
            del self._buf[:n]
        return out


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


@dataclass
class Ctx:
    """One request as the handlers see it."""

    req: sigv4.SignedRequest
    rid: str
    who: Principal
    auth: sigv4.AuthResult
    body: AsgiBody
    q: dict[str, str]

    def header(self, name: str) -> str | None:
        return self.req.headers.get(name)


class AutoCommitter:
    """Commits branches written through S3: after each write, or every ``interval`` seconds."""

    def __init__(self, plane: DataPlane, interval: float) -> None:
        self.plane = plane
        self.interval = interval
        self._dirty: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval > 0:
            self._thread = threading.Thread(target=self._loop, name="s3-autocommit", daemon=True)
            self._thread.start()

    def wrote(self, repo: str, branch: str, who: str) -> None:
        if self.interval <= 0:
            self._commit(repo, branch, who)
            return
        with self._lock:
            self._dirty[(repo, branch)] = who

    def _commit(self, repo: str, branch: str, who: str) -> None:
        try:
            self.plane.commit(repo, branch, "S3 writes", author=who, meta={"source": "s3-gateway"})
        except BadRequest:
            pass  # nothing to commit
        except FabricError as exc:
            log.warning("autocommit of %s@%s failed: %s", repo, branch, exc.message)

    def flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        for (repo, branch), who in dirty.items():
            self._commit(repo, branch, who)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()


# -- the gateway ------------------------------------------------------------------------
class S3Gateway:
    def __init__(
        self,
        plane: DataPlane,
        credentials: CredentialLookup | None,
        buckets: BindingLookup | None = None,
        state_dir: str = ".fabric/s3",
        autocommit: float | None = None,
        region: str = "us-east-1",
        cache_seconds: float = 2.0,
        access_log_enabled: bool = True,
        workers: int = 32,
        upload_expiry: float = 7 * 24 * 3600.0,
    ) -> None:
        self.plane = plane
        self.credentials = credentials
        self.bindings = buckets or plane_bindings(plane)
        self.region = region
        self.uploads = Uploads(state_dir)
        self.autocommit = AutoCommitter(plane, autocommit) if autocommit is not None else None
        self.access_log = access_log_enabled
        self._buckets = TTLCache(cache_seconds)
        self._creds = TTLCache(cache_seconds)
        self._branches = TTLCache(cache_seconds)
        self._cond_locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._cond_guard = threading.Lock()
        self.stats = {"requests": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0}
        self._ops: dict[tuple[str, int], int] = {}
        self._modes: dict[str, int] = {}  # request bodies by payload signing mode
        #: Plane calls block (SQLite, disk): they run here, never on the event loop.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3-gateway")
        self.upload_expiry = upload_expiry
        self._stop = threading.Event()
        self._maint = threading.Thread(target=self._maintenance_loop, name="s3-uploads", daemon=True)
        self._maint.start()

    def close(self) -> None:
        self._stop.set()
        if self.autocommit is not None:
            self.autocommit.close()
        self.uploads.close()
        self._pool.shutdown(wait=False)

    # -- upload maintenance --------------------------------------------------------------
    MAINTENANCE_INTERVAL = 1200.0

    def maintain_uploads(self, now: float | None = None) -> dict:
        """Keep the chunks of uploads in progress from garbage collection (asking the plane
        which of them it lacks refreshes them), and abort uploads older than ``upload_expiry``."""
        now = time.time() if now is None else now
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
        while not self._stop.wait(self.MAINTENANCE_INTERVAL):
            try:
                self.maintain_uploads()
            except Exception:
                log.exception("multipart upload maintenance failed")

    # -- ASGI ------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await asyncio.get_running_loop().run_in_executor(None, self.close)
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        start = time.perf_counter()
        rid = secrets.token_hex(8).upper()
        method = scope["method"]
        raw_path = scope.get("raw_path") or scope["path"].encode()
        raw_path_s = raw_path.decode("latin-1")
        path = scope["path"]
        op = ["?"]
        loop = asyncio.get_running_loop()
        body = AsgiBody(receive, loop)
        try:
            if path.startswith("/_fabric/"):
                resp = self._service(path)
            else:
                headers: dict[str, str] = {}
                for k, v in scope["headers"]:
                    name = k.decode("latin-1").lower()
                    value = v.decode("latin-1")
                    headers[name] = headers[name] + "," + value if name in headers else value
                query = sigv4.parse_query(scope.get("query_string", b"").decode("latin-1"))
                req = sigv4.SignedRequest(method, raw_path_s, path, query, headers)
                resp = await loop.run_in_executor(self._pool, self._handle, req, rid, body, op)
        except S3Error as err:
            resp = self._error(err, path, rid, method)
        except Exception:
            log.exception("S3 request %s %s failed", method, path)
            resp = self._error(S3Error("InternalError", "We encountered an internal error. Please try again.", 500), path, rid, method)
        if body.unread(scope):
            await self._settle_body(scope, body, resp)
        sent = await self._send(resp, send, method)
        status = resp.status
        self.stats["requests"] += 1
        self.stats["bytes_out"] += sent
        if status >= 400:
            self.stats["errors"] += 1
        key = (op[0], status)
        self._ops[key] = self._ops.get(key, 0) + 1
        if self.access_log:
            access_log.info(
                "%s %s %s %d %d %.1fms", (scope.get("client") or ("-",))[0], method, path, status, sent,
                (time.perf_counter() - start) * 1000,
            )

    async def _settle_body(self, scope: dict, body: AsgiBody, resp: Response) -> None:
        """An answer given before the request body was read (an error, mostly).

        A client waiting on ``Expect: 100-continue`` never sends the body, one that
        did not wait is sending it: keeping the connection would read one as the
        other's next request. Small bodies are drained; otherwise the connection closes.
        """
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length", "")
        small = declared.isdigit() and int(declared) <= DRAIN_LIMIT
        if "100-continue" in headers.get("expect", "").lower() and not body.started or not small:
            resp.headers = {**(resp.headers or {}), "Connection": "close"}
            return
        try:
            await body.drain()
        except S3Error:
            resp.headers = {**(resp.headers or {}), "Connection": "close"}

    async def _send(self, resp: Response, send: Callable, method: str) -> int:
        headers = resp.headers or {}
        body = resp.body
        if isinstance(body, (bytes, bytearray)):
            if "Content-Length" not in headers:
                headers["Content-Length"] = str(len(body))
        elif resp.length is not None:
            headers["Content-Length"] = str(resp.length)
        raw_headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1", "replace")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": resp.status, "headers": raw_headers})
        if method == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            if not isinstance(body, (bytes, bytearray)):
                close = getattr(body, "close", None)
                if close:
                    close()
            return 0
        if isinstance(body, (bytes, bytearray)):
            await send({"type": "http.response.body", "body": bytes(body)})
            return len(body)
        sent = 0
        loop = asyncio.get_running_loop()
        try:
            while True:
                piece = await loop.run_in_executor(self._pool, _next_batch, body)
                if not piece:
                    break
                sent += len(piece)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            close = getattr(body, "close", None)
            if close:
                await loop.run_in_executor(self._pool, close)
        return sent

    def _service(self, path: str) -> Response:
        if path == "/_fabric/healthz":
            return Response(200, {"Content-Type": "application/json"}, b'{"status": "ok", "role": "s3"}')
        if path == "/_fabric/metrics":
            lines = [
                "# TYPE fabric_s3_requests counter",
                *(f'fabric_s3_requests{{op="{o}",status="{s}"}} {n}' for (o, s), n in sorted(self._ops.items())),
                "# TYPE fabric_s3_bytes counter",
                f'fabric_s3_bytes{{direction="out"}} {self.stats["bytes_out"]}',
                f'fabric_s3_bytes{{direction="in"}} {self.stats["bytes_in"]}',
                "# TYPE fabric_s3_payloads counter",
                *(f'fabric_s3_payloads{{mode="{m}"}} {n}' for m, n in sorted(self._modes.items())),
            ]
            return Response(200, {"Content-Type": "text/plain; version=0.0.4"}, ("\n".join(lines) + "\n").encode())
        raise S3Error("NoSuchBucket", "The specified bucket does not exist", 404)

    def _error(self, err: S3Error, path: str, rid: str, method: str) -> Response:
        headers = {"x-amz-request-id": rid, "x-amz-id-2": rid, **err.headers}
        if method == "HEAD":
            return Response(err.status, headers, b"")
        headers["Content-Type"] = "application/xml"
        return Response(err.status, headers, X.error_doc(err.code, err.message, path, rid, err.extra))

    # -- dispatch ----------------------------------------------------------------------
    def _handle(self, req: sigv4.SignedRequest, rid: str, body: AsgiBody, op: list[str]) -> Response:
        auth = self._authenticate(req)
        q = {k: v for k, v in req.query}
        ctx = Ctx(req, rid, auth.principal, auth, body, q)
        parts = req.path.lstrip("/").split("/", 1) if req.path != "/" else [""]
        bucket_name = parts[0]
        key = parts[1] if len(parts) > 1 else ""
        m = req.method
        for sub in q:
            if sub in UNSUPPORTED:
                raise S3Error("NotImplemented", f"the {sub!r} sub-resource is not supported by this S3 gateway", 501)
        if not bucket_name:
            op[0] = "ListBuckets"
            if m in ("GET", "HEAD"):
                return self._finish(ctx, self.list_buckets(ctx))
            raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.", 405)
        if not key:
            return self._finish(ctx, self._bucket_op(ctx, m, bucket_name, op))
        return self._finish(ctx, self._object_op(ctx, m, bucket_name, key, op))

    def _finish(self, ctx: Ctx, resp: Response) -> Response:
        h = resp.headers if resp.headers is not None else {}
        h["x-amz-request-id"] = ctx.rid
        h["x-amz-id-2"] = ctx.rid
        resp.headers = h
        return resp

    def _bucket_op(self, ctx: Ctx, m: str, name: str, op: list[str]) -> Response:
        q = ctx.q
        if m == "PUT":
            if "versioning" in q or "acl" in q or "tagging" in q:
                raise S3Error("NotImplemented", "bucket configuration cannot be changed on this gateway", 501)
            op[0] = "CreateBucket"
            return self.create_bucket(ctx, name)
        b = self.bucket(name)
        if m == "HEAD":
            op[0] = "HeadBucket"
            self._require(ctx, b, "read")
            return Response(200, {"x-amz-bucket-region": self.region})
        if m == "DELETE":
            op[0] = "DeleteBucket"
            return self.delete_bucket(ctx, b)
        if m == "POST":
            if "delete" in q:
                op[0] = "DeleteObjects"
                return self.delete_objects(ctx, b)
            raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.", 405)
        if m != "GET":
            raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.", 405)
        if "location" in q:
            op[0] = "GetBucketLocation"
            self._require(ctx, b, "read")
            region = "" if self.region == "us-east-1" else X.esc(self.region)
            return self._xml(f'{X.HEADER}<LocationConstraint xmlns="{X.NS}">{region}</LocationConstraint>'.encode())
        if "versioning" in q:
            op[0] = "GetBucketVersioning"
            self._require(ctx, b, "read")
            return self._xml(X.doc("VersioningConfiguration", ""))
        if "acl" in q:
            op[0] = "GetBucketAcl"
            self._require(ctx, b, "read")
            return self._xml(self._acl(ctx))
        if "tagging" in q:
            raise S3Error("NoSuchTagSet", "The TagSet does not exist", 404)
        if "uploads" in q:
            op[0] = "ListMultipartUploads"
            return self.list_uploads(ctx, b)
        if q.get("list-type") == "2":
            op[0] = "ListObjectsV2"
            return self.list_objects(ctx, b, v2=True)
        op[0] = "ListObjects"
        return self.list_objects(ctx, b, v2=False)

    def _object_op(self, ctx: Ctx, m: str, bucket_name: str, key: str, op: list[str]) -> Response:
        q = ctx.q
        b = self.bucket(bucket_name)
        if m in ("GET", "HEAD"):
            if "uploadId" in q and m == "GET":
                op[0] = "ListParts"
                return self.list_parts(ctx, b, key)
            if "tagging" in q:
                op[0] = "GetObjectTagging"
                self._locate_read(ctx, b, key)
                return self._xml(X.doc("Tagging", "<TagSet></TagSet>"))
            if "acl" in q:
                op[0] = "GetObjectAcl"
                self._require(ctx, b, "read")
                return self._xml(self._acl(ctx))
            op[0] = "HeadObject" if m == "HEAD" else "GetObject"
            return self.get_object(ctx, b, key, m == "HEAD")
        if m == "PUT":
            if "tagging" in q or "acl" in q:
                raise S3Error("NotImplemented", "object tags and ACLs are not supported by this gateway", 501)
            if "uploadId" in q or "partNumber" in q:
                if ctx.header("x-amz-copy-source"):
                    op[0] = "UploadPartCopy"
                    return self.upload_part(ctx, b, key, copy=True)
                op[0] = "UploadPart"
                return self.upload_part(ctx, b, key, copy=False)
            if ctx.header("x-amz-copy-source"):
                op[0] = "CopyObject"
                return self.copy_object(ctx, b, key)
            op[0] = "PutObject"
            return self.put_object(ctx, b, key)
        if m == "DELETE":
            if "uploadId" in q:
                op[0] = "AbortMultipartUpload"
                return self.abort_upload(ctx, b, key)
            op[0] = "DeleteObject"
            return self.delete_object(ctx, b, key)
        if m == "POST":
            if "uploads" in q:
                op[0] = "CreateMultipartUpload"
                return self.create_upload(ctx, b, key)
            if "uploadId" in q:
                op[0] = "CompleteMultipartUpload"
                return self.complete_upload(ctx, b, key)
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.", 405)

    # -- authentication ------------------------------------------------------------------
    def _lookup_credentials(self, access_key: str) -> tuple[Principal, str]:
        assert self.credentials is not None
        return self._creds.get(access_key, lambda: self.credentials(access_key))  # type: ignore[misc]

    def _authenticate(self, req: sigv4.SignedRequest) -> sigv4.AuthResult:
        if self.credentials is None:
            payload = req.headers.get("x-amz-content-sha256") or sigv4.UNSIGNED
            amz_date = req.headers.get("x-amz-date", "")
            sig = ""
            if "authorization" in req.headers:
                try:
                    sig = sigv4.parse_authorization(req.headers["authorization"]).get("Signature", "")
                except S3Error:
                    pass
            return sigv4.AuthResult(ANONYMOUS_ADMIN, "", payload, sig, b"", amz_date, "")
        if sigv4.is_presigned(req):
            return sigv4.verify_presigned(req, self._lookup_credentials)
        if sigv4.is_presigned_v2(req):
            return sigv4.verify_v2_presigned(req, self._lookup_credentials)
        if "authorization" in req.headers:
            if req.headers["authorization"].startswith("AWS "):
                return sigv4.verify_v2_header(req, self._lookup_credentials)
            return sigv4.verify_header(req, self._lookup_credentials)
        raise S3Error("AccessDenied", "Anonymous access is not allowed: sign requests with a fabric token's S3 key pair", 403)

    def _require(self, ctx: Ctx, b: Bucket, role: str) -> None:
        if not ctx.who.can(b.repo, role):
            raise S3Error("AccessDenied", f"token {ctx.who.name!r} lacks {role} access to repository {b.repo!r}", 403)

    # -- buckets and keys --------------------------------------------------------------
    def bucket(self, name: str) -> Bucket:
        b = self._buckets.get(name, lambda: self._resolve_bucket(name))
        if b is None:
            raise S3Error("NoSuchBucket", "The specified bucket does not exist", 404, BucketName=name)
        return b

    def _resolve_bucket(self, name: str) -> Bucket | None:
        binding = self.bindings(name)
        if binding is not None:
            return Bucket(name, binding["repo"], binding["ref"], binding.get("created", 0.0), bool(binding.get("created_by_s3")))
        try:
            check_repo_name(name)
            info = self.plane.get_repo(name)
        except (NotFound, BadRequest):
            return None
        return Bucket(name, name, None, info.get("created", 0.0))

    def _split(self, b: Bucket, key: str, write: bool = True) -> tuple[str, str, bool]:
        """``(ref, path, is_dir_marker)`` of a key. A key no path can have is refused for
        writes (InvalidArgument) and simply absent for reads (NoSuchKey)."""
        if b.ref is not None:
            ref, rest = b.ref, key
        else:
            ref, sep, rest = key.partition("/")
            if not sep or not ref or not rest:
                if not write:
                    raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
                raise S3Error(
                    "InvalidArgument",
                    f"keys of bucket {b.name!r} are REF/PATH (a branch, tag or commit, then the path)",
                    400,
                    Key=key,
                )
        is_dir = rest.endswith("/")
        path = rest[:-1] if is_dir else rest
        try:
            check_path(path)
        except FabricError as exc:
            if not write:
                raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key) from None
            raise from_fabric(exc) from None
        return ref, path, is_dir

    def _is_branch(self, repo: str, ref: str) -> bool:
        names = self._branches.get(repo, lambda: {br["name"] for br in self.plane.list_branches(repo)})
        if ref in names:
            return True
        names = {br["name"] for br in self.plane.list_branches(repo)}
        self._branches.drop(repo)
        return ref in names

    def _locate_write(self, ctx: Ctx, b: Bucket, key: str) -> tuple[str, str, bool]:
        ref, path, is_dir = self._split(b, key)
        self._require(ctx, b, "write")
        if not self._is_branch(b.repo, ref):
            what = "a tag or commit" if self._resolves(b.repo, ref) else "not a branch"
            raise S3Error(
                "AccessDenied",
                f"{ref!r} in repository {b.repo!r} is {what}: S3 writes go only to branches "
                f"(create one with `fabric branch create {b.repo} NAME --from {ref}`)",
                403,
            )
        return ref, path, is_dir

    def _resolves(self, repo: str, ref: str) -> bool:
        try:
            self.plane.resolve_commit(repo, ref)
            return True
        except FabricError:
            return False

    def _locate_read(self, ctx: Ctx, b: Bucket, key: str) -> tuple[str, str, bool, Entry]:
        ref, path, is_dir = self._split(b, key, write=False)
        self._require(ctx, b, "read")
        entry = self._stat(b, ref, path, key)
        if (entry.kind == DIR) != is_dir or entry.kind not in (FILE, DIR):
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
        return ref, path, is_dir, entry

    def _stat(self, b: Bucket, ref: str, path: str, key: str) -> Entry:
        try:
            return self.plane.stat(b.repo, ref, path)
        except NotFound:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key) from None
        except FabricError as exc:
            raise from_fabric(exc) from None

    def _wrote(self, ctx: Ctx, repo: str, branch: str) -> None:
        if self.autocommit is not None:
            self.autocommit.wrote(repo, branch, ctx.who.name)

    def _cond_lock(self, repo: str, branch: str, path: str) -> threading.Lock:
        k = (repo, branch, path)
        with self._cond_guard:
            lock = self._cond_locks.get(k)
            if lock is None:
                if len(self._cond_locks) > 10000:
                    self._cond_locks = {kk: v for kk, v in self._cond_locks.items() if v.locked()}
                lock = self._cond_locks[k] = threading.Lock()
            return lock

    # -- responses --------------------------------------------------------------------
    @staticmethod
    def _xml(body: bytes, status: int = 200) -> Response:
        return Response(status, {"Content-Type": "application/xml"}, body)

    def _owner(self, ctx: Ctx) -> str:
        return X.owner(ctx.who.name, ctx.who.token_id or "anonymous")

    def _acl(self, ctx: Ctx) -> bytes:
        owner = self._owner(ctx)
        grant = (
            '<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser">'
            f"{X.el('ID', ctx.who.token_id or 'anonymous')}{X.el('DisplayName', ctx.who.name)}</Grantee>"
            "<Permission>FULL_CONTROL</Permission></Grant>"
        )
        return X.doc("AccessControlPolicy", f"{owner}<AccessControlList>{grant}</AccessControlList>")

    # -- request bodies -------------------------------------------------------------------
    def _payload(self, ctx: Ctx) -> Any:
        """The request body as a verified, decoded file-like object."""
        headers = ctx.req.headers
        mode = "SHA256" if len(ctx.auth.payload) == 64 else ctx.auth.payload
        self._modes[mode] = self._modes.get(mode, 0) + 1
        checks = sigv4.BodyChecks.from_headers(headers, ctx.auth.payload)
        encoding = headers.get("content-encoding", "")
        chunked = ctx.auth.payload in sigv4.STREAMING_MODES or "aws-chunked" in encoding.lower()
        if chunked:
            decoded = headers.get("x-amz-decoded-content-length")
            if decoded is not None:
                try:
                    checks.length = int(decoded)
                except ValueError:
                    raise S3Error("InvalidArgument", "x-amz-decoded-content-length is not a number", 400) from None
            trailers = (headers.get("x-amz-trailer") or "").split(",")
            return sigv4.ChunkedBody(ctx.body, ctx.auth, checks, trailers)
        return sigv4.VerifiedBody(ctx.body, checks)

    def _read_small(self, ctx: Ctx, limit: int = X.MAX_XML_BYTES) -> bytes:
        declared = ctx.header("content-length")
        if declared and declared.isdigit() and int(declared) > limit + 65536:
            raise S3Error("MaxMessageLengthExceeded", "Your request was too big.", 400)
        stream = self._payload(ctx)
        parts, size = [], 0
        while True:
            piece = stream.read(1 << 16)
            if not piece:
                break
            size += len(piece)
            if size > limit:
                raise S3Error("MaxMessageLengthExceeded", "Your request was too big.", 400)
            parts.append(piece)
        return b"".join(parts)

    def _ingest(self, stream: Any) -> tuple[list[tuple[bytes, int]], str]:
        sink = self.plane.chunk_sink()
        chunks, md5 = ingest_stream(stream, sink)
        sink.close()
        return chunks, md5

    @staticmethod
    def _meta_from_headers(headers: dict[str, str]) -> dict[str, str]:
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

    # -- service level ------------------------------------------------------------------
    def list_buckets(self, ctx: Ctx) -> Response:
        who = ctx.who
        found: dict[str, float] = {}
        repos = {r["name"]: r for r in self.plane.list_repos()}
        for r in repos.values():
            if who.can(r["name"], "read"):
                found[r["name"]] = r.get("created", 0.0)
        for bd in self.plane.list_buckets():
            if bd["repo"] in repos and who.can(bd["repo"], "read"):
                found[bd["name"]] = bd.get("created", 0.0)
        items = [(n, iso8601(c)) for n, c in sorted(found.items())]
        return self._xml(X.list_buckets(items, self._owner(ctx)))

    def create_bucket(self, ctx: Ctx, name: str) -> Response:
        try:
            check_repo_name(name)
        except FabricError:
            raise S3Error("InvalidBucketName", "The specified bucket is not valid.", 400, BucketName=name) from None
        X.parse_location(self._read_small(ctx, 1 << 20))
        existing = self._resolve_bucket(name)
        if existing is not None:
            if ctx.who.can(existing.repo, "admin"):
                raise S3Error("BucketAlreadyOwnedByYou", "Your previous request to create the named bucket succeeded and you already own it.", 409, BucketName=name)
            raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409, BucketName=name)
        if not ctx.who.admin:
            raise S3Error("AccessDenied", f"token {ctx.who.name!r} may not create repositories (an admin token may)", 403)
        try:
            info = self.plane.create_repo(name)
        except FabricError as exc:
            if exc.status == 409:
                raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409, BucketName=name) from None
            raise from_fabric(exc) from None
        try:
            self.plane.create_bucket(name, name, info.get("default_branch", "main"), created_by_s3=True)
        except FabricError as exc:
            try:
                self.plane.delete_repo(name)
            except FabricError:
                pass
            raise from_fabric(exc) from None
        self._buckets.drop(name)
        return Response(200, {"Location": f"/{name}"})

    def delete_bucket(self, ctx: Ctx, b: Bucket) -> Response:
        self._require(ctx, b, "admin")
        if b.ref is None:
            raise S3Error(
                "AccessDenied",
                f"bucket {b.name!r} is repository {b.repo!r}; delete repositories with `fabric repo delete`",
                403,
            )
        if not b.created_by_s3:
            raise S3Error(
                "AccessDenied",
                f"bucket {b.name!r} was bound with `fabric bucket create`; remove it with `fabric bucket delete {b.name}`",
                403,
            )
        page = self.plane.list(b.repo, b.ref, "", "", "", 1)
        branches = self.plane.list_branches(b.repo)
        tags = self.plane.list_tags(b.repo)
        if page.entries or page.prefixes or len(branches) > 1 or tags:
            raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty", 409, BucketName=b.name)
        self.plane.delete_bucket(b.name)
        self.plane.delete_repo(b.repo)
        self._buckets.drop(b.name)
        return Response(204)

    # -- listing ------------------------------------------------------------------------
    def list_objects(self, ctx: Ctx, b: Bucket, v2: bool) -> Response:
        self._require(ctx, b, "read")
        q = ctx.q
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        url = q.get("encoding-type") == "url"
        if "encoding-type" in q and not url:
            raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request", 400)
        try:
            max_keys = int(q.get("max-keys", "1000"))
        except ValueError:
            raise S3Error("InvalidArgument", "Provided max-keys not an integer or within integer range", 400) from None
        if max_keys < 0:
            raise S3Error("InvalidArgument", "max-keys must be zero or more", 400)
        max_keys = min(max_keys, 1000)
        if v2:
            token = q.get("continuation-token")
            start_after = q.get("start-after", "")
            marker = start_after
            if token is not None:
                try:
                    marker = base64.urlsafe_b64decode(token.encode()).decode()
                    if not marker.startswith("k:"):
                        raise ValueError
                    marker = marker[2:]
                except (ValueError, binascii.Error, UnicodeDecodeError):
                    raise S3Error("InvalidArgument", "The continuation token provided is incorrect", 400) from None
        else:
            marker = q.get("marker", "")
        contents, prefixes, truncated = self._list(b, prefix, delimiter, marker, max_keys)
        last = max(([contents[-1][0]] if contents else []) + ([prefixes[-1]] if prefixes else []), default="")
        fetch_owner = (not v2) or q.get("fetch-owner") == "true"
        owner = self._owner(ctx) if fetch_owner else ""
        out = [X.el("Name", b.name), f"<Prefix>{X.key_text(prefix, url)}</Prefix>"]
        if v2:
            if "continuation-token" in q:
                out.append(X.el("ContinuationToken", q["continuation-token"]))
            if "start-after" in q:
                out.append(f"<StartAfter>{X.key_text(q['start-after'], url)}</StartAfter>")
            out.append(X.el("KeyCount", len(contents) + len(prefixes)))
        else:
            out.append(f"<Marker>{X.key_text(marker, url)}</Marker>")
        out.append(X.el("MaxKeys", max_keys))
        if delimiter:
            out.append(f"<Delimiter>{X.key_text(delimiter, url)}</Delimiter>")
        if url:
            out.append("<EncodingType>url</EncodingType>")
        out.append(X.el("IsTruncated", "true" if truncated else "false"))
        if truncated and last:
            if v2:
                out.append(X.el("NextContinuationToken", base64.urlsafe_b64encode(("k:" + last).encode()).decode()))
            else:
                out.append(f"<NextMarker>{X.key_text(last, url)}</NextMarker>")
        for key, e in contents:
            etag = X.esc(f'"{e.md5}"')
            out.append(
                f"<Contents><Key>{X.key_text(key, url)}</Key><LastModified>{iso8601(e.mtime_ns / 1e9)}</LastModified>"
                f"<ETag>{etag}</ETag><Size>{e.size}</Size>{owner}<StorageClass>STANDARD</StorageClass></Contents>"
            )
        for p in prefixes:
            out.append(f"<CommonPrefixes><Prefix>{X.key_text(p, url)}</Prefix></CommonPrefixes>")
        return self._xml(X.doc("ListBucketResult", "".join(out)))

    def _list(self, b: Bucket, prefix: str, delimiter: str, marker: str, max_keys: int) -> tuple[list, list, bool]:
        """Keys (with entries) and common prefixes after ``marker``, S3 style; and whether more follow."""
        if max_keys == 0:
            return [], [], False
        if b.ref is not None:
            return self._list_ref(b.repo, b.ref, "", prefix, delimiter, marker, max_keys)
        if "/" in prefix:
            ref, _, sub = prefix.partition("/")
            return self._list_ref(b.repo, ref, ref + "/", sub, delimiter, marker, max_keys)
        refs = sorted(
            {r["name"] for r in self.plane.list_branches(b.repo)} | {t["name"] for t in self.plane.list_tags(b.repo)},
            key=lambda n: n + "/",
        )
        contents: list = []
        prefixes: list = []
        for ref in refs:
            head = ref + "/"
            if not ref.startswith(prefix) or (marker and head <= marker and not marker.startswith(head)):
                continue
            if delimiter == "/" or (delimiter and delimiter in head[len(prefix) :]):
                cut = head[len(prefix) :].find(delimiter)
                p = prefix + head[len(prefix) : len(prefix) + cut + len(delimiter)]
                if marker and p <= marker:
                    continue
                if prefixes and prefixes[-1] == p:
                    continue
                if len(contents) + len(prefixes) >= max_keys:
                    return contents, prefixes, True
                prefixes.append(p)
                continue
            room = max_keys - len(contents) - len(prefixes)
            if room <= 0:
                return contents, prefixes, True
            c, p, more = self._list_ref(b.repo, ref, head, "", delimiter, marker, room)
            contents += c
            prefixes += p
            if more:
                return contents, prefixes, True
        return contents, prefixes, False

    def _list_ref(
        self, repo: str, ref: str, head: str, prefix: str, delimiter: str, marker: str, max_keys: int
    ) -> tuple[list, list, bool]:
        """List one ref; keys are ``head + path``. ``marker`` is a full key."""
        after = ""
        if marker:
            if marker.startswith(head):
                after = marker[len(head) :]
            elif marker > head:
                return [], [], False
        if after and not delimiter and after.endswith("/"):
            after = after[:-1]
        engine_delim = "/" if delimiter == "/" else ""
        contents: list = []
        prefixes: list = []
        seen_prefixes: set[str] = set()
        # A directory marker whose key equals the prefix lists first (S3 lists key == prefix).
        if prefix.endswith("/") and len(prefix) > 1 and (not after or after < prefix):
            try:
                e = self.plane.stat(repo, ref, prefix[:-1])
                if e.kind == DIR:
                    contents.append((head + prefix, e))
            except FabricError:
                pass
        try:
            check_prefix(prefix)
        except FabricError:
            return [], [], False
        while True:
            room = max_keys - len(contents) - len(prefixes)
            if room <= 0:
                return contents, prefixes, True
            try:
                page = self.plane.list(repo, ref, prefix, engine_delim, after, room if engine_delim or not delimiter else 1000)
            except NotFound:
                if not head:
                    raise
                return contents, prefixes, False
            except FabricError as exc:
                raise from_fabric(exc, "NoSuchKey") from None
            items: list[tuple[str, Any]] = [(p, e) for p, e in page.entries] + [(p, None) for p in page.prefixes]
            items.sort(key=lambda it: it[0])
            for path, e in items:
                if len(contents) + len(prefixes) >= max_keys:
                    return contents, prefixes, True
                if e is None:
                    key = head + path
                    if key not in seen_prefixes:
                        seen_prefixes.add(key)
                        prefixes.append(key)
                    after = path
                    continue
                after = path
                if e.kind == FILE:
                    key = head + path
                elif e.kind == DIR:
                    key = head + path + "/"
                else:
                    continue
                if delimiter:
                    rest = key[len(head) + len(prefix) :]
                    cut = rest.find(delimiter)
                    if cut >= 0:
                        p = head + prefix + rest[: cut + len(delimiter)]
                        if p not in seen_prefixes and (not marker or p > marker):
                            seen_prefixes.add(p)
                            prefixes.append(p)
                        continue
                contents.append((key, e))
            if page.next_after is None:
                return contents, prefixes, False
            after = page.next_after

    # -- objects: reading -----------------------------------------------------------------
    def _object_headers(self, e: Entry, size: int) -> dict[str, str]:
        h = {
            "ETag": f'"{e.md5}"',
            "Last-Modified": http_date(e.mtime_ns / 1e9),
            "Accept-Ranges": "bytes",
            "Content-Type": DEFAULT_CONTENT_TYPE,
            "Content-Length": str(size),
        }
        for k, v in e.meta.items():
            if k.startswith(SYS_PREFIX):
                name = k[len(SYS_PREFIX) :]
                h["-".join(p.capitalize() for p in name.split("-"))] = v
            else:
                h["x-amz-meta-" + k] = v
        return h

    def get_object(self, ctx: Ctx, b: Bucket, key: str, head: bool) -> Response:
        ref, path, _, e = self._locate_read(ctx, b, key)
        self._conditions(ctx, e, "")
        size = e.size if e.kind == FILE else 0
        offset, length, status = 0, size, 200
        headers = self._object_headers(e, size)
        rng = ctx.header("range")
        part = ctx.q.get("partNumber")
        if part is not None and part != "1":
            raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable", 416)
        if rng and e.kind == FILE:
            parsed = parse_range(rng, size)
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
        if length <= SMALL_OBJECT:
            data = b"".join(self.plane.open_file(b.repo, ref, path, e, offset, length))
            return Response(status, headers, data)
        headers.pop("Content-Length")
        return Response(status, headers, iter(self.plane.open_file(b.repo, ref, path, e, offset, length)), length)

    def _conditions(self, ctx: Ctx, e: Entry, prefix: str) -> None:
        """GET/HEAD conditional headers (``prefix`` 'x-amz-copy-source-' for copies: failures are 412)."""
        h = ctx.req.headers
        lm = int(e.mtime_ns // 1_000_000_000)
        if_match = h.get(prefix + "if-match")
        if_none = h.get(prefix + "if-none-match")
        if_unmod = h.get(prefix + "if-unmodified-since")
        if_mod = h.get(prefix + "if-modified-since")
        if if_match is not None:
            if not _etag_matches(if_match, e.md5):
                raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-Match")
        elif if_unmod is not None:
            t = _parse_http_date(if_unmod)
            if t is not None and lm > t:
                raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-Unmodified-Since")
        not_modified = False
        if if_none is not None:
            not_modified = _etag_matches(if_none, e.md5)
        elif if_mod is not None:
            t = _parse_http_date(if_mod)
            not_modified = t is not None and lm <= t
        if not_modified:
            if prefix:
                raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
            err = S3Error("NotModified", "Not Modified", 304)
            err.headers.update({"ETag": f'"{e.md5}"', "Last-Modified": http_date(e.mtime_ns / 1e9)})
            raise err

    # -- objects: writing -----------------------------------------------------------------
    def _write_conditions(self, ctx: Ctx, repo: str, branch: str, path: str, key: str) -> None:
        """Conditional writes: ``If-None-Match: *`` (only if absent), ``If-Match: ETAG``."""
        if_none = ctx.header("if-none-match")
        if_match = ctx.header("if-match")
        if if_none is None and if_match is None:
            return
        if if_none is not None and if_none.strip() != "*":
            raise S3Error("NotImplemented", "If-None-Match on a write accepts only '*'", 501)
        try:
            current: Entry | None = self.plane.stat(repo, branch, path)
        except NotFound:
            current = None
        if if_none is not None and current is not None:
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-None-Match")
        if if_match is not None:
            if current is None:
                raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
            if not _etag_matches(if_match, current.md5):
                raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-Match")

    def _stage(self, ctx: Ctx, repo: str, branch: str, path: str, key: str, entry: Entry) -> None:
        conditional = ctx.header("if-none-match") is not None or ctx.header("if-match") is not None
        if conditional:
            with self._cond_lock(repo, branch, path):
                self._write_conditions(ctx, repo, branch, path, key)
                self.plane.stage(repo, branch, {path: entry})
        else:
            self.plane.stage(repo, branch, {path: entry})
        self._wrote(ctx, repo, branch)

    def put_object(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, is_dir = self._locate_write(ctx, b, key)
        meta = self._meta_from_headers(ctx.req.headers)
        self._write_conditions(ctx, b.repo, ref, path, key)  # fail fast, before the body
        stream = self._payload(ctx)
        try:
            if is_dir:
                data = stream.read(1)
                if data:
                    raise S3Error("InvalidArgument", "a key ending in '/' is a directory marker and must be empty", 400, Key=key)
                stream.read()
                entry = Entry(DIR, 0, 0o755, time.time_ns(), md5=hashlib.md5(b"").hexdigest(), meta=meta)
            else:
                chunks, md5 = self._ingest(stream)
                entry = file_entry(chunks, md5, 0o644, time.time_ns(), meta)
            self._stage(ctx, b.repo, ref, path, key, entry)
        except FabricError as exc:
            raise from_fabric(exc) from None
        self.stats["bytes_in"] += entry.size
        headers = {"ETag": f'"{entry.md5}"'}
        for algo, value in stream.checks.checksums.items():
            headers[f"x-amz-checksum-{algo}"] = value
        return Response(200, headers)

    def delete_object(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, is_dir = self._locate_write(ctx, b, key)
        self._delete_one(b.repo, ref, path, is_dir)
        self._wrote(ctx, b.repo, ref)
        return Response(204)

    def _delete_one(self, repo: str, branch: str, path: str, is_dir: bool) -> None:
        try:
            e = self.plane.stat(repo, branch, path)
        except NotFound:
            return
        if (e.kind == DIR) != is_dir:
            return
        try:
            self.plane.delete_object(repo, branch, path)
        except NotFound:
            pass

    def delete_objects(self, ctx: Ctx, b: Bucket) -> Response:
        self._require(ctx, b, "write")
        keys, quiet = X.parse_delete(self._read_small(ctx))
        out = []
        touched: set[tuple[str, str]] = set()
        for key in keys:
            try:
                ref, path, is_dir = self._locate_write(ctx, b, key)
                self._delete_one(b.repo, ref, path, is_dir)
                touched.add((b.repo, ref))
                if not quiet:
                    out.append(f"<Deleted>{X.el('Key', key)}</Deleted>")
            except S3Error as err:
                out.append(f"<Error>{X.el('Key', key)}{X.el('Code', err.code)}{X.el('Message', err.message)}</Error>")
            except FabricError as exc:
                err = from_fabric(exc)
                out.append(f"<Error>{X.el('Key', key)}{X.el('Code', err.code)}{X.el('Message', err.message)}</Error>")
        for repo, branch in touched:
            self._wrote(ctx, repo, branch)
        return self._xml(X.doc("DeleteResult", "".join(out)))

    def _copy_source(self, ctx: Ctx) -> tuple[Bucket, str, str, Entry]:
        """The object named by ``x-amz-copy-source`` (checked for read access): (bucket, ref, path, entry)."""
        raw = ctx.header("x-amz-copy-source") or ""
        src = unquote(raw.partition("?")[0]).lstrip("/")
        bucket_name, _, key = src.partition("/")
        if not bucket_name or not key:
            raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: sourcebucket/sourcekey", 400)
        sb = self.bucket(bucket_name)
        ref, path, is_dir = self._split(sb, key, write=False)
        self._require(ctx, sb, "read")
        try:
            entry = self.plane.stat_chunks(sb.repo, ref, path)
        except NotFound:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key) from None
        except FabricError as exc:
            raise from_fabric(exc) from None
        if entry.kind != FILE or is_dir:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
        self._conditions(ctx, entry, "x-amz-copy-source-")
        return sb, ref, path, entry

    def copy_object(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, is_dir = self._locate_write(ctx, b, key)
        if is_dir:
            raise S3Error("InvalidArgument", "cannot copy onto a directory marker key", 400, Key=key)
        sb, sref, spath, entry = self._copy_source(ctx)
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
        meta = entry.meta if directive == "COPY" else self._meta_from_headers(ctx.req.headers)
        now = time.time_ns()
        new = entry.with_(mtime_ns=now, meta=dict(meta), mode=0o644, uid=None, gid=None)
        try:
            self._stage(ctx, b.repo, ref, path, key, new)
        except FabricError as exc:
            raise from_fabric(exc) from None
        return self._xml(
            X.doc("CopyObjectResult", X.el("LastModified", iso8601(now / 1e9)) + X.el("ETag", f'"{new.md5}"'))
        )

    # -- multipart --------------------------------------------------------------------
    def create_upload(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        ref, path, is_dir = self._locate_write(ctx, b, key)
        if is_dir:
            raise S3Error("InvalidArgument", "a key ending in '/' is a directory marker and cannot be uploaded in parts", 400)
        meta = self._meta_from_headers(ctx.req.headers)
        upload_id = self.uploads.create(b.name, key, b.repo, ref, path, meta, ctx.who.token_id or ctx.who.name)
        body = X.el("Bucket", b.name) + X.el("Key", key) + X.el("UploadId", upload_id)
        headers = {}
        algo = ctx.header("x-amz-checksum-algorithm")
        if algo:
            headers["x-amz-checksum-algorithm"] = algo
        resp = self._xml(X.doc("InitiateMultipartUploadResult", body))
        resp.headers.update(headers)  # type: ignore[union-attr]
        return resp

    def _upload(self, ctx: Ctx, b: Bucket, key: str, role: str = "write"):
        upload_id = ctx.q.get("uploadId", "")
        up = self.uploads.get(upload_id)
        if up is None or up.bucket != b.name or up.key != key:
            raise S3Error(
                "NoSuchUpload",
                "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
                404,
                UploadId=upload_id,
            )
        self._require(ctx, b, role)
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
            chunks, md5 = self._copy_part(ctx)
            size = sum(n for _, n in chunks)
        else:
            declared = ctx.header("content-length")
            if declared and declared.isdigit() and int(declared) > MAX_PART_SIZE + (1 << 20):
                raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size", 400)
            stream = self._payload(ctx)
            try:
                chunks, md5 = self._ingest(stream)
            except FabricError as exc:
                raise from_fabric(exc) from None
            size = sum(n for _, n in chunks)
            self.stats["bytes_in"] += size
        if size > MAX_PART_SIZE:
            raise S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size", 400)
        if self.uploads.get(up.id) is None:
            raise S3Error("NoSuchUpload", "The specified upload does not exist.", 404, UploadId=up.id)
        self.uploads.put_part(up.id, number, md5, size, chunks)
        if copy:
            now = time.time()
            return self._xml(X.doc("CopyPartResult", X.el("LastModified", iso8601(now)) + X.el("ETag", f'"{md5}"')))
        headers = {"ETag": f'"{md5}"'}
        for algo, value in stream.checks.checksums.items():
            headers[f"x-amz-checksum-{algo}"] = value
        return Response(200, headers)

    def _copy_part(self, ctx: Ctx) -> tuple[list[tuple[bytes, int]], str]:
        sb, sref, spath, entry = self._copy_source(ctx)
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
        if whole and "-" not in entry.md5 and entry.md5:
            return list(entry.chunks), entry.md5
        try:
            if length == 0:
                return [], hashlib.md5(b"").hexdigest()
            pieces = self.plane.open_file(sb.repo, sref, spath, entry, offset, length)
            return self._ingest(_RangeReader(iter(pieces)))
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
        out.append(self._owner(ctx))
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
        return self._xml(X.doc("ListPartsResult", "".join(out)))

    def complete_upload(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        up = self._upload(ctx, b, key)
        wanted = X.parse_complete(self._read_small(ctx))
        have = self.uploads.part_chunks(up.id)
        numbers = [n for n, _ in wanted]
        if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
            raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order. Parts must be ordered by part number.", 400)
        chunks: list[tuple[bytes, int]] = []
        md5s: list[str] = []
        for i, (n, etag) in enumerate(wanted):
            part = have.get(n)
            if part is None or part[0] != etag.lower():
                raise S3Error(
                    "InvalidPart",
                    "One or more of the specified parts could not be found. The part may not have been uploaded, "
                    "or the specified entity tag may not match the part's entity tag.",
                    400,
                    PartNumber=str(n),
                )
            if i < len(wanted) - 1 and part[1] < MIN_PART_SIZE:
                raise S3Error(
                    "EntityTooSmall", "Your proposed upload is smaller than the minimum allowed object size.", 400,
                    PartNumber=str(n), ProposedSize=str(part[1]), MinSizeAllowed=str(MIN_PART_SIZE),
                )
            chunks.extend(part[2])
            md5s.append(part[0])
        etag = multipart_etag(md5s)
        entry = file_entry(chunks, etag, 0o644, time.time_ns(), up.meta)
        try:
            self._stage(ctx, up.repo, up.branch, up.path, key, entry)
        except BadRequest as exc:
            if "not in the store" in exc.message:
                raise S3Error("InvalidPart", "parts of this upload are no longer stored (expired); upload them again", 400) from None
            raise from_fabric(exc) from None
        except FabricError as exc:
            raise from_fabric(exc) from None
        self.uploads.delete(up.id)
        body = (
            X.el("Location", f"/{b.name}/{key}") + X.el("Bucket", b.name) + X.el("Key", key) + X.el("ETag", f'"{etag}"')
        )
        return self._xml(X.doc("CompleteMultipartUploadResult", body))

    def abort_upload(self, ctx: Ctx, b: Bucket, key: str) -> Response:
        up = self._upload(ctx, b, key)
        self.uploads.delete(up.id)
        return Response(204)

    def list_uploads(self, ctx: Ctx, b: Bucket) -> Response:
        self._require(ctx, b, "read")
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
                f"{self._owner(ctx)}<StorageClass>STANDARD</StorageClass>{X.el('Initiated', iso8601(up.created))}</Upload>"
            )
        return self._xml(X.doc("ListMultipartUploadsResult", "".join(out)))


# -- helpers ------------------------------------------------------------------------------
def _next_batch(it: Iterator[bytes]) -> bytes:
    """Up to ~STREAM_PIECE bytes from a piece iterator (b'' at the end)."""
    parts = []
    size = 0
    for piece in it:
        parts.append(piece)
        size += len(piece)
        if size >= STREAM_PIECE:
            break
    if len(parts) == 1:
        return bytes(parts[0])
    return b"".join(parts)


def _etag_matches(header: str, md5: str) -> bool:
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        tag = tag.removeprefix("W/")
        if tag.strip('"') == md5:
            return True
    return False


def _parse_http_date(text: str) -> int | None:
    try:
        return int(parsedate_to_datetime(text).timestamp())
    except (TypeError, ValueError, IndexError):
        return None


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-b`` -> ``(offset, length)``; ``None`` to ignore a header S3 would ignore;
    :class:`S3Error` InvalidRange when it cannot be satisfied."""
    unit, eq, spec = header.partition("=")
    if not eq or unit.strip().lower() != "bytes" or "," in spec:
        return None
    a, dash, z = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if a == "":
            n = int(z)
            if n <= 0:
                raise _invalid_range(size)
            start, end = max(0, size - n), size - 1
        else:
            start = int(a)
            end = int(z) if z else size - 1
    except ValueError:
        return None
    if start >= size:
        raise _invalid_range(size)
    if start < 0 or end < start:
        return None
    end = min(end, size - 1)
    return start, end - start + 1


def _invalid_range(size: int) -> S3Error:
    err = S3Error("InvalidRange", "The requested range is not satisfiable", 416, ActualObjectSize=str(size))
    err.headers["Content-Range"] = f"bytes */{size}"
    return err
