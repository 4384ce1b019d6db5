"""AWS Signature Version 4 as S3 servers check it.

Covers what current SDKs and tools send: the ``Authorization`` header, presigned
URLs (``X-Amz-*`` query parameters), ``UNSIGNED-PAYLOAD``, a signed SHA-256 of
the body, and ``aws-chunked`` bodies, with per-chunk signatures
(``STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]``) or unsigned chunks with a
trailing checksum (``STREAMING-UNSIGNED-PAYLOAD-TRAILER``).

Nothing here knows of HTTP frameworks: requests are described by
:class:`SignedRequest`, bodies are blocking file-like objects. Errors are
:class:`S3Error` with the S3 code a client expects. Secrets and signatures are
never put into error messages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import threading
import time
import zlib
from calendar import timegm
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, BinaryIO
from urllib.parse import quote, unquote

from fabric.api.s3.errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_MODES = (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_SKEW = 15 * 60
MAX_PRESIGN_EXPIRES = 7 * 24 * 3600
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SPACES = re.compile(r"\s+")

#: V4 key lookup: ``(access key id, date YYYYMMDD, region, service) -> (principal, signing key)``,
#: the key derived by :func:`signing_key`. Raises to refuse the key. A host that does not hold
#: the secret (a spoke) gets the derived key from one that does.
SigningKeyLookup = Callable[[str, str, str, str], tuple[Any, bytes]]
#: V2 check: ``(access key id, candidate strings to sign, signature) -> principal``; raises
#: S3Error SignatureDoesNotMatch when no candidate matches, anything else to refuse the key.
V2Verifier = Callable[[str, Sequence[str], str], Any]
#: Secret lookup: ``access key id -> (principal, secret)``; only where the secret is (the hub).
SecretLookup = Callable[[str], tuple[Any, str]]


# Used with fullmatch: "$" would also match before a trailing newline, leaving it unescaped.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")
_UNRESERVED_PATH = re.compile(r"[A-Za-z0-9_.~/-]*")


def _quote(s: str, safe: str = "-_.~") -> str:
    if _UNRESERVED.fullmatch(s):
        return s
    return quote(s, safe=safe)


def uri_encode_path(path: str) -> str:
    """S3's canonical URI for a decoded path: every byte but unreserved ones and '/' escaped."""
    if _UNRESERVED_PATH.fullmatch(path):
        return path
    return quote(path, safe="-_.~/")


def canonical_query(pairs: Sequence[tuple[str, str]]) -> str:
    enc = sorted((_quote(k), _quote(v)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in enc)


def parse_query(raw: str) -> list[tuple[str, str]]:
    """``a=1&b&c=%2F`` -> ``[("a", "1"), ("b", ""), ("c", "/")]`` (no '+' -> space: S3 clients send %20)."""
    out = []
    if not raw:
        return out
    for part in raw.split("&"):
        if not part:
            continue
        k, _, v = part.partition("=")
        out.append((unquote(k), unquote(v)))
    return out


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    k = hmac.new(k, region.encode(), hashlib.sha256).digest()
    k = hmac.new(k, service.encode(), hashlib.sha256).digest()
    return hmac.new(k, b"aws4_request", hashlib.sha256).digest()


class _KeyCache:
    """Derived signing keys change once a day per secret: derive each once."""

    def __init__(self, limit: int = 4096) -> None:
        self._keys: dict[tuple[str, str, str, str], bytes] = {}
        self._lock = threading.Lock()
        self._limit = limit

    def get(self, secret: str, date: str, region: str, service: str) -> bytes:
        k = (secret, date, region, service)
        key = self._keys.get(k)
        if key is None:
            key = signing_key(secret, date, region, service)
            with self._lock:
                if len(self._keys) >= self._limit:
                    self._keys.clear()
                self._keys[k] = key
        return key


_KEYS = _KeyCache()


def secret_keys(secrets: SecretLookup) -> SigningKeyLookup:
    """A V4 key lookup over a secret lookup (derived keys cached per secret and day)."""

    def keys(access_key: str, date: str, region: str, service: str) -> tuple[Any, bytes]:
        principal, secret = secrets(access_key)
        return principal, _KEYS.get(secret, date, region, service)

    return keys


def v2_signature(secret: str, string_to_sign: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha1).digest()).decode()


