"""Real S3 tools against a real hub's S3 listener: the AWS CLI, s3fs (fsspec) and rclone.

The AWS CLI and s3fs pin a botocore that differs from the test venv's boto3, so
they run from a tools venv (see tests/s3_helpers.py); rclone is the system binary.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import ssl
import subprocess
import textwrap

import pytest

from tests.s3_helpers import (
    S3Hub,
    needs_aws,
    needs_awscrt,
    needs_rclone,
    needs_s3fs,
    staged_paths,
    start_s3_hub,
    tools_python,
    unique,
)

MiB = 1024 * 1024



@pytest.fixture(scope="module")
def s3hub(tmp_path_factory) -> S3Hub:
    with start_s3_hub(tmp_path_factory.mktemp("s3tools") / "data") as h:
        yield h


@pytest.fixture(scope="module")
def admin(s3hub):
    return s3hub.token(admin=True, name="tools-admin")


def make_tree(root: str, seed: int = 1) -> dict[str, bytes]:
    """A small tree with nested directories, odd names, an empty file and one multipart-sized file."""
    import random

    rnd = random.Random(seed)
    files = {
        "README.md": b"# tree\n",
        "empty.txt": b"",
        "a/b/c/deep.bin": rnd.randbytes(70_000),
        "a/one.txt": b"one\n" * 100,
        "with space/name+plus&amp.txt": b"odd names\n",
        "unicode/é中文.txt": "héllo".encode(),
        "big/large.bin": rnd.randbytes(9 * MiB + 17),
    }
    for i in range(20):
        files[f"many/f{i:03d}.dat"] = rnd.randbytes(rnd.randint(1, 5000))
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return files


def assert_same_tree(a: str, b: str) -> None:
    def listing(root: str) -> dict[str, str]:
        out = {}
        for dirpath, _, names in os.walk(root):
            for n in names:
                p = os.path.join(dirpath, n)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
        return out

    assert listing(a) == listing(b)


# -- the AWS CLI -----------------------------------------------------------------------
@needs_aws
def test_aws_cli_cp_sync_ls(s3hub, admin, tmp_path):
    repo = unique("cli")
    s3hub.plane().create_repo(repo)
    src = tmp_path / "src"
    files = make_tree(str(src))
    s3hub.aws(admin, "s3", "cp", str(src / "README.md"), f"s3://{repo}/main/README.md")
    s3hub.aws(admin, "s3", "sync", str(src), f"s3://{repo}/main/tree/")
    out = s3hub.aws(admin, "s3", "ls", "--recursive", f"s3://{repo}/main/tree/").stdout.decode()
    listed = sorted(line.split(None, 3)[3] for line in out.splitlines() if line.strip())
    assert listed == sorted(f"main/tree/{k}" for k in files)
    # Nothing left to do on a second sync.
    again = s3hub.aws(admin, "s3", "sync", str(src), f"s3://{repo}/main/tree/").stdout.decode()
    assert "upload:" not in again
    # And back: s3 -> local, byte for byte.
    back = tmp_path / "back"
    s3hub.aws(admin, "s3", "sync", f"s3://{repo}/main/tree/", str(back))
    assert_same_tree(str(src), str(back))
    s3hub.aws(admin, "s3", "cp", f"s3://{repo}/main/tree/big/large.bin", str(tmp_path / "large.bin"))
    assert filecmp.cmp(src / "big" / "large.bin", tmp_path / "large.bin", shallow=False)
    # Multipart upload from the CLI (9 MiB > its 8 MiB threshold): S3-style ETag.
    head = s3hub.aws_json(admin, "s3api", "head-object", "--bucket", repo, "--key", "main/tree/big/large.bin")
    assert head["ETag"].endswith('-2"')
    # sync --delete removes what the source lacks; a commit makes it permanent.
    os.remove(src / "a" / "one.txt")
    s3hub.aws(admin, "s3", "sync", "--delete", str(src), f"s3://{repo}/main/tree/")
    assert "tree/a/one.txt" not in [p for p in staged_paths(s3hub, repo)]
    s3hub.plane().commit(repo, "main", "from the AWS CLI")
    out = s3hub.aws(admin, "s3", "ls", f"s3://{repo}/main/tree/a/").stdout.decode()
    assert "one.txt" not in out and "b/" in out
    # `aws s3 ls` of the bucket lists refs as prefixes; of the service, the buckets.
    assert "PRE main/" in s3hub.aws(admin, "s3", "ls", f"s3://{repo}").stdout.decode()
    assert repo in s3hub.aws(admin, "s3", "ls").stdout.decode()


@needs_aws
def test_aws_cli_s3api_conditional_and_range(s3hub, admin, tmp_path):
    repo = unique("api")
    s3hub.plane().create_repo(repo)
    body = tmp_path / "body"
    body.write_bytes(bytes(range(256)) * 4)
    put = s3hub.aws_json(admin, "s3api", "put-object", "--bucket", repo, "--key", "main/k", "--body", str(body))
    etag = put["ETag"]
    out = tmp_path / "out"
    r = s3hub.aws_json(admin, "s3api", "get-object", "--bucket", repo, "--key", "main/k", "--range", "bytes=100-199", str(out))
    assert r["ContentRange"] == "bytes 100-199/1024" and out.read_bytes() == body.read_bytes()[100:200]
    r = s3hub.aws_json(admin, "s3api", "get-object", "--bucket", repo, "--key", "main/k", "--if-match", etag, str(out))
    assert out.read_bytes() == body.read_bytes()
    p = s3hub.aws(admin, "s3api", "get-object", "--bucket", repo, "--key", "main/k", "--if-match", '"nope"', str(out), check=False)
    assert p.returncode != 0 and (b"412" in p.stderr or b"PreconditionFailed" in p.stderr)
    p = s3hub.aws(admin, "s3api", "get-object", "--bucket", repo, "--key", "main/k", "--if-none-match", etag, str(out), check=False)
    assert p.returncode != 0 and b"304" in p.stderr
    p = s3hub.aws(
        admin, "s3api", "get-object", "--bucket", repo, "--key", "main/k", "--if-unmodified-since", "2001-01-01T00:00:00Z",
        str(out), check=False,
    )
    assert p.returncode != 0 and (b"412" in p.stderr or b"PreconditionFailed" in p.stderr)
    p = s3hub.aws(admin, "s3api", "put-object", "--bucket", repo, "--key", "main/k", "--body", str(body), "--if-none-match", "*", check=False)
    assert p.returncode != 0 and b"PreconditionFailed" in p.stderr
    r = s3hub.aws_json(admin, "s3api", "list-objects-v2", "--bucket", repo, "--prefix", "main/")
    assert [o["Key"] for o in r["Contents"]] == ["main/k"]


# -- s3fs (fsspec) ---------------------------------------------------------------------
S3FS_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import s3fs
    endpoint, key, secret, bucket, src, dst = sys.argv[1:7]
    fs = s3fs.S3FileSystem(key=key, secret=secret, client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
                           use_listings_cache=False)
    fs.put(src.rstrip("/") + "/", f"{bucket}/up/", recursive=True)
    found = sorted(fs.find(f"{bucket}/up"))
    with fs.open(f"{bucket}/up/a/one.txt", "rb") as f:
        f.seek(4)
        partial = f.read(8)
    with fs.open(f"{bucket}/written.bin", "wb", block_size=5 * 1024 * 1024) as f:
        for i in range(3):
            f.write(bytes([i]) * (3 * 1024 * 1024))
    info = fs.info(f"{bucket}/written.bin")
    fs.get(f"{bucket}/up/", dst.rstrip("/") + "/", recursive=True)
    print(json.dumps({"found": found, "partial": partial.decode(), "size": info["size"],
                      "ls": sorted(fs.ls(f"{bucket}/up", detail=False)),
                      "written_md5": hashlib.md5(fs.cat(f"{bucket}/written.bin")).hexdigest()}))
    """
)


