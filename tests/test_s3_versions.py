"""Object versions over S3 (boto3 against a real hub, and through a spoke): ListObjectVersions,
GetObject/HeadObject with versionId, the versioning configuration, version deletes and the
"empty the bucket" idioms of cleanup scripts."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from fabric.util.net import free_port
from tests.s3_fixtures import error_code, error_status
from tests.s3_helpers import REGION, S3Hub, _wait_s3, start_s3_hub, unique
from tests.spokeserver import start_spoke

pytestmark = pytest.mark.timeout(300)


def _all_versions(s3, bucket: str, **kwargs) -> list[tuple[str, str, bool, bool]]:
    """(key, version id, is latest, is a delete marker) of every version, through boto3's paginator, in order."""
    out = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, **kwargs):
        items = [(v["Key"], v["VersionId"], v["IsLatest"], False, v) for v in page.get("Versions", [])]
        items += [(m["Key"], m["VersionId"], m["IsLatest"], True, m) for m in page.get("DeleteMarkers", [])]
        # boto3 splits one page into two lists; the page's own order is by walk position (LastModified breaks no tie)
        out += [(k, vid, latest, marker) for k, vid, latest, marker, _ in items]
    return out


def _history(s3hub: S3Hub, s3) -> tuple[str, dict]:
    """A bucket with a history: returns the bucket and the commit ids, by name.

    C1: a=v1            C2: a=v2, b=x            C3: a deleted            staged: a=v3, c=new
    """
    bucket = unique("ver")
    s3.create_bucket(Bucket=bucket)
    plane = s3hub.plane()
    ids = {}
    s3.put_object(Bucket=bucket, Key="a", Body=b"v1")
    ids["C1"] = plane.commit(bucket, "main", "one").id
    s3.put_object(Bucket=bucket, Key="a", Body=b"v2")
    s3.put_object(Bucket=bucket, Key="d/b", Body=b"x")
    ids["C2"] = plane.commit(bucket, "main", "two").id
    s3.delete_object(Bucket=bucket, Key="a")
    ids["C3"] = plane.commit(bucket, "main", "three").id
    s3.put_object(Bucket=bucket, Key="a", Body=b"v3")
    s3.put_object(Bucket=bucket, Key="c", Body=b"new")
    return bucket, ids