def v2_matches(secret: str, strings_to_sign: Sequence[str], signature: str) -> bool:
    """Whether ``signature`` signs one of ``strings_to_sign`` with ``secret`` (Signature Version 2)."""
    return any(hmac.compare_digest(v2_signature(secret, sts), signature) for sts in strings_to_sign)


def secret_v2(secrets: SecretLookup) -> V2Verifier:
    """A V2 check over a secret lookup."""

    def verify(access_key: str, strings_to_sign: Sequence[str], signature: str) -> Any:
        principal, secret = secrets(access_key)
        if not v2_matches(secret, strings_to_sign, signature):
            raise _mismatch()
        return principal

    return verify


def _mismatch() -> S3Error:
    return S3Error(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.",
        403,
    )


def sign(key: bytes, string_to_sign: str) -> str:
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass
class SignedRequest:
    """What signature checking needs to know about one HTTP request."""

    method: str
    raw_path: str  # as sent on the wire (still percent-encoded)
    path: str  # decoded
    query: list[tuple[str, str]]  # decoded, in order
    headers: dict[str, str]  # lower-case names; repeated headers joined with ','

    def query_value(self, name: str) -> str | None:
        for k, v in self.query:
            if k == name:
                return v
        return None


@dataclass
class AuthResult:
    """A verified request: who sent it and what the body must satisfy."""

    principal: Any
    access_key: str
    payload: str  # the signed x-amz-content-sha256 value (hex, UNSIGNED-PAYLOAD or a STREAMING-* mode)
    signature: str = ""
    key: bytes = b""
    amz_date: str = ""
    scope: str = ""
    presigned: bool = False
    extra: dict = field(default_factory=dict)


_AMZ_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")


def _parse_amz_date(text: str) -> float:
    m = _AMZ_DATE.fullmatch(text or "")
    if m:
        y, mo, d, hh, mm, ss = (int(g) for g in m.groups())
        if 1 <= mo <= 12 and 1 <= d <= 31 and hh < 24 and mm < 60 and ss < 61:
            return float(timegm((y, mo, d, hh, mm, ss, 0, 0, 0)))
    raise S3Error("AccessDenied", f"invalid X-Amz-Date {str(text)[:40]!r}: expected YYYYMMDDTHHMMSSZ", 403)


def _header_date(req: SignedRequest) -> tuple[str, float]:
    amz = req.headers.get("x-amz-date")
    if amz:
        return amz, _parse_amz_date(amz)
    date = req.headers.get("date")
    if date:
        try:
            ts = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            raise S3Error("AccessDenied", "invalid Date header", 403) from None
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts)), ts
    raise S3Error("AccessDenied", "the request is signed but has neither an X-Amz-Date nor a Date header", 403)


_CRED_RE = re.compile(r"([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request")


def _parse_credential(text: str) -> tuple[str, str, str, str]:
    m = _CRED_RE.fullmatch(text or "")
    if not m:
        raise S3Error(
            "AuthorizationHeaderMalformed",
            "the Credential is malformed: expected ACCESS_KEY/YYYYMMDD/REGION/s3/aws4_request",
            400,
        )
    key, date, region, service = m.groups()
    if service != "s3":
        raise S3Error("AuthorizationHeaderMalformed", f"the credential is for service {service!r}, not 's3'", 400)
    return key, date, region, service


def parse_authorization(header: str) -> dict[str, str]:
    """``AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`` -> its fields."""
    algo, _, rest = header.strip().partition(" ")
    if algo != ALGORITHM:
        raise S3Error("AuthorizationHeaderMalformed", f"unsupported authorization algorithm {algo[:40]!r}", 400)
    fields: dict[str, str] = {}
    for part in rest.split(","):
        k, eq, v = part.strip().partition("=")
        if eq:
            fields[k.strip()] = v.strip()
    for need in ("Credential", "SignedHeaders", "Signature"):
        if need not in fields:
            raise S3Error("AuthorizationHeaderMalformed", f"the Authorization header lacks {need}", 400)
    return fields