@needs_s3fs
def test_s3fs_lists_reads_writes_a_tree(s3hub, admin, tmp_path):
    bucket = unique("fsspec")
    s3hub.boto3(admin).create_bucket(Bucket=bucket)  # bound to main: plain keys
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = make_tree(str(src))
    os.makedirs(dst)
    script = tmp_path / "s3fs_run.py"
    script.write_text(S3FS_SCRIPT)
    p = subprocess.run(
        [tools_python("s3fs"), str(script), s3hub.s3_url, admin.access_key, admin.secret_key, bucket, str(src), str(dst)],
        capture_output=True, timeout=300, env=s3hub.tool_env(admin), check=False,
    )
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    assert r["found"] == sorted(f"{bucket}/up/{k}" for k in files)
    assert r["partial"] == (b"one\n" * 100)[4:12].decode()
    assert r["size"] == 9 * MiB
    assert f"{bucket}/up/a" in r["ls"] and f"{bucket}/up/README.md" in r["ls"]
    want = hashlib.md5(b"".join(bytes([i]) * (3 * MiB) for i in range(3))).hexdigest()
    assert r["written_md5"] == want
    assert_same_tree(str(src), str(dst))
    assert s3hub.plane().read(bucket, "main", "up/big/large.bin") == files["big/large.bin"]


