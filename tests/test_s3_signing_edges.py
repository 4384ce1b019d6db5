"""Signature checks on requests real clients send: query values ending in a newline, non-ASCII
user metadata, presigned URLs with expiries out of range, and OPTIONS on a presigned URL."""

from __future__ import annotations

import http.client
import re
from urllib.parse import urlsplit

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from fabric.api.s3 import sigv4
from tests.s3_helpers import REGION, Creds, S3Hub, start_s3_hub, unique

UNICODE = "ünïcødé ✓"


@pytest.fixture(scope="module")
def s3hub(tmp_path_factory) -> S3Hub:
    with start_s3_hub(tmp_path_factory.mktemp("s3edges") / "data") as h:
        yield h


@pytest.fixture(scope="module")
def admin(s3hub) -> Creds:
    return s3hub.token(admin=True, name="edges-admin")


@pytest.fixture(scope="module")
def bucket(s3hub, admin) -> str:
    name = unique("sig")
    s3hub.boto3(admin).create_bucket(Bucket=name)
    return name


def code(body: bytes) -> str:
    m = re.search(rb"<Code>([^<]+)</Code>", body)
    return m.group(1).decode() if m else ""


def send_utf8(s3hub: S3Hub, creds: Creds, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict[str, bytes], bytes]:
    """Sign with botocore (over the text of each header), then send every header as UTF-8
    bytes, as the Go, Java and JavaScript SDKs do."""
    req = AWSRequest(method=method, url=s3hub.s3_url + path, data=body, headers=dict(headers))
    S3SigV4Auth(Credentials(creds.access_key, creds.secret_key), "s3", REGION).add_auth(req)
    u = urlsplit(s3hub.s3_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in req.headers.items():
            conn.putheader(k, v.encode("utf-8") if isinstance(v, str) else v)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, {k.lower(): v.encode("latin-1") for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


# -- query values ending in a newline ---------------------------------------------------------
def test_header_signed_query_value_ending_in_newline(s3hub, admin, bucket):
    s3 = s3hub.boto3(admin)
    s3.put_object(Bucket=bucket, Key="n.txt", Body=b"n")
    out = s3.list_objects_v2(Bucket=bucket, Prefix="n.txt\n")
    assert out["KeyCount"] == 0


def test_presigned_query_value_ending_in_newline(s3hub, admin, bucket):
    s3 = s3hub.boto3(admin, signature_version="s3v4")
    s3.put_object(Bucket=bucket, Key="p.txt", Body=b"p")
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "p.txt", "ResponseContentDisposition": "inline\n"}
    )
    assert "%0A" in url
    r = httpx.get(url)
    assert r.status_code == 200, r.text
    assert r.content == b"p"


def test_newline_is_escaped_in_the_canonical_forms():
    assert sigv4.canonical_query([("a", "x\n")]) == "a=x%0A"
    assert sigv4.uri_encode_path("/b/k\n") == "/b/k%0A"


# -- non-ASCII user metadata --------------------------------------------------------------------
def test_utf8_metadata_on_the_wire_verifies_and_comes_back(s3hub, admin, bucket):
    status, _, body = send_utf8(s3hub, admin, "PUT", f"/{bucket}/u.txt", {"x-amz-meta-k": UNICODE}, b"u")
    assert status == 200, body
    status, headers, _ = send_utf8(s3hub, admin, "HEAD", f"/{bucket}/u.txt", {})
    assert status == 200
    assert headers["x-amz-meta-k"].decode("utf-8") == UNICODE


def test_boto3_non_ascii_metadata_verifies(s3hub, admin, bucket):
    """boto3 refuses non-ASCII metadata unless its check is removed; then it sends the value
    as Latin-1 and signs its UTF-8 form: that verifies too."""
    s3 = s3hub.boto3(admin)
    s3.meta.events.unregister("before-parameter-build.s3.PutObject", _ascii_check(s3))
    s3.put_object(Bucket=bucket, Key="b.txt", Body=b"b", Metadata={"k": "ünïcødé"})
    assert s3.get_object(Bucket=bucket, Key="b.txt")["Body"].read() == b"b"


def _ascii_check(s3):
    from botocore.handlers import validate_ascii_metadata

    return validate_ascii_metadata


# -- presigned URL expiries ------------------------------------------------------------------
@pytest.mark.parametrize("expires", [0, -7, 604801])
def test_presigned_expiry_out_of_range_is_access_denied(s3hub, admin, bucket, expires):
    s3hub.boto3(admin).put_object(Bucket=bucket, Key="e.txt", Body=b"e")
    url = sigv4.presign_url("GET", s3hub.s3_url, f"/{bucket}/e.txt", admin.access_key, admin.secret_key, expires=expires)
    r = httpx.get(url)
    assert (r.status_code, code(r.content)) == (403, "AccessDenied")


def test_presigned_expiry_of_seven_days_is_accepted(s3hub, admin, bucket):
    s3hub.boto3(admin).put_object(Bucket=bucket, Key="w.txt", Body=b"w")
    url = sigv4.presign_url("GET", s3hub.s3_url, f"/{bucket}/w.txt", admin.access_key, admin.secret_key, expires=604800)
    assert httpx.get(url).content == b"w"


# -- OPTIONS ------------------------------------------------------------------------------------
def test_options_on_a_presigned_url(s3hub, admin, bucket):
    s3 = s3hub.boto3(admin, signature_version="s3v4")
    s3.put_object(Bucket=bucket, Key="o.txt", Body=b"o")
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "o.txt"})
    r = httpx.options(url)
    assert (r.status_code, code(r.content)) == (400, "BadRequest")
    assert b"Origin" in r.content
    r = httpx.options(url, headers={"Origin": "https://app.example"})
    assert (r.status_code, code(r.content)) == (400, "BadRequest")
    r = httpx.options(url, headers={"Origin": "https://app.example", "Access-Control-Request-Method": "PUT"})
    assert (r.status_code, code(r.content)) == (403, "AccessForbidden")
    assert "access-control-allow-origin" not in r.headers
    assert s3.get_object(Bucket=bucket, Key="o.txt")["Body"].read() == b"o"
