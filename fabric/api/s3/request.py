"""One S3 request as the handlers see it: who sent it, its query, its verified body;
and the pieces their answers share (XML responses, owner documents, times)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fabric.api.s3 import sigv4
from fabric.api.s3 import xml as X
from fabric.api.s3.errors import S3Error
from fabric.api.s3.transport import AsgiBody, GatewayStats, Response
from fabric.auth.principal import Principal


def iso8601(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


@dataclass
class Ctx:
    """One request as the handlers see it."""

    req: sigv4.SignedRequest
    rid: str
    who: Principal
    auth: sigv4.AuthResult
    body: AsgiBody
    q: dict[str, str]
    stats: GatewayStats

    def header(self, name: str) -> str | None:
        return self.req.headers.get(name)

    def payload(self) -> Any:
        """The request body as a verified, decoded file-like object."""
        headers = self.req.headers
        self.stats.payload("SHA256" if len(self.auth.payload) == 64 else self.auth.payload)
        checks = sigv4.BodyChecks.from_headers(headers, self.auth.payload)
        encoding = headers.get("content-encoding", "")
        chunked = self.auth.payload in sigv4.STREAMING_MODES or "aws-chunked" in encoding.lower()
        if chunked:
            decoded = headers.get("x-amz-decoded-content-length")
            if decoded is not None:
                try:
                    checks.length = int(decoded)
                except ValueError:
                    raise S3Error("InvalidArgument", "x-amz-decoded-content-length is not a number", 400) from None
            trailers = (headers.get("x-amz-trailer") or "").split(",")
            return sigv4.ChunkedBody(self.body, self.auth, checks, trailers)
        return sigv4.VerifiedBody(self.body, checks)

    def read_small(self, limit: int = X.MAX_XML_BYTES) -> bytes:
        """The whole body (an XML document), refused when over ``limit`` bytes."""
        declared = self.header("content-length")
        if declared and declared.isdigit() and int(declared) > limit + 65536:
            raise S3Error("MaxMessageLengthExceeded", "Your request was too big.", 400)
        stream = self.payload()
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


def xml_response(body: bytes, status: int = 200) -> Response:
    return Response(status, {"Content-Type": "application/xml"}, body)


def owner_xml(ctx: Ctx) -> str:
    return X.owner(ctx.who.name, ctx.who.token_id or "anonymous")
