"""The gateway's ASGI side: reading requests off the connection, sending answers, counting both.

Handlers run in a worker thread pool (plane calls block on SQLite and disks),
never on the event loop; :class:`AsgiBody` lets them read the request body from
there, and streamed answers are sent piece by piece from the same pool. Paths
under ``/_fabric/`` are the listener's own (health and metrics), not buckets.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fabric.api.body import take
from fabric.api.s3 import sigv4
from fabric.api.s3 import xml as X
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.errors import FabricError
from fabric.util.pieces import in_pieces

log = logging.getLogger("fabric.s3")
access_log = logging.getLogger("fabric.s3.access")

#: An unread request body up to this size is read and dropped after an early answer; larger ones close the connection.
DRAIN_LIMIT = 8 << 20


@dataclass
class Response:
    status: int = 200
    headers: dict[str, str] | None = None
    body: bytes | Iterator[bytes] = b""
    length: int | None = None  # Content-Length of a streamed body


@dataclass
class GatewayStats:
    """What the gateway counts, served at ``/_fabric/metrics``."""

    requests: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    ops: dict[tuple[str, int], int] = field(default_factory=dict)  # answers by (operation, status)
    modes: dict[str, int] = field(default_factory=dict)  # request bodies by payload signing mode

    def answered(self, op: str, status: int, sent: int) -> None:
        self.requests += 1
        self.bytes_out += sent
        if status >= 400:
            self.errors += 1
        key = (op, status)
        self.ops[key] = self.ops.get(key, 0) + 1

    def payload(self, mode: str) -> None:
        self.modes[mode] = self.modes.get(mode, 0) + 1

    def prometheus(self) -> bytes:
        lines = [
            "# TYPE fabric_s3_requests counter",
            *(f'fabric_s3_requests{{op="{o}",status="{s}"}} {n}' for (o, s), n in sorted(self.ops.items())),
            "# TYPE fabric_s3_bytes counter",
            f'fabric_s3_bytes{{direction="out"}} {self.bytes_out}',
            f'fabric_s3_bytes{{direction="in"}} {self.bytes_in}',
            "# TYPE fabric_s3_payloads counter",
            *(f'fabric_s3_payloads{{mode="{m}"}} {n}' for m, n in sorted(self.modes.items())),
        ]
        return ("\n".join(lines) + "\n").encode()


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

    async def wait_disconnect(self) -> None:
        """Return when the client goes away (or the server closes the connection); only once the
        request body has been read, since this takes whatever of it is left."""
        while (await self._receive())["type"] != "http.disconnect":
            pass

    def read(self, n: int = -1) -> bytes:
        self.started = True
        while self._more and (n < 0 or len(self._buf) < n):
            assert self._loop is not None, "AsgiBody.read() runs in a worker thread of the gateway"
            self._buf += asyncio.run_coroutine_threadsafe(self._next(), self._loop).result()
        return take(self._buf, n)


#: Answers one S3 request in a worker thread: ``(request, request id, body, op)``; the
#: handler names the S3 operation in ``op[0]`` (for metrics) as soon as it knows it.
Handler = Callable[[sigv4.SignedRequest, str, AsgiBody, list[str]], Response]


class AsgiTransport:
    """The ASGI application: lifespan, ``/_fabric/`` service paths, and S3 requests for ``handle``."""

    def __init__(
        self,
        handle: Handler,
        pool: ThreadPoolExecutor,
        stats: GatewayStats,
        on_shutdown: Callable[[], None],
        access_log_enabled: bool = True,
    ) -> None:
        self.handle = handle
        self.pool = pool
        self.stats = stats
        self.on_shutdown = on_shutdown
        self.access_log = access_log_enabled

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await asyncio.get_running_loop().run_in_executor(None, self.on_shutdown)
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
                resp = await loop.run_in_executor(self.pool, self.handle, req, rid, body, op)
        except S3Error as err:
            resp = self._error(err, path, rid, method)
        except FabricError as exc:
            # An engine error no handler translated (e.g. the hub away while a spoke resolves a
            # bucket): it has an S3 answer (503 ServiceUnavailable, ...), not InternalError.
            resp = self._error(from_fabric(exc), path, rid, method)
        except Exception:
            log.exception("S3 request %s %s failed", method, path)
            resp = self._error(S3Error("InternalError", "We encountered an internal error. Please try again.", 500), path, rid, method)
        if body.unread(scope):
            await self._settle_body(scope, body, resp)
        sent = await self._send(resp, send, method, None if body.unread(scope) else body)
        self.stats.answered(op[0], resp.status, sent)
        if self.access_log:
            access_log.info(
                "%s %s %s %d %d %.1fms", (scope.get("client") or ("-",))[0], method, path, resp.status, sent,
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

    async def _send(self, resp: Response, send: Callable, method: str, request_body: AsgiBody | None) -> int:
        """Send the answer; a streamed one stops early when the client goes away (given
        ``request_body``, read to its end, to learn that from)."""
        headers = resp.headers or {}
        body = resp.body
        if isinstance(body, (bytes, bytearray)):
            if "Content-Length" not in headers:
                headers["Content-Length"] = str(len(body))
        elif resp.length is not None:
            headers["Content-Length"] = str(resp.length)
        raw_headers = [(k.lower().encode("latin-1"), _header_value(v)) for k, v in headers.items()]
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
        pieces = in_pieces(body)  # one thread hop per MiB, not per chunk
        loop = asyncio.get_running_loop()
        gone = asyncio.ensure_future(request_body.wait_disconnect()) if request_body is not None else None
        try:
            while gone is None or not gone.done():
                piece = await loop.run_in_executor(self.pool, next, pieces, b"")
                if not piece:
                    break
                sent += len(piece)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            if gone is not None:
                gone.cancel()
            close = getattr(body, "close", None)
            if close:
                await loop.run_in_executor(self.pool, close)
        return sent

    def _service(self, path: str) -> Response:
        if path == "/_fabric/healthz":
            return Response(200, {"Content-Type": "application/json"}, b'{"status": "ok", "role": "s3"}')
        if path == "/_fabric/metrics":
            return Response(200, {"Content-Type": "text/plain; version=0.0.4"}, self.stats.prometheus())
        raise S3Error("NoSuchBucket", "The specified bucket does not exist", 404)

    def _error(self, err: S3Error, path: str, rid: str, method: str) -> Response:
        headers = {"x-amz-request-id": rid, "x-amz-id-2": rid, **err.headers}
        if method == "HEAD":
            return Response(err.status, headers, b"")
        headers["Content-Type"] = "application/xml"
        return Response(err.status, headers, X.error_doc(err.code, err.message, path, rid, err.extra))


_UNSENDABLE = re.compile(r"[\r\n\0]+")


def _header_value(value: object) -> bytes:
    """A response header value as bytes: a line break or NUL (from ``response-*`` overrides or
    metadata) cannot be sent in a header and becomes a space."""
    return _UNSENDABLE.sub(" ", str(value)).strip().encode("latin-1", "replace")
