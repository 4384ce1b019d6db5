"""Who sent an S3 request, and whether they may touch a bucket's repository.

:mod:`fabric.api.s3.sigv4` checks signatures; this module picks the scheme a
request uses (SigV4 header or presigned URL, or their V2 forms), looks up the
key pair's principal and secret through the host's ``credentials`` (cached for
a few seconds), and checks a principal's role on a repository.
"""

from __future__ import annotations

from collections.abc import Callable

from fabric.api.s3 import sigv4
from fabric.api.s3.cache import TTLCache
from fabric.api.s3.errors import S3Error
from fabric.auth.principal import ANONYMOUS_ADMIN, Principal

#: ``credentials(access_key_id) -> (Principal, secret)``; raises for an unknown key.
CredentialLookup = Callable[[str], tuple[Principal, str]]


class Authenticator:
    """Verifies requests against ``credentials``; with ``None`` every request is the anonymous admin's."""

    def __init__(self, credentials: CredentialLookup | None, cache_seconds: float) -> None:
        self.credentials = credentials
        self._creds = TTLCache(cache_seconds)

    def _lookup_credentials(self, access_key: str) -> tuple[Principal, str]:
        assert self.credentials is not None
        return self._creds.get(access_key, lambda: self.credentials(access_key))  # type: ignore[misc]

    def authenticate(self, req: sigv4.SignedRequest) -> sigv4.AuthResult:
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


def require(who: Principal, repo: str, role: str) -> None:
    """AccessDenied unless ``who`` has ``role`` (read, write, admin) on repository ``repo``."""
    if not who.can(repo, role):
        raise S3Error("AccessDenied", f"token {who.name!r} lacks {role} access to repository {repo!r}", 403)