# -- listing -------------------------------------------------------------------------------
def test_list_object_versions_shows_each_keys_states_newest_first(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    r = s3.list_object_versions(Bucket=bucket)
    assert r["IsTruncated"] is False
    versions = {(v["Key"], v["VersionId"]): v for v in r["Versions"]}
    markers = {(m["Key"], m["VersionId"]): m for m in r["DeleteMarkers"]}
    a_versions = [vid for key, vid in versions if key == "a"]
    staged = [vid for vid in a_versions if vid.startswith("staged-")]
    assert len(staged) == 1 and a_versions == [staged[0], ids["C2"], ids["C1"]]  # newest first
    assert list(markers) == [("a", ids["C3"])]
    assert versions[("a", staged[0])]["IsLatest"] is True
    assert versions[("a", ids["C2"])]["IsLatest"] is False and versions[("a", ids["C1"])]["IsLatest"] is False
    assert markers[("a", ids["C3"])]["IsLatest"] is False
    assert versions[("d/b", ids["C2"])]["IsLatest"] is True
    assert versions[("d/b", ids["C2"])]["Size"] == 1
    assert versions[("a", ids["C1"])]["ETag"] == '"6654c734ccab8f440ff0825eb443dc7f"'  # md5(b"v1")
    assert [k for k, vid in versions if k == "c"] == ["c"]
    # every key has exactly one latest version
    latest = [k for (k, _), v in versions.items() if v["IsLatest"]] + [k for (k, _), m in markers.items() if m["IsLatest"]]
    assert sorted(latest) == ["a", "c", "d/b"]


def test_list_object_versions_pages_with_markers(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    whole = _all_versions(s3, bucket)
    for size in (1, 2, 3):
        paged = _all_versions(s3, bucket, PaginationConfig={"PageSize": size})
        assert sorted(paged) == sorted(whole), size
        assert len(paged) == len(set(paged)) == 6
    page = s3.list_object_versions(Bucket=bucket, MaxKeys=2)
    assert page["IsTruncated"] is True and page["NextKeyMarker"] and page["NextVersionIdMarker"]
    assert page["MaxKeys"] == 2


def test_list_object_versions_prefix_delimiter_and_key_marker(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    r = s3.list_object_versions(Bucket=bucket, Prefix="d/")
    assert [(v["Key"], v["VersionId"]) for v in r["Versions"]] == [("d/b", ids["C2"])]
    r = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["d/"]
    assert {v["Key"] for v in r["Versions"]} == {"a", "c"}
    r = s3.list_object_versions(Bucket=bucket, KeyMarker="b")  # keys after "b" only
    assert {v["Key"] for v in r["Versions"]} == {"c", "d/b"} and "DeleteMarkers" not in r
    assert s3.list_object_versions(Bucket=bucket, Prefix="zz").get("Versions") is None
    assert s3.list_object_versions(Bucket=bucket, MaxKeys=0)["IsTruncated"] is False


def test_list_object_versions_bad_arguments(s3hub, s3):
    bucket, _ = _history(s3hub, s3)
    with pytest.raises(ClientError) as e:
        s3.list_object_versions(Bucket=bucket, VersionIdMarker="0" * 64)
    assert error_code(e) == "InvalidArgument"
    with pytest.raises(ClientError) as e:
        s3.list_object_versions(Bucket=bucket, KeyMarker="a", VersionIdMarker="not-a-version")
    assert error_code(e) == "InvalidArgument"
    with pytest.raises(ClientError) as e:
        s3.list_object_versions(Bucket=bucket, KeyMarker="a", VersionIdMarker="f" * 64)
    assert error_code(e) == "InvalidArgument"
    with pytest.raises(ClientError) as e:
        s3.list_object_versions(Bucket="no-such-bucket-" + unique())
    assert error_code(e) == "NoSuchBucket"


def test_repository_bucket_lists_versions_per_ref(s3hub, s3):
    repo = unique("vr")
    plane = s3hub.plane()
    plane.create_repo(repo)
    s3.put_object(Bucket=repo, Key="main/k", Body=b"1")
    c1 = plane.commit(repo, "main", "one").id
    plane.create_tag(repo, "v1", "main")
    s3.put_object(Bucket=repo, Key="main/k", Body=b"2")
    c2 = plane.commit(repo, "main", "two").id
    r = s3.list_object_versions(Bucket=repo, Prefix="main/")
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in r["Versions"]] == [
        ("main/k", c2, True), ("main/k", c1, False)
    ]
    everything = _all_versions(s3, repo)
    assert [(k, vid) for k, vid, _, _ in everything] == [("main/k", c2), ("main/k", c1), ("v1/k", c1)]
    r = s3.list_object_versions(Bucket=repo, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["main/", "v1/"]
    assert s3.get_object(Bucket=repo, Key="main/k", VersionId=c1)["Body"].read() == b"1"
    assert s3.get_object(Bucket=repo, Key="v1/k", VersionId=c1)["Body"].read() == b"1"


# -- reading a version -----------------------------------------------------------------
def test_get_and_head_object_with_version_id(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    got = s3.get_object(Bucket=bucket, Key="a", VersionId=ids["C1"])
    assert got["Body"].read() == b"v1" and got["VersionId"] == ids["C1"]
    assert s3.get_object(Bucket=bucket, Key="a", VersionId=ids["C2"])["Body"].read() == b"v2"
    head = s3.head_object(Bucket=bucket, Key="a", VersionId=ids["C2"])
    assert head["ContentLength"] == 2 and head["VersionId"] == ids["C2"]
    assert s3.get_object(Bucket=bucket, Key="a", VersionId=ids["C1"], Range="bytes=1-1")["Body"].read() == b"1"
    staged = [v["VersionId"] for v in s3.list_object_versions(Bucket=bucket, Prefix="a")["Versions"] if v["IsLatest"]][0]
    assert s3.get_object(Bucket=bucket, Key="a", VersionId=staged)["Body"].read() == b"v3"
    # once committed, the staged id still reads that state, and the listing shows the commit's id
    c4 = s3hub.plane().commit(bucket, "main", "four").id
    assert s3.get_object(Bucket=bucket, Key="a", VersionId=staged)["Body"].read() == b"v3"
    latest = [v for v in s3.list_object_versions(Bucket=bucket, Prefix="a")["Versions"] if v["IsLatest"]]
    assert [v["VersionId"] for v in latest] == [c4]


def test_version_id_errors_are_the_ones_aws_gives(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    with pytest.raises(ClientError) as e:  # a delete marker
        s3.get_object(Bucket=bucket, Key="a", VersionId=ids["C3"])
    assert error_code(e) == "MethodNotAllowed" and error_status(e) == 405
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="a", VersionId=ids["C3"])
    assert error_status(e) == 405
    for vid in ("0" * 64, ids["C1"]):  # no such commit; a commit that did not change "d/b"
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key="d/b", VersionId=vid)
        assert error_code(e) == "NoSuchVersion" and error_status(e) == 404
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="a", VersionId="staged-" + "0" * 32)
    assert error_code(e) == "NoSuchVersion"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="a", VersionId="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
    assert error_code(e) == "InvalidArgument" and error_status(e) == 400


def test_a_version_id_of_another_repository_is_no_version_here(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    other, other_ids = _history(s3hub, s3)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="a", VersionId=other_ids["C1"])
    assert error_code(e) == "NoSuchVersion"


# -- versioning configuration ----------------------------------------------------------------
def test_bucket_versioning_is_always_enabled(s3hub, s3):
    bucket, _ = _history(s3hub, s3)
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    with pytest.raises(ClientError) as e:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    assert error_code(e) == "InvalidBucketState" and error_status(e) == 409
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    reader = s3hub.boto3(s3hub.token(roles={bucket: "read"}, name="ver-reader"))
    assert reader.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    with pytest.raises(ClientError) as e:
        reader.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert error_code(e) == "AccessDenied"


# -- deleting versions ---------------------------------------------------------------------
def test_delete_object_with_version_id(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    assert s3.delete_object(Bucket=bucket, Key="d/b", VersionId="0" * 64)["VersionId"] == "0" * 64  # unknown: as AWS
    with pytest.raises(ClientError) as e:  # an older version of a key that exists: history is immutable
        s3.delete_object(Bucket=bucket, Key="a", VersionId=ids["C1"])
    assert error_code(e) == "NotImplemented"
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"v3"
    marker = s3.delete_object(Bucket=bucket, Key="a", VersionId=ids["C3"])  # a delete marker: nothing changes
    assert marker["DeleteMarker"] is True and marker["VersionId"] == ids["C3"]
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"v3"
    current = s3.delete_object(Bucket=bucket, Key="d/b", VersionId=ids["C2"])  # the current version: deletes the key
    assert current["VersionId"] == ids["C2"] and "DeleteMarker" not in current
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="d/b")
    assert error_status(e) == 404
    s3.delete_object(Bucket=bucket, Key="d/b", VersionId=ids["C2"])  # again: the key is gone, accepted
    with pytest.raises(ClientError) as e:
        s3.delete_object(Bucket=bucket, Key="a", VersionId="bad")
    assert error_code(e) == "InvalidArgument"


def test_delete_objects_with_versions_reports_per_version(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    r = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": "a", "VersionId": ids["C1"]}, {"Key": "d/b", "VersionId": "bad"}, {"Key": "c"}]},
    )
    errors = {(x["Key"], x["Code"]) for x in r["Errors"]}
    assert errors == {("a", "NotImplemented"), ("d/b", "InvalidArgument")}
    assert [d["Key"] for d in r["Deleted"]] == ["c"]
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"v3"
    # the older version listed before the current one in the same request: accepted, the key deleted
    staged = [v["VersionId"] for v in s3.list_object_versions(Bucket=bucket, Prefix="a")["Versions"] if v["IsLatest"]][0]
    r = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": "a", "VersionId": ids["C1"]}, {"Key": "a", "VersionId": staged},
                            {"Key": "a", "VersionId": ids["C3"]}]},
    )
    assert "Errors" not in r
    assert [(d["Key"], d["VersionId"], d.get("DeleteMarker", False)) for d in r["Deleted"]] == [
        ("a", ids["C1"], False), ("a", staged, False), ("a", ids["C3"], True)
    ]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["d/b"]


