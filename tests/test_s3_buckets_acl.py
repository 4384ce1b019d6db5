"""Buckets as S3 clients expect them (re-creating your own bucket, dotted names, the location a
bucket was created with, ListBuckets pages, empty continuation tokens) and the ACL calls."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.s3_helpers import Creds, S3Hub, start_s3_hub, unique


@pytest.fixture(scope="module")
def s3hub(tmp_path_factory) -> S3Hub:
    with start_s3_hub(tmp_path_factory.mktemp("s3buckets") / "data") as h:
        yield h


@pytest.fixture(scope="module")
def admin(s3hub) -> Creds:
    return s3hub.token(admin=True, name="buckets-admin")


@pytest.fixture(scope="module")
def s3(s3hub, admin):
    return s3hub.boto3(admin)


def _error(exc: pytest.ExceptionInfo) -> tuple[int, str]:
    r = exc.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


# -- creating a bucket you already own ------------------------------------------------------
def test_recreating_your_own_bucket_in_us_east_1_succeeds(s3):
    name = unique("own")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="keep.txt", Body=b"k")
    assert s3.create_bucket(Bucket=name)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=name, Key="keep.txt")["Body"].read() == b"k"


def test_recreating_your_own_bucket_elsewhere_is_already_owned_by_you(s3):
    name = unique("own")
    s3.create_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert _error(e) == (409, "BucketAlreadyOwnedByYou")
    other = unique("own")
    s3.create_bucket(Bucket=other, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=other)
    assert _error(e) == (409, "BucketAlreadyOwnedByYou")


def test_someone_elses_bucket_is_already_taken(s3hub, s3):
    name = unique("taken")
    s3.create_bucket(Bucket=name)
    with s3hub.rest() as c:
        tok = c.post("/api/v1/tokens", json={"name": "maker", "rights": ["create-repos"]}).json()
    creator = s3hub.boto3(Creds(tok["token"], tok["s3_access_key_id"], tok["s3_secret_access_key"], tok["id"]))
    with pytest.raises(ClientError) as e:
        creator.create_bucket(Bucket=name)
    assert _error(e) == (409, "BucketAlreadyExists")


# -- the location a bucket was created with -------------------------------------------------
def test_get_bucket_location_returns_the_constraint_it_was_created_with(s3):
    name = unique("loc")
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-central-1"})
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] == "eu-central-1"
    plain = unique("loc")
    s3.create_bucket(Bucket=plain)
    assert s3.get_bucket_location(Bucket=plain)["LocationConstraint"] in (None, "")


def test_a_location_is_forgotten_with_its_bucket(s3):
    name = unique("loc")
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "ap-south-1"})
    s3.delete_bucket(Bucket=name)
    s3.create_bucket(Bucket=name)
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] in (None, "")


# -- bucket names with dots --------------------------------------------------------------
def test_a_dotted_bucket_name_is_a_bucket(s3hub, s3):
    name = f"data.v1.{unique('dot')}"
    s3.create_bucket(Bucket=name)
    s3.head_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="a/b.txt", Body=b"dotted")
    assert s3.get_object(Bucket=name, Key="a/b.txt")["Body"].read() == b"dotted"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == ["a/b.txt"]
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    repo = s3hub.plane().get_bucket(name)["repo"]
    assert "." not in repo
    s3.delete_object(Bucket=name, Key="a/b.txt")
    with s3hub.rest() as c:
        c.post(f"/api/v1/repos/{repo}/branches/main/commit", json={"message": "empty"})
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert _error(e)[0] == 404


@pytest.mark.parametrize("bad", ["a..b", "-ab.c", "ab.c-", "192.168.1.10", "ab", "a.-b", "a-.b", "Ab.c"])
def test_invalid_bucket_names_are_refused(s3, bad):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=bad)
    assert _error(e) == (400, "InvalidBucketName")


# -- ListBuckets pages and continuation tokens -------------------------------------------
def test_list_buckets_pages(s3):
    stem = unique("pg")
    names = [f"{stem}-{i}" for i in range(5)]
    for n in names:
        s3.create_bucket(Bucket=n)
    seen, token = [], None
    while True:
        kw = {"MaxBuckets": 2, "Prefix": stem}
        if token:
            kw["ContinuationToken"] = token
        out = s3.list_buckets(**kw)
        assert len(out["Buckets"]) <= 2
        assert out["Prefix"] == stem
        seen += [b["Name"] for b in out["Buckets"]]
        token = out.get("ContinuationToken")
        if not token:
            break
    assert seen == names
    every = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert set(names) <= set(every) and "ContinuationToken" not in s3.list_buckets()


def test_list_buckets_bad_arguments(s3hub, admin):
    s3 = s3hub.boto3(admin, parameter_validation=False)
    for kw in ({"MaxBuckets": 0}, {"MaxBuckets": 10001}, {"ContinuationToken": "not-a-token"}):
        with pytest.raises(ClientError) as e:
            s3.list_buckets(**kw)
        assert _error(e) == (400, "InvalidArgument"), kw


def test_empty_continuation_tokens_are_absent(s3hub, admin, s3):
    name = unique("tok")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="x", Body=b"x")
    out = s3.list_objects_v2(Bucket=name, ContinuationToken="")
    assert [o["Key"] for o in out["Contents"]] == ["x"]
    assert out["ContinuationToken"] == ""
    assert name in [b["Name"] for b in s3.list_buckets(ContinuationToken="")["Buckets"]]


# -- ACLs --------------------------------------------------------------------------------
OWNER_ONLY = "FULL_CONTROL"


def _owner_grant(acl: dict, creds: Creds) -> None:
    assert acl["Owner"]["ID"] == creds.token_id
    assert [(g["Grantee"]["ID"], g["Permission"]) for g in acl["Grants"]] == [(creds.token_id, OWNER_ONLY)]


def test_private_acls_succeed(s3, admin):
    name = unique("acl")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="o.txt", Body=b"o")
    s3.put_bucket_acl(Bucket=name, ACL="private")
    s3.put_object_acl(Bucket=name, Key="o.txt", ACL="private")
    _owner_grant(s3.get_bucket_acl(Bucket=name), admin)
    acl = s3.get_object_acl(Bucket=name, Key="o.txt")
    _owner_grant(acl, admin)
    policy = {"Owner": acl["Owner"], "Grants": acl["Grants"]}
    s3.put_object_acl(Bucket=name, Key="o.txt", AccessControlPolicy=policy)
    s3.put_bucket_acl(Bucket=name, AccessControlPolicy=policy)
    assert s3.get_object(Bucket=name, Key="o.txt")["Body"].read() == b"o"


def test_other_acls_are_not_implemented(s3, admin):
    name = unique("acl")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="o.txt", Body=b"o")
    calls = [
        lambda: s3.put_bucket_acl(Bucket=name, ACL="public-read"),
        lambda: s3.put_object_acl(Bucket=name, Key="o.txt", ACL="authenticated-read"),
        lambda: s3.put_object_acl(Bucket=name, Key="o.txt", GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"'),
        lambda: s3.put_object_acl(
            Bucket=name, Key="o.txt",
            AccessControlPolicy={
                "Owner": {"ID": admin.token_id},
                "Grants": [
                    {"Grantee": {"Type": "CanonicalUser", "ID": admin.token_id}, "Permission": "FULL_CONTROL"},
                    {"Grantee": {"Type": "CanonicalUser", "ID": "someone-else"}, "Permission": "READ"},
                ],
            },
        ),
    ]
    for call in calls:
        with pytest.raises(ClientError) as e:
            call()
        assert _error(e) == (501, "NotImplemented")
        assert "per token" in e.value.response["Error"]["Message"]


def test_object_acl_needs_the_key_and_the_role(s3hub, s3):
    name = unique("acl")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="o.txt", Body=b"o")
    for call in (
        lambda: s3.get_object_acl(Bucket=name, Key="missing.txt"),
        lambda: s3.put_object_acl(Bucket=name, Key="missing.txt", ACL="private"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert _error(e) == (404, "NoSuchKey")
    repo = s3hub.plane().get_bucket(name)["repo"]
    reader = s3hub.boto3(s3hub.token(roles={repo: "read"}, name="acl-reader"))
    assert reader.get_object_acl(Bucket=name, Key="o.txt")["Grants"]
    with pytest.raises(ClientError) as e:
        reader.put_object_acl(Bucket=name, Key="o.txt", ACL="private")
    assert _error(e) == (403, "AccessDenied")
    with pytest.raises(ClientError) as e:
        reader.put_bucket_acl(Bucket=name, ACL="private")
    assert _error(e) == (403, "AccessDenied")


def test_a_location_survives_a_restart(tmp_path):
    data = tmp_path / "data"
    name = unique("loc")
    with start_s3_hub(data) as h:
        s3 = h.boto3(h.token(admin=True))
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-north-1"})
    with start_s3_hub(data) as h:
        s3 = h.boto3(h.token(admin=True))
        assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] == "eu-north-1"
        assert s3.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "eu-north-1"
