"""A real hub for tests: ``fabric hub`` in a subprocess on a free loopback port.

Usage::

    with start_hub(tmp_path / "hub") as hub:            # SQLite catalog in DIR
        r = hub.client().get("/api/v1/repos")            # admin token attached
        hub.plane().create_repo("datasets")              # fabric.client.http.HttpPlane
        hub.rss()                                        # resident bytes of the hub process
        hub.log()                                        # everything it wrote to stdout/stderr

``start_hub(DIR, db=URL)`` uses another catalog (``postgresql://…``);
``no_auth=True`` starts it with ``--no-auth``. The hub's stdout and stderr go
to ``DIR.log`` (a file, not a pipe, so a chatty hub never blocks). On exit the
hub gets SIGTERM, then SIGKILL if it has not stopped within 10 seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from fabric.util.net import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT = 60.0


@dataclass
class Hub:
    url: str  # http://127.0.0.1:PORT
    token: str | None  # the bootstrap admin token (None with --no-auth before it exists)
    data: str  # the data directory
    proc: subprocess.Popen
    log_path: str
    db: str | None = None

    @property
    def api(self) -> str:
        return self.url + "/api/v1"

    def client(self, token: str | None | bool = True, **kwargs) -> httpx.Client:
        """An httpx client on ``/`` of the hub; ``token=True`` uses the admin token, ``None``/False none."""
        if token is True:
            token = self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kwargs.pop("headers", {}))
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 120.0), **kwargs)

    def plane(self, token: str | None | bool = True):  # -> fabric.client.http.HttpPlane
        from fabric.client.http import HttpPlane

        return HttpPlane(self.url, self.token if token is True else (token or None))

    def new_repo(self, stem: str = "r") -> str:
        """A fresh repository on this hub (tests share one hub), its name."""
        repo = unique_name(stem)
        self.plane().create_repo(repo)
        return repo

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def check_alive(self) -> None:
        """Fail with the hub's exit code and log tail if its process has ended."""
        if self.proc.poll() is not None:
            raise AssertionError(
                f"the hub process exited with code {self.proc.returncode} (a negative code is the signal that "
                f"ended it, possibly sent from outside the test); its log ends with:\n{self.log()[-3000:]}"
            )

    def rss(self) -> int:
        """Resident set size of the hub process (bytes)."""
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss

    def metrics(self) -> str:
        r = httpx.get(self.url + "/metrics", timeout=30)
        r.raise_for_status()
        return r.text

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        return metric_value(self.metrics(), name, **labels)


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group("name") != name:
            continue
        have = dict(_LABEL.findall(m.group("labels") or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group("value"))
    return total


def unique_name(stem: str = "r") -> str:
    """A fresh, valid repository name (tests share one hub)."""
    return f"{stem}-{uuid.uuid4().hex[:10]}"


def hub_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("FABRIC_AUTHOR", "tester")
    env.update(extra or {})
    return env


@contextlib.contextmanager
def start_hub(
    data: str | os.PathLike[str],
    db: str | None = None,
    no_auth: bool = False,
    args: Sequence[str] = (),
    env: dict | None = None,
) -> Iterator[Hub]:
    data = str(data)
    os.makedirs(os.path.dirname(os.path.abspath(data)), exist_ok=True)
    for attempt in range(3):  # (a port picked free may be taken before the hub listens on it)
        port = free_port()
        log_path = os.path.abspath(data).rstrip("/") + f".{port}.log"
        argv = [sys.executable, "-m", "fabric.cli.main", "hub", "--data", data, "--listen", f"127.0.0.1:{port}"]
        if db:
            argv += ["--db", db]
        if no_auth:
            argv.append("--no-auth")
        argv += list(args)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=hub_env(env), cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, log_path)
            break
        except PortTaken:
            if attempt == 2:
                raise
    try:
        token_file = Path(data) / "admin.token"
        token = token_file.read_text().strip() if token_file.exists() else None
        yield Hub(url, token, data, proc, log_path, db)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


class PortTaken(RuntimeError):
    """The server could not listen on its port: another process took it after it was picked."""


def exited_before_healthy(what: str, proc: subprocess.Popen, log_path: str) -> RuntimeError:
    """The error for a server that exited while starting (PortTaken when its port was taken)."""
    with open(log_path, "rb") as f:
        tail = f.read()[-4000:].decode("utf-8", "replace")
    kind = PortTaken if "address already in use" in tail.lower() else RuntimeError
    return kind(f"the {what} exited with code {proc.returncode} before it was healthy:\n{tail}")


def listens_on(proc: subprocess.Popen, url: str) -> bool:
    """Whether ``proc`` itself holds the listening socket of ``url``'s port: a server started
    on a port picked free may find another test's server there, answering in its place."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # (LISTEN)
                inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{proc.pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{proc.pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise exited_before_healthy("hub", proc, log_path)
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200 and listens_on(proc, url):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"the hub at {url} was not healthy within {START_TIMEOUT:.0f}s (log: {log_path})")
