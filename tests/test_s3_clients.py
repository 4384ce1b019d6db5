"""Real S3 clients beyond boto3, against a hub and a spoke: the MinIO Python SDK doing what
MinIO-client users do, and s3torchconnector (AWS's PyTorch datasets and checkpoints over
the CRT S3 client) reading a dataset and writing a checkpoint."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import textwrap
from urllib.parse import urlsplit

import httpx
import minio
import pytest
from minio.commonconfig import CopySource
from minio.deleteobjects import DeleteObject
from minio.error import S3Error as MinioError

from fabric.util.net import free_port
from tests.ci_requirements import requires
from tests.s3_helpers import REGION, Creds, S3Hub, _wait_s3, start_s3_hub, unique
from tests.spokeserver import start_spoke

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=["hub", "spoke"])
def where(request, tmp_path_factory) -> tuple[S3Hub, S3Hub]:
    """(the hub, the S3 listener the client talks to: the hub's or a spoke's)."""
    base = tmp_path_factory.mktemp(f"clients-{request.param}")
    with start_s3_hub(base / "hub") as s3hub:
        if request.param == "hub":
            yield s3hub, s3hub
            return
        port = free_port()
        with start_spoke(s3hub.url, base / "cache", "256MiB", token=s3hub.hub.token, args=["--s3-listen", f"127.0.0.1:{port}"]):
            url = f"http://127.0.0.1:{port}"
            _wait_s3(url, s3hub.hub)
            yield s3hub, S3Hub(s3hub.hub, url)


@pytest.fixture(scope="module")
def creds(where) -> Creds:
    return where[0].token(admin=True, name="clients-admin")


def _minio(at: S3Hub, creds: Creds, region: str | None = REGION):
    return minio.Minio(urlsplit(at.s3_url).netloc, creds.access_key, creds.secret_key, secure=False, region=region)


def test_minio_sdk_buckets_objects_and_presigned_urls(where, creds, tmp_path):
    _, at = where
    mc = _minio(at, creds, region=None)  # no region: the SDK asks GetBucketLocation first
    bucket = unique("mc")
    assert not mc.bucket_exists(bucket)
    mc.make_bucket(bucket)
    assert mc.bucket_exists(bucket)
    assert bucket in [b.name for b in mc.list_buckets()]

    data = os.urandom(3 * 1024 * 1024 + 17)
    mc.put_object(bucket, "data/blob.bin", io.BytesIO(data), len(data), metadata={"x-amz-meta-origin": "minio"})
    local = tmp_path / "local.txt"
    local.write_bytes(b"from a file\n")
    mc.fput_object(bucket, "data/nested/file.txt", str(local), content_type="text/plain")

    resp = mc.get_object(bucket, "data/blob.bin")
    try:
        assert resp.read() == data
    finally:
        resp.close()
        resp.release_conn()
    stat = mc.stat_object(bucket, "data/blob.bin")
    assert stat.size == len(data) and stat.metadata.get("x-amz-meta-origin") == "minio"
    assert mc.stat_object(bucket, "data/nested/file.txt").content_type == "text/plain"
    out = tmp_path / "out.bin"
    mc.fget_object(bucket, "data/blob.bin", str(out))
    assert out.read_bytes() == data

    keys = sorted(o.object_name for o in mc.list_objects(bucket, prefix="data/", recursive=True))
    assert keys == ["data/blob.bin", "data/nested/file.txt"]
    top = sorted(o.object_name for o in mc.list_objects(bucket, prefix="data/"))
    assert top == ["data/blob.bin", "data/nested/"]

    mc.copy_object(bucket, "copy/blob.bin", CopySource(bucket, "data/blob.bin"))
    url = mc.presigned_get_object(bucket, "copy/blob.bin")
    assert httpx.get(url, timeout=60).content == data

    mc.remove_object(bucket, "copy/blob.bin")
    errors = list(mc.remove_objects(bucket, [DeleteObject("data/blob.bin"), DeleteObject("data/nested/file.txt")]))
    assert errors == []
    assert list(mc.list_objects(bucket, recursive=True)) == []


def test_minio_sdk_multipart_upload(where, creds):
    _, at = where
    mc = _minio(at, creds)
    bucket = unique("mp")
    mc.make_bucket(bucket)
    data = os.urandom(12 * 1024 * 1024 + 5)
    # An unknown length: the SDK uploads parts of part_size until the stream ends.
    mc.put_object(bucket, "big.bin", io.BytesIO(data), -1, part_size=5 * 1024 * 1024)
    resp = mc.get_object(bucket, "big.bin", offset=5 * 1024 * 1024, length=1024)
    try:
        assert resp.read() == data[5 * 1024 * 1024 : 5 * 1024 * 1024 + 1024]
    finally:
        resp.close()
        resp.release_conn()
    assert mc.stat_object(bucket, "big.bin").size == len(data)


def test_minio_sdk_errors(where, creds):
    _, at = where
    mc = _minio(at, creds)
    bucket = unique("er")
    mc.make_bucket(bucket)
    with pytest.raises(MinioError) as e:
        mc.stat_object(bucket, "missing.txt")
    assert e.value.code == "NoSuchKey"
    with pytest.raises(MinioError) as e:
        mc.get_object("no-such-bucket-here", "x")
    assert e.value.code == "NoSuchBucket"
    wrong = minio.Minio(urlsplit(at.s3_url).netloc, creds.access_key, "x" * 40, secure=False, region=REGION)
    with pytest.raises(MinioError) as e:
        wrong.bucket_exists(bucket) and wrong.list_objects(bucket).__next__()
    assert e.value.code in ("SignatureDoesNotMatch", "AccessDenied")


TORCH_SCRIPT = """
import sys
import torch
from s3torchconnector import S3Checkpoint, S3ClientConfig, S3IterableDataset, S3MapDataset

bucket, endpoint = sys.argv[1], sys.argv[2]
cfg = S3ClientConfig(force_path_style=True)
kw = dict(region="us-east-1", endpoint=endpoint, s3client_config=cfg)
ds = S3MapDataset.from_prefix(f"s3://{bucket}/train/", **kw)
assert len(ds) == 3, len(ds)
assert [(o.key, o.read()) for o in ds] == [(f"train/s{i}.bin", bytes([i]) * (1000 + i)) for i in range(3)]
it = S3IterableDataset.from_prefix(f"s3://{bucket}/train/", **kw)
assert [o.key for o in it] == [f"train/s{i}.bin" for i in range(3)]
ck = S3Checkpoint(**kw)
state = {"w": torch.arange(1 << 20, dtype=torch.float32)}
with ck.writer(f"s3://{bucket}/ckpt/model.pt") as w:
    torch.save(state, w)
with ck.reader(f"s3://{bucket}/ckpt/model.pt") as r:
    assert torch.equal(torch.load(r)["w"], state["w"])
print("ok")
"""


@requires(lambda: None if importlib.util.find_spec("s3torchconnector") else "s3torchconnector is not installed (the torch extra)")
def test_s3torchconnector_dataset_and_checkpoint(where, creds):
    hub, at = where
    s3 = hub.boto3(creds)
    bucket = unique("tc")
    s3.create_bucket(Bucket=bucket)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"train/s{i}.bin", Body=bytes([i]) * (1000 + i))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=creds.access_key, AWS_SECRET_ACCESS_KEY=creds.secret_key, AWS_EC2_METADATA_DISABLED="true")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TORCH_SCRIPT), bucket, at.s3_url],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    assert s3.head_object(Bucket=bucket, Key="ckpt/model.pt")["ContentLength"] > 4 << 20
