"""A real S3 endpoint for tests: moto's server in a subprocess on loopback.

Usage::

    with start_moto() as endpoint_url:
        boto3.client("s3", endpoint_url=endpoint_url).create_bucket(Bucket="b")

While the context is open the process environment holds dummy AWS
credentials (and no profile or config file), so boto3 clients created by the
code under test authenticate against moto and can never reach real AWS
accounts; the previous environment is restored on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
# Removed while moto runs: they would point boto3 at real credentials.
_UNSET_AWS_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP reply means the server is up
    except OSError:
        return False


@contextlib.contextmanager
def _aws_test_env() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in (*DUMMY_AWS_ENV, *_UNSET_AWS_ENV)}
    for name in _UNSET_AWS_ENV:
        os.environ.pop(name, None)
    os.environ.update(DUMMY_AWS_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _launch(port: int, log_path: str, timeout: float) -> subprocess.Popen[bytes] | None:
    """Start moto on ``port``; return it once it answers, None if it exited (port taken)."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if _answers(f"http://127.0.0.1:{port}/moto-api/"):
            return proc
        time.sleep(0.1)
    _stop(proc)
    with open(log_path, errors="replace") as log:
        tail = log.read()[-2000:]
    raise RuntimeError(f"moto server did not answer within {timeout:.0f}s:\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def start_moto(timeout: float = 60.0) -> Iterator[str]:
    """Run a moto S3 server on a free loopback port; yield its endpoint URL."""
    fd, log_path = tempfile.mkstemp(prefix="moto-", suffix=".log")
    os.close(fd)
    try:
        with _aws_test_env():
            for _ in range(3):  # the free port may be taken before moto binds it
                port = _free_port()
                proc = _launch(port, log_path, timeout)
                if proc is not None:
                    break
            else:
                with open(log_path, errors="replace") as log:
                    tail = log.read()[-2000:]
                raise RuntimeError(f"moto server failed to start:\n{tail}")
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                _stop(proc)
    finally:
        os.unlink(log_path)
