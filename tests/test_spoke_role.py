"""A spoke serves S3 with a token that has the ``spoke`` right, not a global admin token (issue 11.3).

The spoke gets SigV4 signing keys from the hub, never secrets; what it may learn
is capped by its own token's roles; such a token cannot administer the hub.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from botocore.exceptions import ClientError

from fabric.api.s3 import sigv4
from fabric.util.net import free_port
from tests.hubserver import hub_env, unique_name
from tests.s3_helpers import Creds, S3Hub, _wait_s3
from tests.spokeserver import RestartableHub, Spoke, start_restartable_hub, start_spoke

pytestmark = pytest.mark.timeout(240)
API = "/api/v1"


def cli(hub: RestartableHub, *args: str) -> str:
    """``fabric`` against the hub as its admin."""
    env = hub_env({"FABRIC_SERVER": hub.url, "FABRIC_TOKEN": hub.token or ""})
    proc = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "-q", *args], env=env, capture_output=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def token(hub: RestartableHub, name: str, roles: dict[str, str] | None = None, rights: list[str] | None = None) -> dict:
    with hub.client() as c:
        r = c.post(f"{API}/tokens", json={"name": name, "roles": roles or {}, "rights": rights or []})
        assert r.status_code == 201, r.text
        return r.json()


def creds(info: dict) -> Creds:
    return Creds(info["token"], info["s3_access_key_id"], info["s3_secret_access_key"], info["id"])


@dataclass
class Setup:
    hub: RestartableHub
    spoke: Spoke
    s3: S3Hub  # boto3 clients on the spoke's S3 listener
    spoke_token: dict
    repo: str
    other: str


@pytest.fixture
def setup(tmp_path) -> Iterator[Setup]:
    with start_restartable_hub(tmp_path / "hub") as hub:
        repo, other = unique_name("sr"), unique_name("so")
        plane = hub.plane()
        for name in (repo, other):
            plane.create_repo(name)
            plane.put_object(name, "main", "f.txt", io.BytesIO(f"in {name}".encode()))
            plane.commit(name, "main", "data")
        import json

        spoke_token = json.loads(cli(hub, "--json", "token", "create", "--spoke", "--repo", "*", "--role", "write"))
        assert spoke_token["rights"] == ["spoke"] and not spoke_token["admin"]
        port = free_port()
        with start_spoke(
            hub.url, tmp_path / "cache", "256MiB", token=spoke_token["token"], lease=1.0,
            args=["--s3-listen", f"127.0.0.1:{port}"],
        ) as spoke:
            s3 = S3Hub(hub, f"http://127.0.0.1:{port}")  # type: ignore[arg-type]
            _wait_s3(s3.s3_url, hub)  # type: ignore[arg-type]
            yield Setup(hub, spoke, s3, spoke_token, repo, other)


def test_a_spoke_token_serves_s3_to_users(setup: Setup) -> None:
    user = creds(token(setup.hub, "user", {setup.repo: "write"}))
    s3 = setup.s3.boto3(user)
    assert s3.get_object(Bucket=setup.repo, Key="main/f.txt")["Body"].read() == f"in {setup.repo}".encode()
    s3.put_object(Bucket=setup.repo, Key="main/new.txt", Body=b"via the spoke")
    assert setup.hub.plane().read(setup.repo, "main", "new.txt") == b"via the spoke"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=setup.repo, Prefix="main/")["Contents"]] == [
        "main/f.txt", "main/new.txt"
    ]
    # The user's own roles still hold at the spoke.
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=setup.other, Key="main/f.txt")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    # Presigned URLs: V4 (checked with the derived key) and V2, boto3's default (checked by the hub).
    for client in (setup.s3.boto3(user, signature_version="s3v4"), s3):
        url = client.generate_presigned_url("get_object", Params={"Bucket": setup.repo, "Key": "main/f.txt"})
        r = httpx.get(url)
        assert r.status_code == 200 and r.content == f"in {setup.repo}".encode(), (url, r.text)
    # A wrong secret is refused, V4 and V2 alike.
    wrong = Creds(user.token, user.access_key, "x" * 40, user.token_id)
    for client in (setup.s3.boto3(wrong), setup.s3.boto3(wrong, signature_version="s3")):
        with pytest.raises(ClientError) as e:
            client.get_object(Bucket=setup.repo, Key="main/f.txt")
        assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_a_spoke_token_cannot_administer_the_hub_or_learn_secrets(setup: Setup) -> None:
    user = token(setup.hub, "victim", {setup.repo: "read"})
    with setup.hub.client(setup.spoke_token["token"]) as c:
        assert c.post(f"{API}/tokens", json={"name": "evil", "admin": True}).status_code == 403
        assert c.get(f"{API}/tokens").status_code == 403
        assert c.delete(f"{API}/tokens/{user['id']}").status_code == 403
        # The raw-secret route is gone: nothing answers the secret to anyone.
        r = c.get(f"{API}/auth/s3-keys/{user['s3_access_key_id']}")
        assert r.status_code == 404 and user["s3_secret_access_key"] not in r.text
        # A signing key for one day, region and service is all a spoke gets.
        r = c.get(
            f"{API}/auth/s3-signing-keys/{user['s3_access_key_id']}",
            params={"date": "20250101", "region": "eu-west-1", "service": "s3"},
        )
        assert r.status_code == 200, r.text
        assert user["s3_secret_access_key"] not in r.text
        expected = sigv4.signing_key(user["s3_secret_access_key"], "20250101", "eu-west-1", "s3")
        assert bytes.fromhex(r.json()["key"]) == expected
        assert r.json()["principal"]["roles"] == {setup.repo: "read"}
        # Bad parameters change nothing and say what is wrong.
        for params in ({"date": "2025", "region": "x"}, {"date": "20250101", "region": "x/y"}):
            assert c.get(f"{API}/auth/s3-signing-keys/{user['s3_access_key_id']}", params=params).status_code == 400
        assert c.get(
            f"{API}/auth/s3-signing-keys/FABNOSUCHKEY", params={"date": "20250101", "region": "x"}
        ).status_code == 404
    # A token without the spoke right gets no signing key, even for its own access key.
    with setup.hub.client(user["token"]) as c:
        r = c.get(f"{API}/auth/s3-signing-keys/{user['s3_access_key_id']}", params={"date": "20250101", "region": "x"})
        assert r.status_code == 403 and "--spoke" in r.json()["error"]["message"]


def test_a_spoke_learns_nothing_beyond_its_own_roles(setup: Setup) -> None:
    narrow = token(setup.hub, "narrow-spoke", {setup.repo: "read"}, ["spoke"])
    outside = token(setup.hub, "outside", {setup.other: "admin"})
    both = token(setup.hub, "both", {setup.repo: "admin", setup.other: "write"})
    params = {"date": "20250101", "region": "us-east-1"}
    with setup.hub.client(narrow["token"]) as c:
        r = c.get(f"{API}/auth/s3-signing-keys/{outside['s3_access_key_id']}", params=params)
        assert r.status_code == 403, r.text
        assert "key" not in r.json()
        r = c.post(
            f"{API}/auth/s3-v2-check",
            json={"access_key_id": outside["s3_access_key_id"], "strings_to_sign": ["x"], "signature": "y"},
        )
        assert r.status_code == 403
        # A user with roles inside and outside: only the inside, capped at the spoke's role.
        r = c.get(f"{API}/auth/s3-signing-keys/{both['s3_access_key_id']}", params=params)
        assert r.status_code == 200
        assert r.json()["principal"]["roles"] == {setup.repo: "read"} and r.json()["principal"]["admin"] is False


def test_a_spoke_keeps_verifying_known_keys_while_the_hub_is_away(setup: Setup) -> None:
    known = creds(token(setup.hub, "known", {setup.repo: "read"}))
    stranger = creds(token(setup.hub, "stranger", {setup.repo: "read"}))
    s3 = setup.s3.boto3(known)
    body = f"in {setup.repo}".encode()
    assert s3.get_object(Bucket=setup.repo, Key="main/f.txt")["Body"].read() == body
    setup.hub.kill()
    try:
        assert s3.get_object(Bucket=setup.repo, Key="main/f.txt")["Body"].read() == body
        with pytest.raises(ClientError) as e:
            setup.s3.boto3(stranger).get_object(Bucket=setup.repo, Key="main/f.txt")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    finally:
        setup.hub.start()
