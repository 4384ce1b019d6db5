"""Conditional writes (issue 12): ``If-None-Match`` with an ETag and ``If-Match`` on PutObject and
on CompleteMultipartUpload answer 412 PreconditionFailed when they fail, and write when they hold."""

from __future__ import annotations

import os

import pytest
from botocore.exceptions import ClientError

from tests.s3_fixtures import error_code, error_status, racing_conditional_puts

MiB = 1024 * 1024


def _body(s3, repo: str, key: str) -> bytes:
    return s3.get_object(Bucket=repo, Key=key)["Body"].read()


def test_put_if_none_match_with_an_etag(s3, repo):
    key = "main/k"
    # Absent key: any ETag "does not match", so the write goes ahead.
    s3.put_object(Bucket=repo, Key=key, Body=b"one", IfNoneMatch='"0123456789abcdef0123456789abcdef"')
    current = s3.head_object(Bucket=repo, Key=key)["ETag"]
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key=key, Body=b"two", IfNoneMatch=current)
    assert error_code(e) == "PreconditionFailed" and error_status(e) == 412
    assert _body(s3, repo, key) == b"one"
    s3.put_object(Bucket=repo, Key=key, Body=b"two", IfNoneMatch='"ffffffffffffffffffffffffffffffff"')
    assert _body(s3, repo, key) == b"two"


def test_put_if_match(s3, repo):
    key = "main/m"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key=key, Body=b"x", IfMatch='"00"')
    assert error_code(e) == "NoSuchKey" and error_status(e) == 404
    etag = s3.put_object(Bucket=repo, Key=key, Body=b"one")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key=key, Body=b"stale", IfMatch='"00"')
    assert error_code(e) == "PreconditionFailed" and error_status(e) == 412
    new = s3.put_object(Bucket=repo, Key=key, Body=b"two", IfMatch=etag)["ETag"]
    assert _body(s3, repo, key) == b"two"
    # Racing compare-and-swap writers on one ETag: exactly one wins.
    assert racing_conditional_puts(s3, repo, key, IfMatch=new) == 1


def _upload(s3, repo: str, key: str) -> tuple[str, list[dict]]:
    up = s3.create_multipart_upload(Bucket=repo, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=b"part")["ETag"]
    return up, [{"PartNumber": 1, "ETag": etag}]


def test_complete_multipart_conditions(s3, repo):
    key = "main/mp"
    first = s3.put_object(Bucket=repo, Key=key, Body=b"before")["ETag"]
    up, parts = _upload(s3, repo, key)
    for cond in ({"IfNoneMatch": "*"}, {"IfNoneMatch": first}, {"IfMatch": '"00"'}):
        with pytest.raises(ClientError) as e:
            s3.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": parts}, **cond)
        assert error_code(e) == "PreconditionFailed" and error_status(e) == 412, cond
        assert _body(s3, repo, key) == b"before"
    # The upload is still there: completing it when the condition holds works.
    s3.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": parts}, IfMatch=first)
    assert _body(s3, repo, key) == b"part"
    up, parts = _upload(s3, repo, "main/fresh")
    s3.complete_multipart_upload(Bucket=repo, Key="main/fresh", UploadId=up, MultipartUpload={"Parts": parts},
                                 IfNoneMatch='"ffffffffffffffffffffffffffffffff"')
    assert _body(s3, repo, "main/fresh") == b"part"
    up, parts = _upload(s3, repo, "main/fresh")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=repo, Key="main/fresh", UploadId=up, MultipartUpload={"Parts": parts},
                                     IfNoneMatch="*")
    assert error_code(e) == "PreconditionFailed"


def test_failed_condition_reads_no_body(s3, repo):
    """A failing condition is answered before the body is stored (nothing is written)."""
    s3.put_object(Bucket=repo, Key="main/big", Body=b"small")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key="main/big", Body=os.urandom(2 * MiB), IfNoneMatch="*")
    assert error_code(e) == "PreconditionFailed"
    assert _body(s3, repo, "main/big") == b"small"