def test_empty_bucket_with_the_resource_idiom_then_delete_it(s3hub, admin):
    s3 = s3hub.boto3(admin)
    bucket, _ = _history(s3hub, s3)
    resource = boto3.resource(
        "s3", endpoint_url=s3hub.s3_url, aws_access_key_id=admin.access_key, aws_secret_access_key=admin.secret_key,
        region_name=REGION, config=Config(s3={"addressing_style": "path"}),
    )
    results = resource.Bucket(bucket).object_versions.delete()
    assert all("Errors" not in r for r in results), results
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    resource.Bucket(bucket).delete()
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=bucket)
    assert error_status(e) == 404


def test_empty_bucket_with_the_paginator_and_delete_objects(s3hub, s3):
    bucket, ids = _history(s3hub, s3)
    for i in range(30):  # a second commit with many keys, so the walk spans pages
        s3.put_object(Bucket=bucket, Key=f"many/{i:02d}", Body=b"%d" % i)
    s3hub.plane().commit(bucket, "main", "many")
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, PaginationConfig={"PageSize": 7}):
        objects = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in page.get("Versions", [])]
        objects += [{"Key": m["Key"], "VersionId": m["VersionId"]} for m in page.get("DeleteMarkers", [])]
        if objects:
            r = s3.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
            assert "Errors" not in r, r["Errors"]
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    s3.delete_bucket(Bucket=bucket)


