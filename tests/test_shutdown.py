"""SIGTERM stops a hub and a spoke promptly and quietly, even with responses still streaming:
a watch stream that never ends, S3 and REST downloads whose client stopped reading."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import httpx
import pytest

from fabric.util.net import free_port
from tests.s3_helpers import Creds, S3Hub, _wait_s3, start_s3_hub, unique
from tests.spokeserver import start_spoke

pytestmark = pytest.mark.timeout(300)

BIG = 48 << 20
#: The grace period for responses in flight (fabric/api/serving.py) plus time to start and end.
PROMPT = 15.0


def _stop(proc: subprocess.Popen) -> tuple[int, float]:
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(PROMPT * 2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return -1, time.monotonic() - start
    return rc, time.monotonic() - start


def _assert_quiet(log: str) -> None:
    for bad in ("Traceback", "CancelledError", "Exception in ASGI application", "ERROR"):
        assert bad not in log, f"{bad!r} in the log:\n{log[-4000:]}"


@contextlib.contextmanager
def _open_streams(at: S3Hub, rest_url: str, token: str, creds: Creds, bucket: str, rest_path: str, watch: bool):
    """Streams left open at shutdown: each one read a little, then not at all."""
    s3 = at.boto3(creds)
    with contextlib.ExitStack() as stack:
        body = s3.get_object(Bucket=bucket, Key="big")["Body"]
        stack.callback(body.close)
        assert len(body.read(1 << 20)) == 1 << 20
        client = stack.enter_context(httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}))
        rest = stack.enter_context(client.stream("GET", rest_url + rest_path))
        assert rest.status_code == 200
        next(rest.iter_bytes(1 << 16))
        if watch:
            w = stack.enter_context(client.stream("GET", rest_url + "/api/v1/watch"))
            assert b"heartbeat" in next(w.iter_lines()).encode()
        yield


def test_hub_stops_promptly_and_quietly_with_open_streams(tmp_path):
    with start_s3_hub(tmp_path / "hub") as s3hub:
        creds = s3hub.token(admin=True)
        bucket = unique("shut")
        s3hub.boto3(creds).create_bucket(Bucket=bucket)
        s3hub.boto3(creds).put_object(Bucket=bucket, Key="big", Body=os.urandom(BIG))
        path = f"/api/v1/repos/{bucket}/refs/main/objects?path=big"
        with _open_streams(s3hub, s3hub.url, s3hub.hub.token, creds, bucket, path, watch=True):
            rc, took = _stop(s3hub.hub.proc)
        log = s3hub.hub.log()
    assert rc == 0 and took < PROMPT, f"exit {rc} after {took:.1f}s:\n{log[-3000:]}"
    _assert_quiet(log)


def test_spoke_stops_promptly_and_quietly_with_open_streams(tmp_path):
    with start_s3_hub(tmp_path / "hub") as s3hub:
        creds = s3hub.token(admin=True)
        bucket = unique("shut")
        s3hub.boto3(creds).create_bucket(Bucket=bucket)
        s3hub.boto3(creds).put_object(Bucket=bucket, Key="big", Body=os.urandom(BIG))
        port = free_port()
        with start_spoke(
            s3hub.url, tmp_path / "cache", "256MiB", token=s3hub.hub.token, args=["--s3-listen", f"127.0.0.1:{port}"]
        ) as spoke:
            s3_url = f"http://127.0.0.1:{port}"
            _wait_s3(s3_url, s3hub.hub)
            path = f"/api/v1/repos/{bucket}/refs/main/objects?path=big"
            with _open_streams(S3Hub(s3hub.hub, s3_url), spoke.url, s3hub.hub.token, creds, bucket, path, watch=False):
                rc, took = _stop(spoke.proc)
            log = spoke.log()
    assert rc == 0 and took < PROMPT, f"exit {rc} after {took:.1f}s:\n{log[-3000:]}"
    _assert_quiet(log)
