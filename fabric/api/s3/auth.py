"""Who sent an S3 request, and whether they may touch a bucket's repository.

:mod:`fabric.api.s3.sigv4` checks signatures; this module picks the scheme a
request uses (SigV4 header or presigned URL, or their V2 forms) and checks it
with the host's :class:`Credentials`, and checks a principal's role on a
repository. The hub holds the S3 secrets (:class:`SecretCredentials`); a spoke
gets derived SigV4 signing keys from its hub and lets the hub check V2
signatures, so no secret ever leaves the hub. Credentials cache what they look
up (and forget it when a principal's roles change); this module caches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fabric.api.s3 import sigv4
from fabric.api.s3.errors import S3Error
from fabric.auth.principal import ANONYMOUS_ADMIN, Principal


class Credentials(Protocol):
    """What the gateway needs of its host to authenticate requests; each method raises to refuse the key."""

    def signing_key(self, access_key: str, date: str, region: str, service: str) -> tuple[Principal, bytes]:
        """The principal of ``access_key`` and its SigV4 signing key for one day, region and service."""

    def verify_v2(self, access_key: str, strings_to_sign: Sequence[str], signature: str) -> Principal:
        """The principal of ``access_key`` if ``signature`` signs one of ``strings_to_sign`` (SigV2);
        S3Error SignatureDoesNotMatch if none."""


#: The name the gateway knows the host's credentials by.
CredentialLookup = Credentials


class SecretCredentials:
    """Credentials where the secrets are: ``secrets(access_key) -> (Principal, secret)``."""

    def __init__(self, secrets: sigv4.SecretLookup) -> None:
        self.signing_key = sigv4.secret_keys(secrets)
        self.verify_v2 = sigv4.secret_v2(secrets)


class Authenticator:
    """Verifies requests against ``credentials``; with ``None`` every request is the anonymous admin's.

    Nothing is cached here: the credentials cache what they look up, and know when a
    principal's roles change (a repository it just created)."""

    def __init__(self, credentials: Credentials | None) -> None:
        self.credentials = credentials

    def authenticate(self, req: sigv4.SignedRequest) -> sigv4.AuthResult:
        creds = self.credentials
        if creds is None:
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
            return sigv4.verify_presigned(req, creds.signing_key)
        if sigv4.is_presigned_v2(req):
            return sigv4.verify_v2_presigned(req, creds.verify_v2)
        if "authorization" in req.headers:
            if req.headers["authorization"].startswith("AWS "):
                return sigv4.verify_v2_header(req, creds.verify_v2)
            return sigv4.verify_header(req, creds.signing_key)
        raise S3Error("AccessDenied", "Anonymous access is not allowed: sign requests with a fabric token's S3 key pair", 403)


def require(who: Principal, repo: str, role: str) -> None:
    """AccessDenied unless ``who`` has ``role`` (read, write, admin) on repository ``repo``."""
    if not who.can(repo, role):
        raise S3Error("AccessDenied", f"token {who.name!r} lacks {role} access to repository {repo!r}", 403)
