"""Users create repositories and S3 buckets without being admins, and own what they create (issue 11.3).

A token created with ``--create-repos`` may create repositories (REST) and
buckets (S3 CreateBucket), at the hub and through a spoke whose token has the
``spoke`` right; the creator gets the ``admin`` role on what it created, and can
use it at once. Without the right: 403, naming ``--create-repos``, and nothing
is created.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from botocore.exceptions import ClientError

from fabric.util.net import free_port
from tests.hubserver import hub_env, unique_name
from tests.s3_helpers import Creds, S3Hub, start_s3_hub
from tests.spokeserver import Spoke, start_spoke

pytestmark = pytest.mark.timeout(240)
API = "/api/v1"


@dataclass
class Env:
    at_hub: S3Hub
    at_spoke: S3Hub  # the spoke's S3 listener
    spoke: Spoke
    creator: Creds
    plain: Creds  # a non-admin without the right (write on every repository)
    stranger: Creds  # another creator


def make_token(s3hub: S3Hub, *args: str) -> Creds:
    """``fabric token create ARGS`` against the hub, as its admin."""
    env = hub_env({"FABRIC_SERVER": s3hub.url, "FABRIC_TOKEN": s3hub.hub.token or ""})
    proc = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "-q", "--json", "token", "create", *args],
        env=env, capture_output=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    d = json.loads(proc.stdout)
    return Creds(d["token"], d["s3_access_key_id"], d["s3_secret_access_key"], d["id"])


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("create-right")
    with start_s3_hub(tmp / "hub") as s3hub:
        spoke_token = make_token(s3hub, "--spoke", "--repo", "*", "--role", "write", "--name", "spoke")
        port = free_port()
        with start_spoke(
            s3hub.url, tmp / "cache", "256MiB", token=spoke_token.token, args=["--s3-listen", f"127.0.0.1:{port}"]
        ) as spoke:
            at_spoke = S3Hub(s3hub.hub, f"http://127.0.0.1:{port}")
            from tests.s3_helpers import _wait_s3

            _wait_s3(at_spoke.s3_url, s3hub.hub)
            creator = make_token(s3hub, "--create-repos", "--name", "creator")
            plain = make_token(s3hub, "--repo", "*", "--role", "write", "--name", "plain")
            stranger = make_token(s3hub, "--create-repos", "--name", "stranger")
            yield Env(s3hub, at_spoke, spoke, creator, plain, stranger)


def exists(env: Env, repo: str) -> bool:
    with env.at_hub.rest() as c:
        return c.get(f"{API}/repos/{repo}").status_code == 200


def check_owned(env: Env, repo: str, base_url: str) -> None:
    """The creator can write and commit ``repo`` at once; another non-admin cannot read it."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {env.creator.token}"}, timeout=60) as c:
        r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "mine.txt"}, content=b"mine")
        assert r.status_code == 201, r.text
        assert c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "m"}).status_code == 201
        assert repo in [x["name"] for x in c.get(f"{API}/repos").json()]
    with env.at_hub.rest() as admin:
        assert admin.get(f"{API}/repos/{repo}/refs/main/objects", params={"path": "mine.txt"}).content == b"mine"
    with env.at_hub.hub.client(env.stranger.token) as c:
        assert c.get(f"{API}/repos/{repo}").status_code == 403
        assert repo not in [x["name"] for x in c.get(f"{API}/repos").json()]


@pytest.mark.parametrize("where", ["hub", "spoke"])
def test_create_repos_right_over_rest(env: Env, where: str) -> None:
    base = env.at_hub.url if where == "hub" else env.spoke.url
    repo = unique_name("own")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {env.creator.token}"}, timeout=60) as c:
        r = c.post(f"{API}/repos", json={"name": repo})
        assert r.status_code == 201, r.text
    check_owned(env, repo, base)
    # Without the right (write on every repository is not enough): 403 naming the flag, nothing created.
    refused = unique_name("no")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {env.plain.token}"}, timeout=60) as c:
        r = c.post(f"{API}/repos", json={"name": refused})
        assert r.status_code == 403 and "--create-repos" in r.json()["error"]["message"], r.text
    assert not exists(env, refused)


@pytest.mark.parametrize("where", ["hub", "spoke"])
def test_create_repos_right_over_s3(env: Env, where: str) -> None:
    at = env.at_hub if where == "hub" else env.at_spoke
    bucket = unique_name("bk")
    s3 = at.boto3(env.creator)
    s3.create_bucket(Bucket=bucket)
    # Owned at once: plain keys (an S3-created bucket is bound to main), written and read back.
    s3.put_object(Bucket=bucket, Key="a/b.txt", Body=b"bucket data")
    assert s3.get_object(Bucket=bucket, Key="a/b.txt")["Body"].read() == b"bucket data"
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    if where == "hub":
        # Yours already, in us-east-1: 200 (issue 12).
        assert s3.create_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    else:
        # At a spoke the creator's roles are capped at the spoke token's (write): it does not look like the owner.
        with pytest.raises(ClientError) as e:
            s3.create_bucket(Bucket=bucket)
        assert e.value.response["Error"]["Code"] == "BucketAlreadyExists"
    check_owned(env, bucket, env.at_hub.url)
    # Another non-admin cannot read it over S3 either.
    with pytest.raises(ClientError) as e:
        at.boto3(env.stranger).get_object(Bucket=bucket, Key="a/b.txt")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    # Without the right: AccessDenied naming the flag, and no bucket.
    refused = unique_name("nb")
    with pytest.raises(ClientError) as e:
        at.boto3(env.plain).create_bucket(Bucket=refused)
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    assert "--create-repos" in e.value.response["Error"]["Message"]
    assert not exists(env, refused)


def test_only_a_spoke_may_act_on_behalf_of_a_user(env: Env) -> None:
    """``X-Fabric-On-Behalf-Of`` is the spoke's, not a way for a user to create repositories for another."""
    repo = unique_name("ob")
    with env.at_hub.hub.client(env.plain.token) as c:
        r = c.post(f"{API}/repos", json={"name": repo}, headers={"X-Fabric-On-Behalf-Of": env.creator.token_id})
        assert r.status_code == 403, r.text
    assert not exists(env, repo)
    plane = env.at_hub.plane()
    plane.create_repo(repo)
    plane.put_object(repo, "main", "f", io.BytesIO(b"x"))
    with env.at_hub.hub.client(env.plain.token) as c:  # and only for creating
        r = c.get(f"{API}/repos/{repo}", headers={"X-Fabric-On-Behalf-Of": env.creator.token_id})
        assert r.status_code in (400, 403)