# -- rclone ----------------------------------------------------------------------------
def _rclone(s3hub: S3Hub, admin, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env.update(
        RCLONE_CONFIG="/dev/null",
        RCLONE_CONFIG_FAB_TYPE="s3",
        RCLONE_CONFIG_FAB_PROVIDER="Other",
        RCLONE_CONFIG_FAB_ENV_AUTH="false",
        RCLONE_CONFIG_FAB_ACCESS_KEY_ID=admin.access_key,
        RCLONE_CONFIG_FAB_SECRET_ACCESS_KEY=admin.secret_key,
        RCLONE_CONFIG_FAB_ENDPOINT=s3hub.s3_url,
        RCLONE_CONFIG_FAB_REGION="us-east-1",
        RCLONE_CONFIG_FAB_FORCE_PATH_STYLE="true",
    )
    p = subprocess.run(["rclone", *args], env=env, capture_output=True, timeout=300, check=False)
    assert p.returncode == 0, f"rclone {' '.join(args)}: {p.stderr.decode()[-3000:]}"
    return p


@needs_rclone
def test_rclone_copy_ls_check_both_ways(s3hub, admin, tmp_path):
    repo = unique("rcl")
    s3hub.plane().create_repo(repo)
    src, back = tmp_path / "src", tmp_path / "back"
    files = make_tree(str(src))
    _rclone(s3hub, admin, "copy", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M", str(src), f"fab:{repo}/main/tree")
    out = _rclone(s3hub, admin, "lsf", "-R", "--files-only", f"fab:{repo}/main/tree").stdout.decode()
    assert sorted(out.splitlines()) == sorted(files)
    _rclone(s3hub, admin, "check", str(src), f"fab:{repo}/main/tree")
    _rclone(s3hub, admin, "copy", f"fab:{repo}/main/tree", str(back))
    assert_same_tree(str(src), str(back))
    # A bound bucket looks like an ordinary bucket to rclone.
    bucket = unique("rclb")
    s3hub.plane().commit(repo, "main", "rclone upload")
    s3hub.plane().create_bucket(bucket, repo, "main")
    out = _rclone(s3hub, admin, "lsf", f"fab:{bucket}/tree").stdout.decode()
    assert "README.md" in out.splitlines() and "a/" in out.splitlines()
    _rclone(s3hub, admin, "sync", str(src), f"fab:{bucket}/tree")
    _rclone(s3hub, admin, "check", str(src), f"fab:{bucket}/tree")


# -- the AWS Common Runtime (what the AWS CLI v2 is built on) ------------------------------
CRT_SCRIPT = textwrap.dedent(
    '''
    import hashlib, json, os, sys, threading
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import (S3ChecksumAlgorithm, S3ChecksumConfig, S3ChecksumLocation, S3Client, S3RequestTlsMode,
                           S3RequestType)

    endpoint, key, secret, bucket, obj, size, workdir = sys.argv[1:8]
    size = int(size)
    host = endpoint.split("://", 1)[1]
    elg = EventLoopGroup(2)
    client = S3Client(bootstrap=ClientBootstrap(elg, DefaultHostResolver(elg)), region="us-east-1",
                      credential_provider=AwsCredentialsProvider.new_static(key, secret),
                      tls_mode=S3RequestTlsMode.DISABLED, part_size=5 * 1024 * 1024,
                      multipart_upload_threshold=5 * 1024 * 1024)
    data = os.urandom(size)
    src = os.path.join(workdir, "crt_src.bin")
    with open(src, "wb") as f:
        f.write(data)

    def run(kind, headers, path, **kw):
        done, result = threading.Event(), {}
        def on_done(error=None, error_body=None, status_code=None, **_):
            result.update(error=error, body=error_body, status=status_code)
            done.set()
        method = "PUT" if kind == S3RequestType.PUT_OBJECT else "GET"
        client.make_request(type=kind, request=HttpRequest(method, path, HttpHeaders(headers)), on_done=on_done, **kw)
        done.wait(120)
        if result.get("error"):
            raise SystemExit(f"{method}: {result['error']} {result.get('status')} {result.get('body')}")

    path = f"/{bucket}/{obj}"
    run(S3RequestType.PUT_OBJECT, [("Host", host), ("Content-Length", str(size)), ("Content-Type", "application/octet-stream")],
        path, send_filepath=src,
        checksum_config=S3ChecksumConfig(algorithm=S3ChecksumAlgorithm.CRC32, location=S3ChecksumLocation.TRAILER))
    dst = src + ".back"
    run(S3RequestType.GET_OBJECT, [("Host", host)], path, recv_filepath=dst)
    with open(dst, "rb") as f:
        print(json.dumps({"same": f.read() == data, "md5": hashlib.md5(data).hexdigest()}))
    '''
)


@needs_awscrt
@pytest.mark.parametrize("size", [1000, 12 * MiB])
def test_crt_client_aws_chunked_trailing_checksums(s3hub, admin, tmp_path, size):
    """The CRT S3 client sends aws-chunked bodies with a trailing CRC32 (STREAMING-UNSIGNED-PAYLOAD-TRAILER),
    uploads large objects in parallel parts and downloads them with parallel ranged GETs."""
    repo = unique("crt")
    s3hub.plane().create_repo(repo)
    script = tmp_path / "crt_run.py"
    script.write_text(CRT_SCRIPT)
    p = subprocess.run(
        [tools_python("awscrt.s3"), str(script), s3hub.s3_url, admin.access_key, admin.secret_key, repo, "main/crt.bin",
         str(size), str(tmp_path)],
        capture_output=True, timeout=300, env=s3hub.tool_env(admin), check=False,
    )
    assert p.returncode == 0, (p.stdout + p.stderr).decode()[-3000:]
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    assert r["same"]
    assert 'fabric_s3_payloads{mode="STREAMING-UNSIGNED-PAYLOAD-TRAILER"}' in s3hub.s3_metrics()
    entry = s3hub.plane().stat(repo, "main", "crt.bin")
    assert entry.size == size
    if size < 5 * MiB:
        assert entry.md5 == r["md5"]
    else:
        assert entry.md5.endswith("-3")


# -- boto3 over HTTPS: trailing checksums in aws-chunked bodies -------------------------------
def test_boto3_over_https_sends_trailing_checksums(tmp_path):
    import boto3.s3.transfer

    from tests.s3_helpers import self_signed_cert

    cert, key = self_signed_cert(str(tmp_path))
    with start_s3_hub(tmp_path / "tls", tls=(cert, key)) as h:
        import httpx

        ctx = ssl.create_default_context(cafile=cert)
        with httpx.Client(base_url=h.url, verify=ctx, headers={"Authorization": f"Bearer {h.hub.token}"}) as c:
            d = c.post("/api/v1/tokens", json={"name": "tls", "admin": True}).json()
            c.post("/api/v1/repos", json={"name": "tls-repo"}).raise_for_status()
        from tests.s3_helpers import Creds

        creds = Creds(d["token"], d["s3_access_key_id"], d["s3_secret_access_key"], d["id"])
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3", endpoint_url=h.s3_url, aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key,
            region_name="us-east-1", verify=cert, config=Config(s3={"addressing_style": "path"}),
        )
        data = os.urandom(3 * MiB)
        s3.put_object(Bucket="tls-repo", Key="main/a.bin", Body=io_bytes(data))
        assert s3.get_object(Bucket="tls-repo", Key="main/a.bin")["Body"].read() == data
        big = os.urandom(17 * MiB)
        cfg = boto3.s3.transfer.TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
        s3.upload_fileobj(io_bytes(big), "tls-repo", "main/big.bin", Config=cfg)
        assert s3.get_object(Bucket="tls-repo", Key="main/big.bin")["Body"].read() == big
        assert "aws-chunked" not in s3.head_object(Bucket="tls-repo", Key="main/a.bin").get("ContentEncoding", "")
        metrics = httpx.get(h.s3_url + "/_fabric/metrics", verify=ctx).text
        assert 'op="PutObject",status="200"' in metrics and 'op="UploadPart",status="200"' in metrics
        # Over TLS botocore streams bodies as aws-chunked with a trailing checksum.
        assert 'fabric_s3_payloads{mode="STREAMING-UNSIGNED-PAYLOAD-TRAILER"}' in metrics


def io_bytes(data: bytes):
    import io

    return io.BytesIO(data)
