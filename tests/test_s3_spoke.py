"""The S3 listener of a spoke: the hub's key pairs and roles, reads served from the cache."""

from __future__ import annotations

import dataclasses
import io
import os

import pytest
from botocore.exceptions import ClientError

from fabric.util.net import free_port
from tests.s3_helpers import S3Hub, _wait_s3, start_s3_hub, unique
from tests.spokeserver import start_spoke

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def s3_spoke(tmp_path):
    with start_s3_hub(tmp_path / "hub") as s3hub:
        port = free_port()
        with start_spoke(
            s3hub.url, tmp_path / "cache", "256MiB", token=s3hub.hub.token, args=["--s3-listen", f"127.0.0.1:{port}"]
        ) as spoke:
            url = f"http://127.0.0.1:{port}"
            _wait_s3(url, s3hub.hub)
            yield s3hub, spoke, S3Hub(s3hub.hub, url)


def test_spoke_s3_reads_cached_data_without_contacting_the_hub(s3_spoke) -> None:
    s3hub, spoke, at_spoke = s3_spoke
    repo = unique("sp")
    s3hub.plane().create_repo(repo)
    files = {f"data/f{i}.bin": os.urandom(200_000 + i) for i in range(5)}
    for path, data in files.items():
        s3hub.plane().put_object(repo, "main", path, io.BytesIO(data))
    reader = s3hub.token(roles={repo: "read"}, name="reader")
    s3 = at_spoke.boto3(reader)

    for path, data in files.items():  # cold: fetched from the hub
        assert s3.get_object(Bucket=repo, Key=f"main/{path}")["Body"].read() == data
    before = spoke.stats()["upstream_requests"]
    for _ in range(3):
        for path, data in files.items():
            assert s3.get_object(Bucket=repo, Key=f"main/{path}")["Body"].read() == data
        listed = s3.list_objects_v2(Bucket=repo, Prefix="main/data/")["Contents"]
        assert sorted(o["Key"] for o in listed) == sorted(f"main/{p}" for p in files)
    assert spoke.stats()["upstream_requests"] == before, "warm reads must not contact the hub"


def test_spoke_s3_enforces_roles_and_writes_reach_the_hub(s3_spoke) -> None:
    s3hub, _spoke, at_spoke = s3_spoke
    repo, other = unique("sp"), unique("sp")
    s3hub.plane().create_repo(repo)
    s3hub.plane().create_repo(other)
    writer = at_spoke.boto3(s3hub.token(roles={repo: "write"}, name="writer"))
    writer.put_object(Bucket=repo, Key="main/new.txt", Body=b"written at the spoke")
    assert writer.get_object(Bucket=repo, Key="main/new.txt")["Body"].read() == b"written at the spoke"
    assert s3hub.plane().read(repo, "main", "new.txt") == b"written at the spoke"
    with pytest.raises(ClientError) as err:
        writer.get_object(Bucket=other, Key="main/anything")
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    forged = dataclasses.replace(s3hub.token(roles={repo: "read"}, name="r"), secret_key="x" * 40)
    with pytest.raises(ClientError) as err:
        at_spoke.boto3(forged).get_object(Bucket=repo, Key="main/new.txt")
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