# -- through a spoke -----------------------------------------------------------------------
def test_versions_through_a_spoke(tmp_path):
    with start_s3_hub(tmp_path / "hub") as s3hub:
        port = free_port()
        args = ["--s3-listen", f"127.0.0.1:{port}"]
        with start_spoke(s3hub.url, tmp_path / "cache", "256MiB", token=s3hub.hub.token, args=args):
            url = f"http://127.0.0.1:{port}"
            _wait_s3(url, s3hub.hub)
            at_spoke = S3Hub(s3hub.hub, url)
            admin = s3hub.token(admin=True, name="spoke-admin")
            bucket, ids = _history(s3hub, s3hub.boto3(admin))
            s3 = at_spoke.boto3(admin)
            r = s3.list_object_versions(Bucket=bucket)
            a = [(v["VersionId"], v["IsLatest"]) for v in r["Versions"] if v["Key"] == "a"]
            assert a[1:] == [(ids["C2"], False), (ids["C1"], False)] and a[0][1] is True
            assert a[0][0].startswith("staged-")
            assert [(m["Key"], m["VersionId"]) for m in r["DeleteMarkers"]] == [("a", ids["C3"])]
            assert sorted(_all_versions(s3, bucket, PaginationConfig={"PageSize": 2})) == sorted(_all_versions(s3, bucket))
            assert s3.get_object(Bucket=bucket, Key="a", VersionId=ids["C1"])["Body"].read() == b"v1"
            assert s3.get_object(Bucket=bucket, Key="a", VersionId=a[0][0])["Body"].read() == b"v3"
            with pytest.raises(ClientError) as e:
                s3.get_object(Bucket=bucket, Key="a", VersionId=ids["C3"])
            assert error_status(e) == 405
            assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
                objects = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in page.get("Versions", [])]
                objects += [{"Key": m["Key"], "VersionId": m["VersionId"]} for m in page.get("DeleteMarkers", [])]
                r = s3.delete_objects(Bucket=bucket, Delete={"Objects": objects})
                assert "Errors" not in r, r["Errors"]
            assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_a_key_replaced_by_its_slash_key_lists_both_without_splitting_them(s3hub, s3):
    bucket = unique("ver")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"file")
    c1 = s3hub.plane().commit(bucket, "main", "file").id
    s3.put_object(Bucket=bucket, Key="k/", Body=b"")  # the same path: a directory marker replaces the file
    c2 = s3hub.plane().commit(bucket, "main", "marker").id
    r = s3.list_object_versions(Bucket=bucket)
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in r["Versions"]] == [("k/", c2, True), ("k", c1, False)]
    assert [(m["Key"], m["VersionId"], m["IsLatest"]) for m in r["DeleteMarkers"]] == [("k", c2, True)]
    first = s3.list_object_versions(Bucket=bucket, MaxKeys=1)  # one change, two keys: one page holds both
    assert len(first.get("Versions", [])) + len(first.get("DeleteMarkers", [])) == 2 and first["IsTruncated"] is True
    assert sorted(_all_versions(s3, bucket, PaginationConfig={"PageSize": 1})) == sorted(_all_versions(s3, bucket))
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=c1)["Body"].read() == b"file"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="k", VersionId=c2)
    assert error_status(e) == 405
    assert s3.head_object(Bucket=bucket, Key="k/", VersionId=c2)["ContentLength"] == 0
