"""Signature V4 checking, unit level: AWS's published examples and the aws-chunked decoder."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import zlib

import pytest

from fabric.api.s3 import sigv4
from fabric.api.s3.errors import S3Error
from fabric.api.s3.multipart import multipart_etag

# The example of "Signature Calculations for the Authorization Header: Transferring
# Payload in Multiple Chunks" in the Amazon S3 API reference.
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
CHUNK_SIGS = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
]
SIGNED = "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class"


def aws_example(signature: str = SEED) -> sigv4.SignedRequest:
    headers = {
        "host": "s3.amazonaws.com",
        "x-amz-date": "20130524T000000Z",
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
        "x-amz-content-sha256": sigv4.STREAMING_SIGNED,
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": "66560",
        "content-length": "66824",
        "authorization": (
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            f"SignedHeaders={SIGNED},Signature={signature}"
        ),
    }
    return sigv4.SignedRequest("PUT", "/examplebucket/chunkObject.txt", "/examplebucket/chunkObject.txt", [], headers)


NOW = 1369353600.0  # 2013-05-24T00:00:00Z


def secrets(key: str) -> tuple[str, str]:
    if key != "AKIAIOSFODNN7EXAMPLE":
        raise KeyError(key)
    return "principal", SECRET


lookup = sigv4.secret_keys(secrets)


def example_body(sigs: list[str] = CHUNK_SIGS) -> bytes:
    return (
        f"10000;chunk-signature={sigs[0]}\r\n".encode() + b"a" * 65536 + b"\r\n"
        + f"400;chunk-signature={sigs[1]}\r\n".encode() + b"a" * 1024 + b"\r\n"
        + f"0;chunk-signature={sigs[2]}\r\n\r\n".encode()
    )


def test_seed_and_chunk_signatures_of_the_aws_example():
    auth = sigv4.verify_header(aws_example(), lookup, now=NOW)
    assert auth.principal == "principal" and auth.payload == sigv4.STREAMING_SIGNED
    body = example_body()
    assert len(body) == 66824
    checks = sigv4.BodyChecks.from_headers(aws_example().headers, auth.payload)
    checks.length = 66560
    assert sigv4.ChunkedBody(io.BytesIO(body), auth, checks).read() == b"a" * 66560


def test_a_wrong_seed_or_chunk_signature_is_refused():
    with pytest.raises(S3Error) as e:
        sigv4.verify_header(aws_example("0" * 64), lookup, now=NOW)
    assert e.value.code == "SignatureDoesNotMatch"
    auth = sigv4.verify_header(aws_example(), lookup, now=NOW)
    for i in range(3):
        sigs = list(CHUNK_SIGS)
        sigs[i] = "f" * 64
        body = sigv4.ChunkedBody(io.BytesIO(example_body(sigs)), auth, sigv4.BodyChecks())
        with pytest.raises(S3Error) as e:
            while body.read(4096):
                pass
        assert e.value.code == "SignatureDoesNotMatch"
    # Reordered chunks break the chain too.
    swapped = example_body().replace(b"a" * 1024, b"b" * 1024)
    with pytest.raises(S3Error):
        sigv4.ChunkedBody(io.BytesIO(swapped), auth, sigv4.BodyChecks()).read()


def test_clock_skew_unknown_key_and_malformed_headers():
    with pytest.raises(S3Error) as e:
        sigv4.verify_header(aws_example(), lookup, now=NOW + 3600)
    assert e.value.code == "RequestTimeTooSkewed"
    req = aws_example()
    req.headers["authorization"] = req.headers["authorization"].replace("AKIAIOSFODNN7EXAMPLE", "AKIAOTHER")
    with pytest.raises(S3Error) as e:
        sigv4.verify_header(req, lookup, now=NOW)
    assert e.value.code == "InvalidAccessKeyId"
    req.headers["authorization"] = "AWS4-HMAC-SHA256 Credential=x"
    with pytest.raises(S3Error) as e:
        sigv4.verify_header(req, lookup, now=NOW)
    assert e.value.code == "AuthorizationHeaderMalformed"
    req = aws_example()
    del req.headers["x-amz-content-sha256"]
    with pytest.raises(S3Error) as e:
        sigv4.verify_header(req, lookup, now=NOW)
    assert e.value.code in ("InvalidRequest", "SignatureDoesNotMatch")


def _trailer_body(data: bytes, auth: sigv4.AuthResult, crc: str, signed: bool) -> bytes:
    key = auth.key
    prev = auth.signature
    out = []
    for piece in (data, b""):
        sig = ""
        if signed:
            sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", auth.amz_date, auth.scope, prev, hashlib.sha256(b"").hexdigest(),
                             hashlib.sha256(piece).hexdigest()])
            prev = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
            sig = f";chunk-signature={prev}"
        out.append(f"{len(piece):x}{sig}\r\n".encode() + piece + (b"\r\n" if piece else b""))
    trailer = f"x-amz-checksum-crc32:{crc}\n"
    out.append(trailer.replace("\n", "\r\n").encode())
    if signed:
        sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", auth.amz_date, auth.scope, prev, hashlib.sha256(trailer.encode()).hexdigest()])
        out.append(f"x-amz-trailer-signature:{hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()}\r\n".encode())
    out.append(b"\r\n")
    return b"".join(out)


@pytest.mark.parametrize("signed", [True, False])
def test_trailing_checksums(signed):
    data = b"0123456789" * 5000
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    mode = sigv4.STREAMING_SIGNED_TRAILER if signed else sigv4.STREAMING_UNSIGNED_TRAILER
    key = sigv4.signing_key(SECRET, "20130524", "us-east-1", "s3")
    auth = sigv4.AuthResult("p", "AK", mode, SEED, key, "20130524T000000Z", "20130524/us-east-1/s3/aws4_request")
    body = _trailer_body(data, auth, crc, signed)
    got = sigv4.ChunkedBody(io.BytesIO(body), auth, sigv4.BodyChecks(), ["x-amz-checksum-crc32"]).read()
    assert got == data
    bad = _trailer_body(data, auth, base64.b64encode(b"\0\0\0\1").decode(), signed)
    with pytest.raises(S3Error) as e:
        sigv4.ChunkedBody(io.BytesIO(bad), auth, sigv4.BodyChecks(), ["x-amz-checksum-crc32"]).read()
    assert e.value.code == "BadDigest"
    if signed:
        i = body.index(b"x-amz-trailer-signature:") + len(b"x-amz-trailer-signature:")
        tampered = body[:i] + (b"0" if body[i : i + 1] != b"0" else b"1") + body[i + 1 :]
        with pytest.raises(S3Error) as e:
            sigv4.ChunkedBody(io.BytesIO(tampered), auth, sigv4.BodyChecks(), ["x-amz-checksum-crc32"]).read()
        assert e.value.code == "SignatureDoesNotMatch"
    missing = body.split(b"x-amz-checksum-crc32")[0] + b"\r\n"
    with pytest.raises(S3Error):
        sigv4.ChunkedBody(io.BytesIO(missing), auth, sigv4.BodyChecks(), ["x-amz-checksum-crc32"]).read()


def test_verified_body_checks_sha256_md5_and_checksums_at_the_end():
    data = b"hello world"
    h = {
        "content-md5": base64.b64encode(hashlib.md5(data).digest()).decode(),
        "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
        "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode(),
    }
    ok = sigv4.VerifiedBody(io.BytesIO(data), sigv4.BodyChecks.from_headers(h, hashlib.sha256(data).hexdigest()))
    assert ok.read(5) + ok.read() == data
    for name, value in [("content-md5", base64.b64encode(b"x" * 16).decode()), ("x-amz-checksum-crc32", "AAAAAA==")]:
        body = sigv4.VerifiedBody(io.BytesIO(data), sigv4.BodyChecks.from_headers({**h, name: value}, sigv4.UNSIGNED))
        with pytest.raises(S3Error) as e:
            while body.read(4):
                pass
        assert e.value.code == "BadDigest"
    body = sigv4.VerifiedBody(io.BytesIO(data), sigv4.BodyChecks.from_headers({}, hashlib.sha256(b"other").hexdigest()))
    with pytest.raises(S3Error) as e:
        body.read()
    assert e.value.code == "XAmzContentSHA256Mismatch"


def test_presigned_v4_round_trip_and_expiry():
    url = sigv4.presign_url("GET", "http://127.0.0.1:9000", "/bucket/main/a b+c.txt", "AKIAIOSFODNN7EXAMPLE", SECRET,
                            expires=60, now=NOW)
    from urllib.parse import urlsplit

    u = urlsplit(url)
    from urllib.parse import unquote

    req = sigv4.SignedRequest("GET", u.path, unquote(u.path), sigv4.parse_query(u.query), {"host": "127.0.0.1:9000"})
    assert sigv4.verify_presigned(req, lookup, now=NOW + 30).presigned
    with pytest.raises(S3Error) as e:
        sigv4.verify_presigned(req, lookup, now=NOW + 61)
    assert e.value.code == "AccessDenied" and "expired" in e.value.message
    req.headers["host"] = "evil.example:9000"
    with pytest.raises(S3Error) as e:
        sigv4.verify_presigned(req, lookup, now=NOW + 30)
    assert e.value.code == "SignatureDoesNotMatch"


def test_multipart_etag_convention():
    parts = [b"a" * 10, b"b" * 20]
    md5s = [hashlib.md5(p).hexdigest() for p in parts]
    assert multipart_etag(md5s) == hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-2"