def wire_text(value: str) -> str:
    """A header value as read off the connection (Latin-1, one character per byte) turned into the
    text whose UTF-8 form (``surrogateescape``) is exactly those bytes: a signature covers the bytes sent."""
    if value.isascii():
        return value
    return value.encode("latin-1").decode("utf-8", "surrogateescape")


def canonical_headers(req: SignedRequest, signed: list[str], wire: bool = True) -> str:
    """The canonical header lines; ``wire``: values as the bytes sent (UTF-8 senders: most SDKs),
    else as the Latin-1 text they decode to (Python's http.client sends Latin-1, signs UTF-8)."""
    lines = []
    for name in signed:
        value = req.headers.get(name)
        if value is None:
            raise S3Error("SignatureDoesNotMatch", f"signed header {name!r} is missing from the request", 403)
        value = _SPACES.sub(" ", value.strip())
        lines.append(f"{name}:{wire_text(value) if wire else value}\n")
    return "".join(lines)


def canonical_request(
    req: SignedRequest, uri: str, query: Sequence[tuple[str, str]], signed: list[str], payload: str, wire: bool = True
) -> str:
    return "\n".join(
        [req.method, uri, canonical_query(query), canonical_headers(req, signed, wire), ";".join(signed), payload]
    )


def string_to_sign(amz_date: str, scope: str, creq: str) -> str:
    digest = hashlib.sha256(creq.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def _check_signature(
    req: SignedRequest, key: bytes, amz_date: str, scope: str, query: Sequence[tuple[str, str]], signed: list[str],
    payload: str, signature: str,
) -> None:
    """Try the path as sent, then S3's canonical encoding of the decoded path; header values as
    the bytes sent, then (when a signed one is not ASCII) as their Latin-1 text."""
    uris = dict.fromkeys((req.raw_path or "/", uri_encode_path(req.path) or "/"))
    non_ascii = any(not req.headers.get(h, "").isascii() for h in signed)
    for wire in (True, False) if non_ascii else (True,):
        for uri in uris:
            creq = canonical_request(req, uri, query, signed, payload, wire)
            if hmac.compare_digest(sign(key, string_to_sign(amz_date, scope, creq)), signature):
                return
    raise _mismatch()


def _lookup(lookup: Callable[[], Any]) -> Any:
    """Run a key lookup; any failure but an S3Error is an unknown key."""
    try:
        return lookup()
    except S3Error:
        raise
    except Exception:  # noqa: BLE001 - any failure to find the key is the same answer
        raise S3Error("InvalidAccessKeyId", "The AWS access key Id you provided does not exist in our records.", 403) from None


def verify_header(req: SignedRequest, keys: SigningKeyLookup, now: float | None = None) -> AuthResult:
    """Verify a request signed in its ``Authorization`` header."""
    fields = parse_authorization(req.headers["authorization"])
    access_key, date, region, service = _parse_credential(fields["Credential"])
    signed = [h.strip().lower() for h in fields["SignedHeaders"].split(";") if h.strip()]
    if "host" not in signed:
        raise S3Error("AccessDenied", "the signature must cover the Host header", 403)
    amz_date, ts = _header_date(req)
    if amz_date[:8] != date:
        raise S3Error("SignatureDoesNotMatch", "the date of the credential scope differs from the request date", 403)
    now = time.time() if now is None else now
    if abs(now - ts) > MAX_SKEW:
        raise S3Error(
            "RequestTimeTooSkewed", "The difference between the request time and the current time is too large.", 403
        )
    payload = req.headers.get("x-amz-content-sha256")
    if payload is None:
        raise S3Error("InvalidRequest", "Missing required header for this request: x-amz-content-sha256", 400)
    if not (payload == UNSIGNED or payload in STREAMING_MODES or _HEX64.fullmatch(payload)):
        if payload.startswith("STREAMING-"):
            raise S3Error("NotImplemented", f"payload signing mode {payload[:60]!r} is not supported", 501)
        raise S3Error("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-* or a SHA-256", 400)
    principal, key = _lookup(lambda: keys(access_key, date, region, service))
    scope = f"{date}/{region}/{service}/aws4_request"
    signature = fields["Signature"]
    _check_signature(req, key, amz_date, scope, req.query, signed, payload, signature)
    return AuthResult(principal, access_key, payload, signature, key, amz_date, scope)


def verify_presigned(req: SignedRequest, keys: SigningKeyLookup, now: float | None = None) -> AuthResult:
    """Verify a presigned URL (``X-Amz-Algorithm=AWS4-HMAC-SHA256&…&X-Amz-Signature=…``)."""
    q = {k: v for k, v in req.query}
    if q.get("X-Amz-Algorithm") != ALGORITHM:
        raise S3Error("AuthorizationQueryParametersError", "X-Amz-Algorithm must be AWS4-HMAC-SHA256", 400)
    for need in ("X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature"):
        if need not in q:
            raise S3Error("AuthorizationQueryParametersError", f"the presigned URL lacks {need}", 400)
    access_key, date, region, service = _parse_credential(q["X-Amz-Credential"])
    amz_date = q["X-Amz-Date"]
    ts = _parse_amz_date(amz_date)
    if amz_date[:8] != date:
        raise S3Error("SignatureDoesNotMatch", "the date of the credential scope differs from X-Amz-Date", 403)
    try:
        expires = int(q["X-Amz-Expires"])
    except ValueError:
        raise S3Error("AuthorizationQueryParametersError", "X-Amz-Expires must be a number of seconds", 400) from None
    if expires <= 0:
        raise S3Error("AccessDenied", "X-Amz-Expires must be a positive number of seconds", 403)
    if expires > MAX_PRESIGN_EXPIRES:
        raise S3Error(
            "AccessDenied", "X-Amz-Expires must be less than a week (in seconds); that is, at most 604800 seconds", 403
        )
    now = time.time() if now is None else now
    if ts - now > MAX_SKEW:
        raise S3Error("AccessDenied", "Request is not valid yet", 403)
    if now > ts + expires:
        raise S3Error("AccessDenied", "Request has expired", 403)
    signed = [h.strip().lower() for h in q["X-Amz-SignedHeaders"].split(";") if h.strip()]
    if "host" not in signed:
        raise S3Error("AccessDenied", "the signature must cover the Host header", 403)
    payload = q.get("X-Amz-Content-Sha256") or req.headers.get("x-amz-content-sha256") or UNSIGNED
    if not (payload == UNSIGNED or _HEX64.fullmatch(payload)):
        raise S3Error("InvalidArgument", "presigned requests carry UNSIGNED-PAYLOAD or a SHA-256 of the body", 400)
    principal, key = _lookup(lambda: keys(access_key, date, region, service))
    scope = f"{date}/{region}/{service}/aws4_request"
    query = [(k, v) for k, v in req.query if k != "X-Amz-Signature"]
    _check_signature(req, key, amz_date, scope, query, signed, payload, q["X-Amz-Signature"])
    return AuthResult(principal, access_key, payload, q["X-Amz-Signature"], key, amz_date, scope, presigned=True)


def is_presigned(req: SignedRequest) -> bool:
    return any(k == "X-Amz-Signature" for k, _ in req.query)


# -- Signature Version 2 (HMAC-SHA1) --------------------------------------------------------
# boto3 still presigns S3 URLs with it unless told signature_version='s3v4', so
# presigned URLs from an unconfigured client are V2; a few old tools sign
# headers with it too. The string to sign covers the method, Content-MD5,
# Content-Type, the date (the expiry time for URLs), x-amz-* headers and the
# resource with its sub-resources.
V2_SUBRESOURCES = frozenset(
    ["accelerate", "acl", "cors", "defaultObjectAcl", "location", "logging", "partNumber", "policy", "requestPayment", "torrent", "versioning", "versionId", "versions", "website", "uploads", "uploadId", "response-content-type", "response-content-language", "response-expires", "response-cache-control", "response-content-disposition", "response-content-encoding", "delete", "lifecycle", "tagging", "restore", "storageClass", "notification", "replication", "analytics", "metrics", "inventory", "select", "select-type", "object-lock"]
)


def is_presigned_v2(req: SignedRequest) -> bool:
    return req.query_value("Signature") is not None and req.query_value("AWSAccessKeyId") is not None


def _v2_string(req: SignedRequest, date: str) -> str:
    h = req.headers
    amz = sorted((k, v) for k, v in h.items() if k.startswith("x-amz-"))
    amz_lines = "".join(f"{k}:{_SPACES.sub(' ', v.strip())}\n" for k, v in amz)
    subs = sorted((k, v) for k, v in req.query if k in V2_SUBRESOURCES)
    resource = req.raw_path or "/"
    if subs:
        resource += "?" + "&".join(f"{k}={v}" if v != "" else k for k, v in subs)
    return f"{req.method}\n{h.get('content-md5', '')}\n{h.get('content-type', '')}\n{date}\n{amz_lines}{resource}"


def _v2_strings(req: SignedRequest, dates: Sequence[str]) -> list[str]:
    """The strings a V2 signature may sign: the path as sent or S3-encoded, each candidate date."""
    out: list[str] = []
    for path in dict.fromkeys((req.raw_path or "/", uri_encode_path(req.path) or "/")):
        for date in dict.fromkeys(dates):
            sts = _v2_string(SignedRequest(req.method, path, req.path, req.query, req.headers), date)
            if sts not in out:
                out.append(sts)
    return out


def verify_v2_presigned(req: SignedRequest, v2: V2Verifier, now: float | None = None) -> AuthResult:
    """``?AWSAccessKeyId=…&Expires=…&Signature=…`` (Signature Version 2 query authentication)."""
    access_key = req.query_value("AWSAccessKeyId") or ""
    try:
        expires = int(req.query_value("Expires") or "")
    except ValueError:
        raise S3Error("AccessDenied", "Expires must be a number of seconds since the epoch", 403) from None
    now = time.time() if now is None else now
    if now > expires:
        raise S3Error("AccessDenied", "Request has expired", 403)
    if expires - now > MAX_PRESIGN_EXPIRES:
        raise S3Error("AccessDenied", "presigned URLs are valid for at most 7 days", 403)
    query = [(k, v) for k, v in req.query if k not in ("Signature", "AWSAccessKeyId", "Expires")]
    probe = SignedRequest(req.method, req.raw_path, req.path, query, req.headers)
    strings = _v2_strings(probe, [str(expires)])
    principal = _lookup(lambda: v2(access_key, strings, req.query_value("Signature") or ""))
    return AuthResult(principal, access_key, UNSIGNED, presigned=True)


def verify_v2_header(req: SignedRequest, v2: V2Verifier, now: float | None = None) -> AuthResult:
    """``Authorization: AWS ACCESS_KEY:SIGNATURE`` (Signature Version 2)."""
    cred = req.headers["authorization"].strip()[4:]
    access_key, colon, signature = cred.partition(":")
    if not colon:
        raise S3Error("AuthorizationHeaderMalformed", "expected 'AWS ACCESS_KEY:SIGNATURE'", 400)
    if "x-amz-date" in req.headers:
        ts = _parse_v2_date(req.headers["x-amz-date"])
    elif "date" in req.headers:
        ts = _parse_v2_date(req.headers["date"])
    else:
        raise S3Error("AccessDenied", "the request has neither a Date nor an X-Amz-Date header", 403)
    dates = [req.headers["date"], ""] if "date" in req.headers else [""]
    now = time.time() if now is None else now
    if abs(now - ts) > MAX_SKEW:
        raise S3Error("RequestTimeTooSkewed", "The difference between the request time and the current time is too large.", 403)
    strings = _v2_strings(req, dates)
    principal = _lookup(lambda: v2(access_key, strings, signature))
    return AuthResult(principal, access_key, UNSIGNED)


def _parse_v2_date(text: str) -> float:
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        pass
    try:
        return _parse_amz_date(text)
    except S3Error:
        raise S3Error("AccessDenied", "the request date could not be parsed", 403) from None


# -- checksums -------------------------------------------------------------------
def _crc32_factory() -> Any:
    return _Crc(zlib.crc32, 4)


class _Crc:
    def __init__(self, fn: Callable[[bytes, int], int], size: int) -> None:
        self._fn = fn
        self._v = 0
        self._size = size

    def update(self, data: bytes | memoryview) -> None:
        self._v = self._fn(data, self._v)

    def digest(self) -> bytes:
        return self._v.to_bytes(self._size, "big")


def _crt_factory(name: str, size: int) -> Callable[[], Any] | None:
    try:
        from awscrt import checksums  # type: ignore[import-not-found]
    except ImportError:
        return None
    fn = getattr(checksums, name, None)
    if fn is None:
        return None
    return lambda: _Crc(lambda data, prev: fn(bytes(data), prev), size)


#: x-amz-checksum-* algorithms: name -> factory of an object with update()/digest(), None when unavailable here.
CHECKSUMS: dict[str, Callable[[], Any] | None] = {
    "crc32": _crc32_factory,
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "crc32c": _crt_factory("crc32c", 4),
    "crc64nvme": _crt_factory("crc64nvme", 8),
}


class BodyChecks:
    """Digests a body must match, computed while it streams past.

    ``check()`` (at the end of the body) raises the S3 error for the first
    mismatch: ``XAmzContentSHA256Mismatch``, ``BadDigest`` (Content-MD5 or an
    ``x-amz-checksum-*``), ``IncompleteBody``.
    """

    def __init__(self) -> None:
        self.sha256_hex: str | None = None
        self.md5_b64: str | None = None
        self.checksums: dict[str, str] = {}  # algorithm -> expected base64 value
        self.length: int | None = None
        self._sha = None
        self._md5 = None
        self._algos: dict[str, Any] = {}
        self.size = 0

    @classmethod
    def from_headers(cls, headers: dict[str, str], payload: str) -> BodyChecks:
        c = cls()
        if _HEX64.fullmatch(payload):
            c.sha256_hex = payload
            c._sha = hashlib.sha256()
        md5 = headers.get("content-md5")
        if md5 is not None:
            try:
                raw = base64.b64decode(md5, validate=True)
            except ValueError:
                raw = b""
            if len(raw) != 16:
                raise S3Error("InvalidDigest", "The Content-MD5 you specified was invalid.", 400)
            c.md5_b64 = md5
            c._md5 = hashlib.md5()
        for name, value in headers.items():
            if name.startswith("x-amz-checksum-") and name != "x-amz-checksum-type":
                c.expect_checksum(name[len("x-amz-checksum-") :], value)
        return c

    def expect_checksum(self, algo: str, value: str | None) -> None:
        """Check the body against ``x-amz-checksum-ALGO``; ``value=None`` announces a trailing
        checksum (hashing starts now, the value comes at the end)."""
        algo = algo.lower()
        if algo not in CHECKSUMS:
            raise S3Error("InvalidRequest", f"unknown checksum algorithm {algo!r}", 400)
        if value is not None:
            if self.size and algo not in self._algos and CHECKSUMS[algo] is not None:
                raise S3Error("MalformedTrailerError", f"trailing checksum {algo} was not announced in x-amz-trailer", 400)
            self.checksums[algo] = value.strip()
        factory = CHECKSUMS[algo]
        if factory is not None and algo not in self._algos:
            self._algos[algo] = factory()

    def update(self, data: bytes | memoryview) -> None:
        self.size += len(data)
        if self._sha is not None:
            self._sha.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        for h in self._algos.values():
            h.update(data)

    def check(self) -> None:
        if self.length is not None and self.size != self.length:
            raise S3Error(
                "IncompleteBody", f"the body has {self.size} bytes, the request declared {self.length}", 400
            )
        if self._sha is not None and self._sha.hexdigest() != self.sha256_hex:
            raise S3Error(
                "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.", 400
            )
        if self._md5 is not None and base64.b64encode(self._md5.digest()).decode() != self.md5_b64:
            raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.", 400)
        for algo, h in self._algos.items():
            if algo not in self.checksums:
                raise S3Error("MalformedTrailerError", f"the announced trailing checksum {algo} is missing", 400)
            if base64.b64encode(h.digest()).decode() != self.checksums[algo]:
                raise S3Error("BadDigest", f"The {algo.upper()} you specified did not match the calculated checksum.", 400)


class VerifiedBody:
    """A plain (not aws-chunked) body: passes bytes through and checks digests at the end."""

    def __init__(self, raw: BinaryIO, checks: BodyChecks) -> None:
        self._raw = raw
        self.checks = checks
        self._done = False

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        if data:
            self.checks.update(data)
        elif not self._done and n != 0:
            self._done = True
            self.checks.check()
        if n < 0 and not self._done:
            self._done = True
            self.checks.check()
        return data


class ChunkedBody:
    """Decode an ``aws-chunked`` body, verifying chunk signatures and trailing checksums.

    ``auth`` is the verified request (its signature seeds the chunk signature
    chain). ``read(n)`` returns decoded bytes; at the end of the body every
    check has passed or an :class:`S3Error` was raised, so a consumer that reads
    to the end never acts on a body that failed verification.
    """

    MAX_CHUNK = 64 * 1024 * 1024
    MAX_LINE = 4096

    def __init__(self, raw: BinaryIO, auth: AuthResult, checks: BodyChecks, trailer_names: Sequence[str] = ()) -> None:
        self._raw = raw
        self._auth = auth
        self.checks = checks
        self._signed = auth.payload in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)
        self._verify = self._signed and bool(auth.key)  # no key: authentication is off, decode only
        self._trailer = auth.payload in (STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER)
        self._trailer_names = [t.strip().lower() for t in trailer_names if t.strip()] if self._trailer else []
        for name in self._trailer_names:
            if name.startswith("x-amz-checksum-"):
                checks.expect_checksum(name[len("x-amz-checksum-") :], None)
        self._prev = auth.signature
        self._buf = bytearray()
        self._out = bytearray()
        self._eof = False
        self._finished = False

    # -- raw input ---------------------------------------------------------------
    def _fill(self, want: int) -> None:
        while len(self._buf) < want and not self._eof:
            piece = self._raw.read(max(want - len(self._buf), 1 << 16))
            if not piece:
                self._eof = True
            else:
                self._buf += piece

    def _line(self) -> str:
        while True:
            i = self._buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 2]
                return line.decode("latin-1")
            if len(self._buf) > self.MAX_LINE:
                raise S3Error("InvalidChunkSizeError", "an aws-chunked header line is too long", 400)
            if self._eof:
                raise S3Error("IncompleteBody", "the aws-chunked body ended in the middle of a chunk header", 400)
            self._fill(len(self._buf) + 1)

    def _exact(self, n: int) -> memoryview:
        self._fill(n)
        if len(self._buf) < n:
            raise S3Error("IncompleteBody", "the aws-chunked body ended in the middle of a chunk", 400)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return memoryview(data)

    # -- decoding ----------------------------------------------------------------
    def _chunk_string(self, data: bytes | memoryview) -> str:
        a = self._auth
        return (
            f"AWS4-HMAC-SHA256-PAYLOAD\n{a.amz_date}\n{a.scope}\n{self._prev}\n{EMPTY_SHA256}\n"
            f"{hashlib.sha256(data).hexdigest()}"
        )

    def _next_chunk(self) -> bool:
        header = self._line()
        size_s, _, ext = header.partition(";")
        try:
            size = int(size_s.strip(), 16)
        except ValueError:
            raise S3Error("InvalidChunkSizeError", "malformed aws-chunked chunk size", 400) from None
        if size < 0 or size > self.MAX_CHUNK:
            raise S3Error("InvalidChunkSizeError", "aws-chunked chunk size out of range", 400)
        sig = ""
        if ext:
            k, _, v = ext.strip().partition("=")
            if k.strip() == "chunk-signature":
                sig = v.strip()
        if self._verify and not sig:
            raise S3Error("SignatureDoesNotMatch", "an aws-chunked chunk lacks its chunk-signature", 403)
        data = self._exact(size) if size else memoryview(b"")
        if self._verify:
            expected = sign(self._auth.key, self._chunk_string(data))
            if not hmac.compare_digest(expected, sig):
                raise S3Error(
                    "SignatureDoesNotMatch", "The chunk signature we calculated does not match the one you provided.", 403
                )
            self._prev = expected
        if size:
            if self._line() != "":
                raise S3Error("IncompleteBody", "an aws-chunked chunk is not followed by CRLF", 400)
            self.checks.update(data)
            self._out += data
            return True
        self._finish()
        return False

    def _finish(self) -> None:
        trailers: list[tuple[str, str]] = []
        trailer_sig = None
        if self._trailer:
            while True:
                line = self._line()
                if line == "":
                    break
                name, colon, value = line.partition(":")
                if not colon:
                    raise S3Error("MalformedTrailerError", "a trailing header is malformed", 400)
                name, value = name.strip().lower(), value.strip()
                if name == "x-amz-trailer-signature":
                    trailer_sig = value
                else:
                    trailers.append((name, value))
            if self._verify:
                if trailer_sig is None:
                    raise S3Error("SignatureDoesNotMatch", "the trailing headers lack x-amz-trailer-signature", 403)
                canon = "".join(f"{n}:{v}\n" for n, v in trailers)
                a = self._auth
                sts = (
                    f"AWS4-HMAC-SHA256-TRAILER\n{a.amz_date}\n{a.scope}\n{self._prev}\n"
                    f"{hashlib.sha256(canon.encode()).hexdigest()}"
                )
                if not hmac.compare_digest(sign(a.key, sts), trailer_sig):
                    raise S3Error(
                        "SignatureDoesNotMatch", "The trailer signature we calculated does not match the one you provided.", 403
                    )
            got = {n for n, _ in trailers}
            for want in self._trailer_names:
                if want not in got:
                    raise S3Error("MalformedTrailerError", f"the body lacks the announced trailing header {want}", 400)
            for name, value in trailers:
                if name.startswith("x-amz-checksum-"):
                    self.checks.expect_checksum(name[len("x-amz-checksum-") :], value)
        else:
            # A final CRLF closes a body without trailers.
            self._fill(2)
            if bytes(self._buf[:2]) == b"\r\n":
                del self._buf[:2]
        self._fill(1)
        if self._buf:
            raise S3Error("IncompleteBody", "data follows the final aws-chunked chunk", 400)
        self.checks.check()
        self._finished = True

    def read(self, n: int = -1) -> bytes:
        while not self._finished and (n < 0 or len(self._out) < n):
            if not self._next_chunk():
                break
        if n < 0 or n >= len(self._out):
            out, self._out = bytes(self._out), bytearray()
        else:
            out = bytes(self._out[:n])
            del self._out[:n]
        return out


# -- client side (tests, tools) -------------------------------------------------------
def presign_url(
    method: str, endpoint: str, path: str, access_key: str, secret: str, expires: int = 300,
    region: str = "us-east-1", now: float | None = None, extra_query: Sequence[tuple[str, str]] = (),
) -> str:
    """A presigned URL for ``path`` (decoded) at ``endpoint`` (``http://host:port``)."""
    now = time.time() if now is None else now
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    date = amz_date[:8]
    scope = f"{date}/{region}/s3/aws4_request"
    host = endpoint.split("://", 1)[1].split("/", 1)[0]
    query = list(extra_query) + [
        ("X-Amz-Algorithm", ALGORITHM),
        ("X-Amz-Credential", f"{access_key}/{scope}"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    uri = uri_encode_path(path)
    creq = "\n".join([method, uri, canonical_query(query), f"host:{host}\n", "host", UNSIGNED])
    sig = sign(signing_key(secret, date, region, "s3"), string_to_sign(amz_date, scope, creq))
    return f"{endpoint}{uri}?{canonical_query(query)}&X-Amz-Signature={sig}"
