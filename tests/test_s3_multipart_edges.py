"""Multipart edge cases as AWS answers them (issue 12): completing twice, reading one part
(``partNumber``), and a part uploaded twice."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from botocore.exceptions import ClientError

from fabric.api.s3.multipart import Uploads
from tests.s3_fixtures import error_code, error_status

MiB = 1024 * 1024


def _multipart(s3, repo: str, key: str, bodies: list[bytes]) -> tuple[str, str, list[dict]]:
    up = s3.create_multipart_upload(Bucket=repo, Key=key, Metadata={"who": "me"})["UploadId"]
    parts = [
        {"PartNumber": n, "ETag": s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=n, Body=b)["ETag"]}
        for n, b in enumerate(bodies, 1)
    ]
    etag = s3.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": parts})["ETag"]
    return up, etag, parts


def test_completing_twice_answers_the_same_etag(s3, repo):
    key = "main/twice.bin"
    p1, p2 = os.urandom(5 * MiB), b"end"
    up, etag, parts = _multipart(s3, repo, key, [p1, p2])
    again = s3.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": parts})
    assert again["ETag"] == etag and again["Key"] == key
    assert s3.get_object(Bucket=repo, Key=key)["Body"].read() == p1 + p2
    # Another key, or the key holding another object since: the upload is gone.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=repo, Key="main/other", UploadId=up, MultipartUpload={"Parts": parts})
    assert error_code(e) == "NoSuchUpload"
    s3.put_object(Bucket=repo, Key=key, Body=b"replaced")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": parts})
    assert error_code(e) == "NoSuchUpload" and error_status(e) == 404
    # Aborting a completed upload is still NoSuchUpload, as in S3.
    with pytest.raises(ClientError) as e:
        s3.abort_multipart_upload(Bucket=repo, Key=key, UploadId=up)
    assert error_code(e) == "NoSuchUpload"


def test_completed_records_expire(tmp_path):
    uploads = Uploads(str(tmp_path))
    try:
        up = uploads.get(uploads.create("b", "k", "r", "main", "k", {}, "me"))
        uploads.complete(up, "e-1", 7)
        assert uploads.get(up.id) is None and uploads.completed(up.id).etag == "e-1"
        later = time.time() + 24 * 3600 + 1
        assert uploads.completed(up.id, later) is None
        assert uploads.prune_completed(later) == 1 and uploads.completed(up.id) is None
    finally:
        uploads.close()


def test_get_and_head_one_part(s3hub, s3, repo):
    key = "main/parts.bin"
    bodies = [os.urandom(5 * MiB), os.urandom(5 * MiB + 7), b"tail-part"]
    _, etag, _ = _multipart(s3, repo, key, bodies)
    total = sum(len(b) for b in bodies)
    start = 0
    for n, body in enumerate(bodies, 1):
        r = s3.get_object(Bucket=repo, Key=key, PartNumber=n)
        assert r["Body"].read() == body
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert r["ContentRange"] == f"bytes {start}-{start + len(body) - 1}/{total}"
        assert r["PartsCount"] == 3 and r["ETag"] == etag and r["ContentLength"] == len(body)
        h = s3.head_object(Bucket=repo, Key=key, PartNumber=n)
        assert h["ContentLength"] == len(body) and h["PartsCount"] == 3
        start += len(body)
    assert "PartsCount" not in s3.head_object(Bucket=repo, Key=key)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key=key, PartNumber=4)
    assert error_code(e) == "InvalidPartNumber" and error_status(e) == 416
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key=key, PartNumber=1, Range="bytes=0-1")
    assert error_status(e) == 400
    # The part boundaries survive a commit and a copy, and are no user metadata.
    s3hub.plane().commit(repo, "main", "parts")
    s3.copy_object(Bucket=repo, Key="main/copy.bin", CopySource={"Bucket": repo, "Key": key},
                   MetadataDirective="REPLACE", Metadata={"new": "1"})
    r = s3.get_object(Bucket=repo, Key="main/copy.bin", PartNumber=2)
    assert r["Body"].read() == bodies[1] and r["PartsCount"] == 3
    assert r["Metadata"] == {"new": "1"}
    assert s3.head_object(Bucket=repo, Key=key)["Metadata"] == {"who": "me"}


def test_part_number_of_a_single_part_object(s3, repo):
    s3.put_object(Bucket=repo, Key="main/single", Body=b"0123456789")
    r = s3.get_object(Bucket=repo, Key="main/single", PartNumber=1)
    assert r["Body"].read() == b"0123456789" and r["ContentRange"] == "bytes 0-9/10"
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206 and "PartsCount" not in r
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=repo, Key="main/single", PartNumber=2)
    assert error_status(e) == 416
    for bad in (0, 10001):
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=repo, Key="main/single", PartNumber=bad)
        assert error_code(e) == "InvalidArgument" and error_status(e) == 400


def test_a_part_uploaded_twice_takes_the_last_upload(s3, repo):
    """ceph's test_multipart_resend_first_finishes_last: part 1 is sent twice and named twice
    in the list; the object is the last upload of the part."""
    key = "main/resend"
    up = s3.create_multipart_upload(Bucket=repo, Key=key)["UploadId"]
    first = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=b"B" * 8)["ETag"]
    last = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=b"A" * 8)["ETag"]
    done = s3.complete_multipart_upload(
        Bucket=repo, Key=key, UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": first}, {"PartNumber": 1, "ETag": last}]},
    )
    assert s3.get_object(Bucket=repo, Key=key)["Body"].read() == b"A" * 8
    assert done["ETag"] == f'"{hashlib.md5(hashlib.md5(b"A" * 8).digest()).hexdigest()}-1"'
    # The last mention of a number must name its last upload; a descending list is refused.
    up = s3.create_multipart_upload(Bucket=repo, Key=key)["UploadId"]
    first = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=b"B" * 8)["ETag"]
    last = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=b"A" * 8)["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=repo, Key=key, UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": last}, {"PartNumber": 1, "ETag": first}]},
        )
    assert error_code(e) == "InvalidPart"
    two = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=2, Body=b"2")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=repo, Key=key, UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": two}, {"PartNumber": 1, "ETag": last}]},
        )
    assert error_code(e) == "InvalidPartOrder"
