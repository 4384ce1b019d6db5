"""A real hub with its S3 listener, and the S3 clients the tests drive against it.

::

    with start_s3_hub(tmp_path / "hub") as s3hub:
        creds = s3hub.token(admin=True)                 # fabric token + its S3 key pair
        s3 = s3hub.boto3(creds)                          # boto3 client on the S3 listener
        s3hub.aws(creds, "s3", "ls")                     # the AWS CLI (tools venv)

Client tools that pin another botocore than the test venv's boto3 (the AWS
CLI v1, s3fs/aiobotocore, awscrt) live in a separate virtual environment:
``$FABRIC_S3_TOOLS`` (a venv directory; when set, only there), else
``.venv-s3tools`` at the repository root, else ``/tmp/awscli-venv``. Create one with::

    python3 -m venv .venv-s3tools && .venv-s3tools/bin/pip install awscli s3fs awscrt

Tests that need a tool carry one of the marks below (``needs_aws``, ...): skipped
without the tool, failed under CI (tests/ci_requirements.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import httpx

from fabric.util.net import free_port
from tests.ci_requirements import requires
from tests.hubserver import ROOT, Hub, start_hub

REGION = "us-east-1"


def tools_venv() -> str | None:
    explicit = os.environ.get("FABRIC_S3_TOOLS")
    for cand in (explicit,) if explicit else (os.path.join(ROOT, ".venv-s3tools"), "/tmp/awscli-venv"):
        if os.path.isfile(os.path.join(cand, "bin", "python")):
            return cand
    return None


def aws_binary() -> str | None:
    venv = tools_venv()
    if venv and os.path.isfile(os.path.join(venv, "bin", "aws")):
        return os.path.join(venv, "bin", "aws")
    return os.environ.get("FABRIC_AWS_CLI") or shutil.which("aws")


def tools_python(module: str) -> str | None:
    """The tools venv's python when it can import ``module``."""
    venv = tools_venv()
    if not venv:
        return None
    py = os.path.join(venv, "bin", "python")
    ok = subprocess.run([py, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0
    return py if ok else None


def _tool_reason(found: Callable[[], str | None], what: str) -> Callable[[], str | None]:
    return lambda: None if found() else what


needs_aws = requires(_tool_reason(aws_binary, "the AWS CLI is not installed (see tests/s3_helpers.py)"))
needs_s3fs = requires(_tool_reason(lambda: tools_python("s3fs"), "no tools venv with s3fs (see tests/s3_helpers.py)"))
needs_awscrt = requires(_tool_reason(lambda: tools_python("awscrt.s3"), "no tools venv with awscrt (see tests/s3_helpers.py)"))
needs_rclone = requires(_tool_reason(lambda: shutil.which("rclone"), "rclone is not installed (apt-get install rclone)"))


def unique(stem: str = "b") -> str:
    return f"{stem}-{uuid.uuid4().hex[:10]}"


@dataclass
class Creds:
    token: str
    access_key: str
    secret_key: str
    token_id: str


@dataclass
class S3Hub:
    hub: Hub
    s3_url: str

    @property
    def url(self) -> str:
        return self.hub.url

    def rest(self, token: str | None = None) -> httpx.Client:
        return self.hub.client(token if token else True)

    def plane(self, token: str | None = None):
        return self.hub.plane(token if token else True)

    def token(self, admin: bool = False, roles: dict[str, str] | None = None, name: str = "s3-test") -> Creds:
        with self.rest() as c:
            r = c.post("/api/v1/tokens", json={"name": name, "admin": admin, "roles": roles or {}})
            r.raise_for_status()
            d = r.json()
        return Creds(d["token"], d["s3_access_key_id"], d["s3_secret_access_key"], d["id"])

    def boto3(self, creds: Creds, **config):
        import boto3
        from botocore.config import Config

        cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"}, **config)
        return boto3.client(
            "s3",
            endpoint_url=self.s3_url,
            aws_access_key_id=creds.access_key,
            aws_secret_access_key=creds.secret_key,
            region_name=REGION,
            config=cfg,
        )

    def tool_env(self, creds: Creds) -> dict:
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("AWS_"):
                del env[k]
        env.update(
            AWS_ACCESS_KEY_ID=creds.access_key,
            AWS_SECRET_ACCESS_KEY=creds.secret_key,
            AWS_DEFAULT_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            AWS_CONFIG_FILE="/dev/null",
            AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        )
        return env

    def aws(self, creds: Creds, *args: str, check: bool = True, input: bytes | None = None, timeout: float = 300):
        aws = aws_binary()
        assert aws, "the AWS CLI is not installed (see tests/s3_helpers.py)"
        proc = subprocess.run(
            [aws, "--endpoint-url", self.s3_url, *args], env=self.tool_env(creds), capture_output=True,
            input=input, timeout=timeout, check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"aws {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
        return proc

    def aws_json(self, creds: Creds, *args: str) -> dict:
        out = self.aws(creds, *args, "--output", "json").stdout.decode()
        return json.loads(out) if out.strip() else {}

    def s3_metrics(self) -> str:
        return httpx.get(self.s3_url + "/_fabric/metrics", timeout=10).text


def _wait_s3(url: str, hub: Hub, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/_fabric/healthz", timeout=1.0, verify=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if hub.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"the S3 listener at {url} did not come up:\n{hub.log()[-3000:]}")


@contextlib.contextmanager
def start_s3_hub(data, args: Sequence[str] = (), tls: tuple[str, str] | None = None, **kwargs) -> Iterator[S3Hub]:
    """A hub subprocess with ``--s3-listen`` on a free port (``tls``: (cert, key) files)."""
    port = free_port()
    extra = ["--s3-listen", f"127.0.0.1:{port}", *args]
    if tls:
        extra += ["--tls-cert", tls[0], "--tls-key", tls[1]]
    with start_hub(data, args=extra, **kwargs) if not tls else _start_tls_hub(data, extra, tls, **kwargs) as hub:
        scheme = "https" if tls else "http"
        url = f"{scheme}://127.0.0.1:{port}"
        _wait_s3(url, hub)
        yield S3Hub(hub, url)


@contextlib.contextmanager
def _start_tls_hub(data, extra, tls, **kwargs) -> Iterator[Hub]:
    """start_hub waits for plain-HTTP health; with TLS the REST listener speaks HTTPS, so wait here."""
    import subprocess as sp
    import sys

    from tests.hubserver import hub_env, stop

    data = str(data)
    os.makedirs(os.path.dirname(os.path.abspath(data)), exist_ok=True)
    port = free_port()
    log_path = os.path.abspath(data).rstrip("/") + f".{port}.log"
    argv = [sys.executable, "-m", "fabric.cli.main", "hub", "--data", data, "--listen", f"127.0.0.1:{port}", *extra]
    with open(log_path, "wb") as log:
        proc = sp.Popen(argv, stdout=log, stderr=sp.STDOUT, env=hub_env(), cwd=ROOT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                with open(log_path, errors="replace") as f:
                    raise RuntimeError(f.read()[-3000:])
            try:
                if httpx.get(url + "/healthz", timeout=1.0, verify=ssl.create_default_context(cafile=tls[0])).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        with open(os.path.join(data, "admin.token")) as f:
            token = f.read().strip()
        yield Hub(url, token, data, proc, log_path)
    finally:
        stop(proc)


def self_signed_cert(directory: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1/localhost and its key (PEM files)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = os.path.join(directory, "cert.pem")
    key_path = os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def staged_paths(s3hub: S3Hub, repo: str, branch: str = "main") -> list[str]:
    """Paths with uncommitted changes on a branch (what an S3 write would have left)."""
    with s3hub.rest() as c:
        r = c.get(f"/api/v1/repos/{repo}/branches/{branch}/changes")
        r.raise_for_status()
        return [ch["path"] for ch in r.json()["changes"]]
