"""CORS preflight (``OPTIONS``) requests: answered as S3 answers them for a bucket without a
CORS configuration, before any signature is checked (a browser's preflight carries none; on a
presigned URL it carries the signature of another method)."""

from __future__ import annotations

from fabric.api.s3 import sigv4
from fabric.api.s3.errors import S3Error


def preflight_refusal(req: sigv4.SignedRequest) -> S3Error:
    """The error an ``OPTIONS`` request gets: fabric's buckets have no CORS configuration."""
    if not req.headers.get("origin"):
        return S3Error("BadRequest", "Insufficient information. Origin request header needed.", 400)
    method = req.headers.get("access-control-request-method")
    if not method:
        return S3Error("BadRequest", "Invalid Access-Control-Request-Method: null", 400)
    return S3Error(
        "AccessForbidden", "CORSResponse: CORS is not enabled for this bucket.", 403, Method=method[:20],
        ResourceType="OBJECT" if "/" in req.path.lstrip("/") else "BUCKET",
    )
