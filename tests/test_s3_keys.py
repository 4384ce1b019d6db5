"""Keys as S3 allows them (issue 12): a key ending in '/' with a body, a key that is not
UTF-8, and deletes in a bucket that no longer exists."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from fabric.client.transfer import export_tree
from tests.s3_fixtures import error_code, error_status
from tests.s3_helpers import unique
from tests.test_s3_errors import code, raw, signed_headers


# -- a key ending in '/' with a body ---------------------------------------------------------
def test_slash_key_with_a_body(s3hub, s3, repo, tmp_path):
    etag = s3.put_object(Bucket=repo, Key="main/dir/", Body=b"folder body", Metadata={"m": "1"})["ETag"]
    got = s3.get_object(Bucket=repo, Key="main/dir/")
    assert got["Body"].read() == b"folder body" and got["ETag"] == etag and got["Metadata"] == {"m": "1"}
    assert s3.head_object(Bucket=repo, Key="main/dir/")["ContentLength"] == 11
    assert s3.get_object(Bucket=repo, Key="main/dir/", Range="bytes=7-")["Body"].read() == b"body"
    with pytest.raises(ClientError) as e:  # the key without its slash is another key
        s3.head_object(Bucket=repo, Key="main/dir")
    assert error_status(e) == 404
    s3.put_object(Bucket=repo, Key="main/dir/inside", Body=b"i")
    # Copies from and to such keys keep the body.
    s3.copy_object(Bucket=repo, Key="main/copy/", CopySource={"Bucket": repo, "Key": "main/dir/"})
    assert s3.get_object(Bucket=repo, Key="main/copy/")["Body"].read() == b"folder body"
    s3.copy_object(Bucket=repo, Key="main/plain", CopySource={"Bucket": repo, "Key": "main/dir/"})
    assert s3.get_object(Bucket=repo, Key="main/plain")["Body"].read() == b"folder body"
    # Empty markers are still directory markers.
    s3.put_object(Bucket=repo, Key="main/empty/", Body=b"")
    assert s3.head_object(Bucket=repo, Key="main/empty/")["ContentLength"] == 0
    # File-system views (export, the mount): the directory 'dir' shadows the body; with no
    # key below it, 'copy' is the file holding the body.
    s3hub.plane().commit(repo, "main", "slash keys")
    out = tmp_path / "out"
    result = export_tree(s3hub.plane(), repo, "main", str(out))
    assert (out / "dir" / "inside").read_bytes() == b"i"
    assert (out / "copy").read_bytes() == b"folder body"
    assert (out / "empty").is_dir()
    assert "dir" in result.shadowed
    s3.delete_object(Bucket=repo, Key="main/dir/")
    with pytest.raises(ClientError):
        s3.head_object(Bucket=repo, Key="main/dir/")
    assert s3.get_object(Bucket=repo, Key="main/dir/inside")["Body"].read() == b"i"


def test_slash_key_is_listed_with_its_size(s3, repo):
    s3.put_object(Bucket=repo, Key="main/d/", Body=b"12345")
    s3.put_object(Bucket=repo, Key="main/d/x", Body=b"x")
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=repo, Prefix="main/")["Contents"]}
    assert listed == {"main/d/": 5, "main/d/x": 1}
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/d/", Delimiter="/")
    assert [(o["Key"], o["Size"]) for o in r["Contents"]] == [("main/d/", 5), ("main/d/x", 1)]


def test_slash_key_by_multipart(s3, repo):
    key = "main/mp/"
    up = s3.create_multipart_upload(Bucket=repo, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=b"in parts")["ETag"]
    s3.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object(Bucket=repo, Key=key)["Body"].read() == b"in parts"


# -- a key that is not UTF-8 ------------------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT"])
def test_key_not_utf8_is_refused(s3hub, admin, repo, method):
    path = f"/{repo}/main/bad%FF%FE"
    h = signed_headers(s3hub, admin, method, path)
    status, _, body = raw(s3hub, method, path, b"", h)
    assert status == 400, body
    if method != "HEAD":
        assert code(body) == "InvalidURI", body
    assert s3hub.boto3(admin).list_objects_v2(Bucket=repo, Prefix="main/").get("KeyCount") == 0


# -- deletes in a bucket that no longer exists --------------------------------------------------
def test_delete_in_a_deleted_bucket_is_no_such_bucket(s3hub, s3, repo):
    s3.put_object(Bucket=repo, Key="main/a", Body=b"a")  # the gateway now knows the bucket
    s3hub.plane().delete_repo(repo)
    with pytest.raises(ClientError) as e:
        s3.delete_object(Bucket=repo, Key="main/a")
    assert error_code(e) == "NoSuchBucket" and error_status(e) == 404
    with pytest.raises(ClientError) as e:
        s3.delete_objects(Bucket=repo, Delete={"Objects": [{"Key": "main/a"}]})
    assert error_code(e) == "NoSuchBucket" and error_status(e) == 404


def test_delete_answers_for_other_tokens(s3hub, repo):
    s3hub.boto3(s3hub.token(admin=True)).put_object(Bucket=repo, Key="main/a", Body=b"a")
    elsewhere = unique("ky")
    s3hub.plane().create_repo(elsewhere)
    stranger = s3hub.boto3(s3hub.token(roles={elsewhere: "write"}))
    with pytest.raises(ClientError) as e:
        stranger.delete_object(Bucket=repo, Key="main/a")
    assert error_code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        stranger.delete_objects(Bucket=repo, Delete={"Objects": [{"Key": "main/a"}]})
    assert error_code(e) == "AccessDenied"
    gone = unique("gone")
    for call in (
        lambda: stranger.delete_object(Bucket=gone, Key="main/a"),
        lambda: stranger.delete_objects(Bucket=gone, Delete={"Objects": [{"Key": "main/a"}]}),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert error_code(e) == "NoSuchBucket"
