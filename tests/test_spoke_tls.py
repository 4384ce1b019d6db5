"""``fabric spoke --tls-cert/--tls-key`` serves HTTPS on its REST and S3 listeners (issue 11.3)."""

from __future__ import annotations

import io
import os
import ssl
import subprocess
import sys
import time

import httpx
import pytest

from fabric.util.net import free_port
from tests.hubserver import ROOT, hub_env, start_hub, stop, unique_name
from tests.s3_helpers import self_signed_cert

pytestmark = pytest.mark.timeout(180)


def wait_https(url: str, cert: str, proc: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, open(log_path, "rb").read()[-3000:].decode("utf-8", "replace")
        try:
            if httpx.get(url, verify=ssl.create_default_context(cafile=cert), timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def test_spoke_serves_rest_and_s3_over_tls(tmp_path) -> None:
    cert, key = self_signed_cert(str(tmp_path))
    with start_hub(tmp_path / "hub") as hub:
        repo = unique_name("tls")
        plane = hub.plane()
        plane.create_repo(repo)
        plane.put_object(repo, "main", "f.txt", io.BytesIO(b"over tls"))
        plane.commit(repo, "main", "data")
        spoke_token = plane.create_token("spoke", roles={"*": "write"}, rights=["spoke"])["token"]
        user = plane.create_token("user", roles={repo: "read"})
        port, s3_port = free_port(), free_port()
        log_path = str(tmp_path / "spoke.log")
        argv = [
            sys.executable, "-m", "fabric.cli.main", "spoke", "--hub", hub.url, "--cache", str(tmp_path / "cache"),
            "--cache-size", "64MiB", "--listen", f"127.0.0.1:{port}", "--s3-listen", f"127.0.0.1:{s3_port}",
            "--token", spoke_token, "--tls-cert", cert, "--tls-key", key,
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=hub_env(), cwd=ROOT)
        try:
            wait_https(f"https://127.0.0.1:{port}/healthz", cert, proc, log_path)
            wait_https(f"https://127.0.0.1:{s3_port}/_fabric/healthz", cert, proc, log_path)
            headers = {"Authorization": f"Bearer {user['token']}"}
            trust = ssl.create_default_context(cafile=cert)
            with httpx.Client(base_url=f"https://127.0.0.1:{port}", headers=headers, verify=trust, timeout=30) as c:
                r = c.get(f"/api/v1/repos/{repo}/refs/main/objects", params={"path": "f.txt"})
                assert r.status_code == 200 and r.content == b"over tls"
            # The fabric client trusts it through FABRIC_CA_BUNDLE.
            os.environ["FABRIC_CA_BUNDLE"] = cert
            try:
                from fabric.client.http import HttpPlane

                assert HttpPlane(f"https://127.0.0.1:{port}", user["token"]).read(repo, "main", "f.txt") == b"over tls"
            finally:
                del os.environ["FABRIC_CA_BUNDLE"]
            # Plain HTTP is not served, and a client that does not trust the certificate refuses it.
            with pytest.raises(httpx.TransportError):
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=5)
            # S3 over HTTPS, with a boto3 client that trusts the certificate.
            import boto3
            from botocore.config import Config

            s3 = boto3.client(
                "s3", endpoint_url=f"https://127.0.0.1:{s3_port}", aws_access_key_id=user["s3_access_key_id"],
                aws_secret_access_key=user["s3_secret_access_key"], region_name="us-east-1", verify=cert,
                config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"}),
            )
            assert s3.get_object(Bucket=repo, Key="main/f.txt")["Body"].read() == b"over tls"
        finally:
            stop(proc)


def test_spoke_tls_options_go_together(tmp_path) -> None:
    cert, _key = self_signed_cert(str(tmp_path))
    argv = [
        sys.executable, "-m", "fabric.cli.main", "spoke", "--hub", "http://127.0.0.1:9", "--cache", str(tmp_path / "c"),
        "--cache-size", "64MiB", "--tls-cert", cert,
    ]
    proc = subprocess.run(argv, env=hub_env(), cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 2 and b"--tls-cert and --tls-key go together" in proc.stderr
