"""The S3 API with boto3 against a real hub's S3 listener: every operation of issue 6."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import os
import time
from email.utils import formatdate

import boto3.s3.transfer
import httpx
import pytest
from botocore.exceptions import ClientError

from tests.s3_fixtures import error_code, error_status, racing_conditional_puts
from tests.s3_helpers import S3Hub, staged_paths, start_s3_hub, unique

MiB = 1024 * 1024


def _repo(s3hub: S3Hub, name: str | None = None) -> str:
    name = name or unique("r")
    s3hub.plane().create_repo(name)
    return name


# -- buckets ---------------------------------------------------------------------------
def test_list_head_location_of_buckets(s3hub, s3):
    repo = _repo(s3hub)
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert repo in names
    s3.head_bucket(Bucket=repo)
    assert s3.get_bucket_location(Bucket=repo)["LocationConstraint"] in (None, "")
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket="no-such-bucket-here")
    assert error_status(e) == 404
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="no-such-bucket-here")
    assert error_code(e) == "NoSuchBucket"


def test_reader_sees_only_its_repositories(s3hub, admin):
    mine, other = _repo(s3hub), _repo(s3hub)
    reader = s3hub.boto3(s3hub.token(roles={mine: "read"}))
    names = [b["Name"] for b in reader.list_buckets()["Buckets"]]
    assert mine in names and other not in names
    with pytest.raises(ClientError) as e:
        reader.list_objects_v2(Bucket=other, Prefix="main/")
    assert error_code(e) == "AccessDenied"
    s3hub.boto3(admin).put_object(Bucket=mine, Key="main/f.txt", Body=b"x")
    assert reader.get_object(Bucket=mine, Key="main/f.txt")["Body"].read() == b"x"
    with pytest.raises(ClientError) as e:
        reader.put_object(Bucket=mine, Key="main/g.txt", Body=b"y")
    assert error_code(e) == "AccessDenied"
    assert staged_paths(s3hub, mine) == ["f.txt"]


def test_create_bucket_put_get_at_once_and_delete_only_when_empty(s3hub, s3, admin):
    name = unique("cb")
    s3.create_bucket(Bucket=name)
    # Yours already: 200 in us-east-1, BucketAlreadyOwnedByYou when another region is asked for (issue 12).
    assert s3.create_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert error_code(e) == "BucketAlreadyOwnedByYou"
    # Plain keys: the bucket is bound to the new repository's default branch.
    s3.put_object(Bucket=name, Key="data/a.bin", Body=b"abc")
    assert s3.get_object(Bucket=name, Key="data/a.bin")["Body"].read() == b"abc"
    assert s3hub.plane().read(name, "main", "data/a.bin") == b"abc"
    bindings = {b["name"]: b for b in s3hub.plane().list_buckets()}
    assert bindings[name]["repo"] == name and bindings[name]["ref"] == "main" and bindings[name]["created_by_s3"]
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=name)
    assert error_code(e) == "BucketNotEmpty"
    s3.delete_object(Bucket=name, Key="data/a.bin")
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert error_status(e) == 404
    assert name not in [r["name"] for r in s3hub.plane().list_repos()]
    # A token that may not create repositories cannot create buckets.
    writer = s3hub.boto3(s3hub.token(roles={"*": "write"}))
    with pytest.raises(ClientError) as e:
        writer.create_bucket(Bucket=unique("cb"))
    assert error_code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="Bad_Name")
    assert error_code(e) == "InvalidBucketName"


def test_bucket_bound_to_a_branch_and_to_a_tag(s3hub, s3):
    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/x/1.txt", Body=b"one")
    plane = s3hub.plane()
    plane.commit(repo, "main", "first")
    plane.create_tag(repo, "v1", "main")
    live, frozen = unique("live"), unique("frozen")
    plane.create_bucket(live, repo, "main")
    plane.create_bucket(frozen, repo, "v1")
    s3.put_object(Bucket=live, Key="x/2.txt", Body=b"two")
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=live)["Contents"]) == ["x/1.txt", "x/2.txt"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=frozen)["Contents"]] == ["x/1.txt"]
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=frozen, Key="x/3.txt", Body=b"three")
    assert error_code(e) == "AccessDenied"
    assert "branch" in e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=live)  # bound with `fabric bucket create`: not S3's to delete
    assert error_code(e) == "AccessDenied"


# -- objects ----------------------------------------------------------------------------
def test_put_get_head_etag_metadata(s3hub, s3):
    repo = _repo(s3hub)
    data = os.urandom(300_000)
    before = time.time()
    put = s3.put_object(
        Bucket=repo, Key="main/dir/file.bin", Body=data, Metadata={"Owner": "alice", "n": "1"}, ContentType="image/png"
    )
    md5 = hashlib.md5(data).hexdigest()
    assert put["ETag"] == f'"{md5}"'
    got = s3.get_object(Bucket=repo, Key="main/dir/file.bin")
    assert got["Body"].read() == data
    assert got["ETag"] == f'"{md5}"' and got["ContentLength"] == len(data)
    assert got["Metadata"] == {"owner": "alice", "n": "1"}
    assert got["ContentType"] == "image/png"
    assert before - 2 <= got["LastModified"].timestamp() <= time.time() + 2
    head = s3.head_object(Bucket=repo, Key="main/dir/file.bin")
    assert head["ContentLength"] == len(data) and head["ETag"] == f'"{md5}"'
    assert head["Metadata"]["owner"] == "alice"
    # Empty objects, and the default content type.
    s3.put_object(Bucket=repo, Key="main/empty", Body=b"")
    e = s3.get_object(Bucket=repo, Key="main/empty")
    assert e["Body"].read() == b"" and e["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=repo, Key="main/missing")
    assert error_code(exc) == "NoSuchKey"
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=repo, Key="main/missing")
    assert error_status(exc) == 404
    for absent in ("main/", "main", "main/dir/../dir/file.bin", "main//x"):  # keys no path can have: just absent
        with pytest.raises(ClientError) as exc:
            s3.head_object(Bucket=repo, Key=absent)
        assert error_status(exc) == 404, absent


def test_large_object_streams(s3hub, s3):
    repo = _repo(s3hub)
    data = os.urandom(6 * MiB + 123)
    s3.put_object(Bucket=repo, Key="main/big", Body=data)
    assert s3.get_object(Bucket=repo, Key="main/big")["Body"].read() == data
    r = s3.get_object(Bucket=repo, Key="main/big", Range="bytes=1000000-5999999")
    assert r["Body"].read() == data[1000000:6000000]


def test_content_md5_is_checked(s3hub, s3):
    import base64

    repo = _repo(s3hub)
    good = base64.b64encode(hashlib.md5(b"payload").digest()).decode()
    s3.put_object(Bucket=repo, Key="main/ok", Body=b"payload", ContentMD5=good)
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key="main/bad", Body=b"payload", ContentMD5=bad)
    assert error_code(e) == "BadDigest"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key="main/bad", Body=b"payload", ContentMD5="notbase64")
    assert error_code(e) == "InvalidDigest"
    assert staged_paths(s3hub, repo) == ["ok"]


def test_range_requests(s3hub, s3):
    repo = _repo(s3hub)
    data = bytes(range(256)) * 40
    s3.put_object(Bucket=repo, Key="main/r", Body=data)
    r = s3.get_object(Bucket=repo, Key="main/r", Range="bytes=10-19")
    assert r["Body"].read() == data[10:20]
    assert r["ContentRange"] == f"bytes 10-19/{len(data)}" and r["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert s3.get_object(Bucket=repo, Key="main/r", Range="bytes=-5")["Body"].read() == data[-5:]
    assert s3.get_object(Bucket=repo, Key="main/r", Range="bytes=10000-")["Body"].read() == data[10000:]
    assert s3.get_object(Bucket=repo, Key="main/r", Range="bytes=10230-99999")["Body"].read() == data[10230:]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key="main/r", Range=f"bytes={len(data)}-")
    assert error_code(e) == "InvalidRange" and error_status(e) == 416


def test_conditional_get(s3hub, s3):
    repo = _repo(s3hub)
    etag = s3.put_object(Bucket=repo, Key="main/c", Body=b"cond")["ETag"]
    assert s3.get_object(Bucket=repo, Key="main/c", IfMatch=etag)["Body"].read() == b"cond"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key="main/c", IfMatch='"0123"')
    assert error_code(e) == "PreconditionFailed" and error_status(e) == 412
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key="main/c", IfNoneMatch=etag)
    assert error_status(e) == 304
    assert s3.get_object(Bucket=repo, Key="main/c", IfNoneMatch='"other"')["Body"].read() == b"cond"
    future = formatdate(time.time() + 3600, usegmt=True)
    past = formatdate(time.time() - 3600, usegmt=True)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key="main/c", IfModifiedSince=future)
    assert error_status(e) == 304
    assert s3.get_object(Bucket=repo, Key="main/c", IfModifiedSince=past)["Body"].read() == b"cond"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=repo, Key="main/c", IfUnmodifiedSince=past)
    assert error_status(e) == 412
    assert s3.get_object(Bucket=repo, Key="main/c", IfUnmodifiedSince=future)["Body"].read() == b"cond"
    # If-Match true wins over a failing If-Unmodified-Since (S3's rule).
    assert s3.get_object(Bucket=repo, Key="main/c", IfMatch=etag, IfUnmodifiedSince=past)["Body"].read() == b"cond"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=repo, Key="main/c", IfNoneMatch=etag)
    assert error_status(e) == 304


def test_conditional_put(s3hub, s3):
    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/once", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key="main/once", Body=b"second", IfNoneMatch="*")
    assert error_code(e) == "PreconditionFailed"
    assert s3.get_object(Bucket=repo, Key="main/once")["Body"].read() == b"first"
    # If-Match on a write: replace only the version the writer read.
    etag = s3.head_object(Bucket=repo, Key="main/once")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=repo, Key="main/once", Body=b"stale", IfMatch='"0000"')
    assert error_code(e) == "PreconditionFailed"
    s3.put_object(Bucket=repo, Key="main/once", Body=b"second", IfMatch=etag)
    assert s3.get_object(Bucket=repo, Key="main/once")["Body"].read() == b"second"
    # Racing writers: exactly one wins.
    assert racing_conditional_puts(s3, repo, "main/race", IfNoneMatch="*") == 1


def test_writes_to_tags_and_commits_are_refused(s3hub, s3):
    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/a", Body=b"a")
    commit = s3hub.plane().commit(repo, "main", "c1")
    s3hub.plane().create_tag(repo, "v1", "main")
    for ref in ("v1", commit.id, commit.id[:12], "nosuchbranch"):
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=repo, Key=f"{ref}/b", Body=b"b")
        assert error_code(e) == "AccessDenied", ref
        assert "branch" in e.value.response["Error"]["Message"]
        with pytest.raises(ClientError) as e:
            s3.delete_object(Bucket=repo, Key=f"{ref}/a")
        assert error_code(e) == "AccessDenied"
    # Reads at a tag and at a commit id work.
    assert s3.get_object(Bucket=repo, Key="v1/a")["Body"].read() == b"a"
    assert s3.get_object(Bucket=repo, Key=f"{commit.id}/a")["Body"].read() == b"a"
    assert staged_paths(s3hub, repo) == []


def test_delete_object_and_objects(s3hub, s3):
    repo = _repo(s3hub)
    for k in ("a", "b", "c", "d/e"):
        s3.put_object(Bucket=repo, Key=f"main/{k}", Body=k.encode())
    s3.delete_object(Bucket=repo, Key="main/a")
    s3.delete_object(Bucket=repo, Key="main/never-existed")  # idempotent, as in S3
    with pytest.raises(ClientError):
        s3.head_object(Bucket=repo, Key="main/a")
    r = s3.delete_objects(
        Bucket=repo,
        Delete={"Objects": [{"Key": "main/b"}, {"Key": "main/d/e"}, {"Key": "main/x/../c"}, {"Key": "v9/zzz"}]},
    )
    assert sorted(d["Key"] for d in r["Deleted"]) == ["main/b", "main/d/e"]
    errors = {e["Key"]: e["Code"] for e in r["Errors"]}
    assert errors == {"main/x/../c": "InvalidArgument", "v9/zzz": "AccessDenied"}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=repo, Prefix="main/").get("Contents", [])]
    assert keys == ["main/c"]
    r = s3.delete_objects(Bucket=repo, Delete={"Objects": [{"Key": "main/c"}], "Quiet": True})
    assert "Deleted" not in r and "Errors" not in r


def test_copy_object_within_and_across_refs(s3hub, s3):
    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/src.txt", Body=b"source", Metadata={"k": "v"}, ContentType="text/plain")
    s3hub.plane().create_branch(repo, "dev", "main")
    r = s3.copy_object(Bucket=repo, Key="main/copy.txt", CopySource={"Bucket": repo, "Key": "main/src.txt"})
    assert r["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(b"source").hexdigest()}"'
    got = s3.get_object(Bucket=repo, Key="main/copy.txt")
    assert got["Body"].read() == b"source" and got["Metadata"] == {"k": "v"} and got["ContentType"] == "text/plain"
    # Across refs: from main (uncommitted, staged) to branch dev, replacing the metadata.
    s3.copy_object(
        Bucket=repo, Key="dev/moved.txt", CopySource=f"{repo}/main/src.txt", MetadataDirective="REPLACE", Metadata={"new": "1"}
    )
    got = s3.get_object(Bucket=repo, Key="dev/moved.txt")
    assert got["Body"].read() == b"source" and got["Metadata"] == {"new": "1"}
    # From a tag to a branch; to a tag is refused.
    s3hub.plane().commit(repo, "main", "c")
    s3hub.plane().create_tag(repo, "v1", "main")
    s3.copy_object(Bucket=repo, Key="dev/from-tag.txt", CopySource={"Bucket": repo, "Key": "v1/src.txt"})
    assert s3.get_object(Bucket=repo, Key="dev/from-tag.txt")["Body"].read() == b"source"
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=repo, Key="v1/nope.txt", CopySource={"Bucket": repo, "Key": "main/src.txt"})
    assert error_code(e) == "AccessDenied"
    # Copy onto itself without changing metadata is illegal (S3 rule); with REPLACE it is fine.
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=repo, Key="main/src.txt", CopySource={"Bucket": repo, "Key": "main/src.txt"})
    assert error_code(e) == "InvalidRequest"
    s3.copy_object(
        Bucket=repo, Key="main/src.txt", CopySource={"Bucket": repo, "Key": "main/src.txt"}, MetadataDirective="REPLACE",
        Metadata={"touched": "yes"},
    )
    assert s3.head_object(Bucket=repo, Key="main/src.txt")["Metadata"] == {"touched": "yes"}
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=repo, Key="main/x", CopySource={"Bucket": repo, "Key": "main/absent"})
    assert error_code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        s3.copy_object(
            Bucket=repo, Key="main/x", CopySource={"Bucket": repo, "Key": "main/src.txt"}, CopySourceIfMatch='"nope"'
        )
    assert error_code(e) == "PreconditionFailed"
    # Across repositories (chunks are shared; nothing is copied).
    other = _repo(s3hub)
    s3.copy_object(Bucket=other, Key="main/imported.txt", CopySource={"Bucket": repo, "Key": "main/src.txt"})
    assert s3.get_object(Bucket=other, Key="main/imported.txt")["Body"].read() == b"source"


# -- listing ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree(s3hub, s3):
    repo = _repo(s3hub)
    keys = [f"d{i}/f{j:02d}.txt" for i in range(3) for j in range(12)] + ["top.txt", "sp ace/é+x.txt", "d1/sub/deep.txt"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=repo, Key=f"main/{k}", Body=k.encode()), keys))
    s3hub.plane().commit(repo, "main", "tree")
    s3hub.plane().create_branch(repo, "dev", "main")
    return repo, sorted(keys)


def test_list_v2_prefix_delimiter_pagination(s3, tree):
    repo, keys = tree
    full = [f"main/{k}" for k in keys]
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/")
    assert [o["Key"] for o in r["Contents"]] == full and r["KeyCount"] == len(full) and not r["IsTruncated"]
    assert all(o["Size"] > 0 and o["ETag"].startswith('"') for o in r["Contents"])
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["main/d0/", "main/d1/", "main/d2/", "main/sp ace/"]
    assert [o["Key"] for o in r["Contents"]] == ["main/top.txt"]
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/d1/", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["main/d1/sub/"]
    assert len(r["Contents"]) == 12
    # Pages of 5 with continuation tokens.
    seen, token, pages = [], None, 0
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=repo, Prefix="main/", MaxKeys=5, **kw)
        seen += [o["Key"] for o in r.get("Contents", [])]
        pages += 1
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert seen == full and pages == -(-len(full) // 5)
    # Paginated with a delimiter: prefixes are not repeated.
    pag = s3.get_paginator("list_objects_v2")
    prefixes, contents = [], []
    for page in pag.paginate(Bucket=repo, Prefix="main/", Delimiter="/", PaginationConfig={"PageSize": 2}):
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        contents += [o["Key"] for o in page.get("Contents", [])]
    assert prefixes == ["main/d0/", "main/d1/", "main/d2/", "main/sp ace/"] and contents == ["main/top.txt"]
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/", StartAfter="main/d2/f05.txt")
    assert [o["Key"] for o in r["Contents"]] == [k for k in full if k > "main/d2/f05.txt"]
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/d0/", FetchOwner=True, MaxKeys=1)
    assert r["Contents"][0]["Owner"]["DisplayName"] == "s3-admin"
    assert "Owner" not in s3.list_objects_v2(Bucket=repo, Prefix="main/d0/", MaxKeys=1)["Contents"][0]
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/d", MaxKeys=0)
    assert r["KeyCount"] == 0 and "Contents" not in r
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/sp ace/")
    assert [o["Key"] for o in r["Contents"]] == ["main/sp ace/é+x.txt"]
    assert s3.get_object(Bucket=repo, Key="main/sp ace/é+x.txt")["Body"].read() == "sp ace/é+x.txt".encode()


def test_list_v1_markers(s3, tree):
    repo, keys = tree
    full = [f"main/{k}" for k in keys]
    got, marker = [], ""
    while True:
        r = s3.list_objects(Bucket=repo, Prefix="main/", MaxKeys=7, Marker=marker)
        got += [o["Key"] for o in r.get("Contents", [])]
        assert all("Owner" in o for o in r.get("Contents", []))
        if not r["IsTruncated"]:
            break
        marker = r.get("NextMarker") or got[-1]
    assert got == full
    pag = s3.get_paginator("list_objects")
    assert [o["Key"] for p in pag.paginate(Bucket=repo, Prefix="main/d2") for o in p["Contents"]] == [
        k for k in full if k.startswith("main/d2")
    ]


def test_list_repository_bucket_root(s3, tree):
    repo, keys = tree
    r = s3.list_objects_v2(Bucket=repo, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["dev/", "main/"]
    everything = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=repo, PaginationConfig={"PageSize": 10}) for o in p["Contents"]]
    assert everything == [f"dev/{k}" for k in keys] + [f"main/{k}" for k in keys]
    r = s3.list_objects_v2(Bucket=repo, Prefix="de")
    assert len(r["Contents"]) == len(keys) and r["Contents"][0]["Key"].startswith("dev/")


def test_directory_markers(s3hub, s3):
    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/folder/", Body=b"")
    s3.put_object(Bucket=repo, Key="main/folder/inside.txt", Body=b"i")
    assert s3.head_object(Bucket=repo, Key="main/folder/")["ContentLength"] == 0
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["main/folder/"] and "Contents" not in r
    r = s3.list_objects_v2(Bucket=repo, Prefix="main/folder/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["main/folder/", "main/folder/inside.txt"]
    # S3 lets a key ending in "/" have a body (docs/s3.md: it is the file at that path).
    s3.put_object(Bucket=repo, Key="main/other/", Body=b"not empty")
    assert s3.get_object(Bucket=repo, Key="main/other/")["Body"].read() == b"not empty"
    s3.delete_object(Bucket=repo, Key="main/other/")
    s3.delete_object(Bucket=repo, Key="main/folder/")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=repo, Prefix="main/")["Contents"]] == ["main/folder/inside.txt"]


# -- multipart ----------------------------------------------------------------------------
def test_multipart_100mib_parallel_parts(s3hub, s3):
    repo = _repo(s3hub)
    data = os.urandom(100 * MiB)
    cfg = boto3.s3.transfer.TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=8)
    s3.upload_fileobj(io.BytesIO(data), repo, "main/big/blob.bin", Config=cfg)
    head = s3.head_object(Bucket=repo, Key="main/big/blob.bin")
    parts = -(-len(data) // (8 * MiB))
    md5s = [hashlib.md5(data[i : i + 8 * MiB]).digest() for i in range(0, len(data), 8 * MiB)]
    assert head["ETag"] == f'"{hashlib.md5(b"".join(md5s)).hexdigest()}-{parts}"'
    assert head["ContentLength"] == len(data)
    out = io.BytesIO()
    s3.download_fileobj(repo, "main/big/blob.bin", out, Config=cfg)
    assert hashlib.sha256(out.getvalue()).digest() == hashlib.sha256(data).digest()
    assert s3hub.plane().stat(repo, "main", "big/blob.bin").size == len(data)
    # A managed copy of a large object uses UploadPartCopy with ranges.
    s3.copy({"Bucket": repo, "Key": "main/big/blob.bin"}, repo, "main/big/copy.bin", Config=cfg)
    r = s3.get_object(Bucket=repo, Key="main/big/copy.bin", Range="bytes=50000000-50000099")
    assert r["Body"].read() == data[50000000:50000100]
    assert s3.head_object(Bucket=repo, Key="main/big/copy.bin")["ContentLength"] == len(data)


def test_multipart_api(s3hub, s3):
    repo = _repo(s3hub)
    key = "main/mp/obj"
    p1, p2, p3 = os.urandom(5 * MiB), os.urandom(5 * MiB), b"tail"
    up = s3.create_multipart_upload(Bucket=repo, Key=key, Metadata={"m": "1"}, ContentType="text/csv")["UploadId"]
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=repo)["Uploads"]] == [up]
    e1 = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=p1)["ETag"]
    e3 = s3.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=3, Body=p3)["ETag"]
    s3.put_object(Bucket=repo, Key="main/src", Body=p2 + b"xyz")
    e2 = s3.upload_part_copy(
        Bucket=repo, Key=key, UploadId=up, PartNumber=2, CopySource={"Bucket": repo, "Key": "main/src"},
        CopySourceRange=f"bytes=0-{len(p2) - 1}",
    )["CopyPartResult"]["ETag"]
    assert e2 == f'"{hashlib.md5(p2).hexdigest()}"'
    parts = s3.list_parts(Bucket=repo, Key=key, UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in parts] == [(1, len(p1), e1), (2, len(p2), e2), (3, 4, e3)]
    page = s3.list_parts(Bucket=repo, Key=key, UploadId=up, MaxParts=2)
    assert page["IsTruncated"] and [p["PartNumber"] for p in page["Parts"]] == [1, 2]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=repo, Key=key, UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": '"' + "0" * 32 + '"'}]},
        )
    assert error_code(e) == "InvalidPart"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=repo, Key=key, UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]},
        )
    assert error_code(e) == "InvalidPartOrder"
    done = s3.complete_multipart_upload(
        Bucket=repo, Key=key, UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}, {"PartNumber": 3, "ETag": e3}]},
    )
    want = hashlib.md5(hashlib.md5(p1).digest() + hashlib.md5(p2).digest() + hashlib.md5(p3).digest()).hexdigest() + "-3"
    assert done["ETag"] == f'"{want}"'
    got = s3.get_object(Bucket=repo, Key=key)
    assert got["Body"].read() == p1 + p2 + p3 and got["ETag"] == f'"{want}"'
    assert got["Metadata"] == {"m": "1"} and got["ContentType"] == "text/csv"
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=repo, Key=key, UploadId=up)
    assert error_code(e) == "NoSuchUpload"
    # A small part that is not the last one.
    up2 = s3.create_multipart_upload(Bucket=repo, Key="main/mp/small")["UploadId"]
    a = s3.upload_part(Bucket=repo, Key="main/mp/small", UploadId=up2, PartNumber=1, Body=b"a" * 1000)["ETag"]
    b = s3.upload_part(Bucket=repo, Key="main/mp/small", UploadId=up2, PartNumber=2, Body=b"b" * 1000)["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=repo, Key="main/mp/small", UploadId=up2,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": a}, {"PartNumber": 2, "ETag": b}]},
        )
    assert error_code(e) == "EntityTooSmall"
    s3.abort_multipart_upload(Bucket=repo, Key="main/mp/small", UploadId=up2)
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=repo, Key="main/mp/small", UploadId=up2, PartNumber=3, Body=b"c")
    assert error_code(e) == "NoSuchUpload"
    with pytest.raises(ClientError) as e:
        s3.abort_multipart_upload(Bucket=repo, Key="main/mp/small", UploadId=up2)
    assert error_code(e) == "NoSuchUpload"
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=repo)
    with pytest.raises(ClientError) as e:
        s3.create_multipart_upload(Bucket=repo, Key="v-none/x")
    assert error_code(e) == "AccessDenied"
    assert "mp/small" not in staged_paths(s3hub, repo)


# -- presigned URLs ---------------------------------------------------------------------
@pytest.mark.parametrize("version", ["default", "s3v4"])
def test_presigned_get_and_put(s3hub, admin, version):
    """boto3 presigns with Signature V2 unless configured for V4: both work."""
    s3 = s3hub.boto3(admin) if version == "default" else s3hub.boto3(admin, signature_version="s3v4")
    repo = _repo(s3hub)
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": repo, "Key": "main/pre.bin"}, ExpiresIn=300)
    assert httpx.put(put_url, content=b"presigned body").status_code == 200
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": repo, "Key": "main/pre.bin"}, ExpiresIn=300)
    r = httpx.get(get_url)
    assert r.status_code == 200 and r.content == b"presigned body"
    r = httpx.get(get_url, headers={"Range": "bytes=0-8"})
    assert r.status_code == 206 and r.content == b"presigned"
    # Tampering with the URL breaks the signature.
    if version == "s3v4":
        assert "X-Amz-Signature=" in get_url
    r = httpx.get(get_url.replace("pre.bin", "pre.bim"))
    assert r.status_code == 403 and b"<Code>SignatureDoesNotMatch</Code>" in r.content
    # Expired URLs are refused, and nothing is written through them.
    short = s3.generate_presigned_url("get_object", Params={"Bucket": repo, "Key": "main/pre.bin"}, ExpiresIn=1)
    short_put = s3.generate_presigned_url("put_object", Params={"Bucket": repo, "Key": "main/late.bin"}, ExpiresIn=1)
    time.sleep(2.2)
    r = httpx.get(short)
    assert r.status_code == 403 and b"<Code>AccessDenied</Code>" in r.content and b"expired" in r.content
    r = httpx.put(short_put, content=b"late")
    assert r.status_code == 403
    assert staged_paths(s3hub, repo) == ["pre.bin"]
    # The hub's log never shows signatures or credentials.
    log = s3hub.hub.log()
    assert "X-Amz-Signature" not in log and "X-Amz-Credential" not in log and "Signature=" not in log
    assert admin.access_key not in log


# -- commits --------------------------------------------------------------------------
def test_s3_writes_are_staged_and_committed_through_rest(s3hub, s3):
    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/new.txt", Body=b"n")
    assert staged_paths(s3hub, repo) == ["new.txt"]
    plane = s3hub.plane()
    c = plane.commit(repo, "main", "from s3")
    assert staged_paths(s3hub, repo) == []
    assert s3.get_object(Bucket=repo, Key=f"{c.id}/new.txt")["Body"].read() == b"n"


def test_autocommit_after_every_write(tmp_path):
    with start_s3_hub(tmp_path / "hub", args=["--s3-autocommit", "0"]) as h:
        creds = h.token(admin=True)
        s3 = h.boto3(creds)
        s3.create_bucket(Bucket="auto")
        s3.put_object(Bucket="auto", Key="one.txt", Body=b"1")
        plane = h.plane()
        assert staged_paths(h, "auto") == []
        log = plane.log("auto", "main")
        assert log[0].message == "S3 writes" and plane.read("auto", log[0].id, "one.txt") == b"1"
        s3.delete_object(Bucket="auto", Key="one.txt")
        assert len(plane.log("auto", "main")) == 3


def test_fabric_bucket_commands_and_rest(s3hub, s3, admin):
    """`fabric bucket create|list|delete` against the hub, then plain keys over S3."""
    import json
    import subprocess
    import sys

    from tests.hubserver import hub_env

    repo = _repo(s3hub)
    s3.put_object(Bucket=repo, Key="main/data/x.txt", Body=b"x")
    name = unique("bk")

    def fabric(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fabric.cli.main", "--server", s3hub.url, "--token", s3hub.hub.token, *args],
            capture_output=True, env=hub_env(), timeout=120, check=False,
        )

    p = fabric("--json", "bucket", "create", name, f"{repo}@main")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["repo"] == repo
    assert s3.get_object(Bucket=name, Key="data/x.txt")["Body"].read() == b"x"
    listed = json.loads(fabric("--json", "bucket", "list").stdout)
    assert {"name": name, "repo": repo, "ref": "main"}.items() <= next(b for b in listed if b["name"] == name).items()
    p = fabric("bucket", "create", name, f"{repo}@main")
    assert p.returncode == 4 and "already exists" in p.stderr.decode()
    p = fabric("bucket", "create", unique("bk"), f"{repo}@nosuchref")
    assert p.returncode == 3 and "branch or tag" in p.stderr.decode()
    p = fabric("bucket", "create", unique("bk"), repo)
    assert p.returncode == 2
    other = _repo(s3hub)
    p = fabric("bucket", "create", other, f"{repo}@main")
    assert p.returncode == 4 and "taken by a repository" in p.stderr.decode()
    # Binding buckets needs admin on the repository.
    writer = s3hub.token(roles={repo: "write"})
    with s3hub.rest(writer.token) as c:
        r = c.post("/api/v1/buckets", json={"name": unique("bk"), "repo": repo, "ref": "main"})
        assert r.status_code == 403
        assert any(b["name"] == name for b in c.get("/api/v1/buckets").json())
    assert fabric("bucket", "delete", name).returncode == 0
    time.sleep(2.2)  # the gateway caches bucket bindings for 2 s
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=name, Key="data/x.txt")
    assert error_code(e) == "NoSuchBucket"
    assert s3.get_object(Bucket=repo, Key="main/data/x.txt")["Body"].read() == b"x"  # the repository stays


def test_no_auth_hub_accepts_any_client(tmp_path):
    """`fabric hub --no-auth`: S3 requests act as admin, signed or not (local demos)."""
    import httpx

    from tests.s3_helpers import Creds

    with start_s3_hub(tmp_path / "open", no_auth=True) as h:
        s3 = h.boto3(Creds("", "anything", "whatever", ""))
        s3.create_bucket(Bucket="demo")
        s3.put_object(Bucket="demo", Key="k", Body=b"v")
        assert httpx.get(h.s3_url + "/demo/k").content == b"v"
        assert httpx.put(h.s3_url + "/demo/k2", content=b"w").status_code == 200
        assert [o["Key"] for o in s3.list_objects_v2(Bucket="demo")["Contents"]] == ["k", "k2"]
