"""A real spoke for tests: ``fabric spoke`` in a subprocess on a free loopback port.

Usage::

    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as spoke:
        spoke.client(token).get("/api/v1/stats")       # httpx client, caller's token
        spoke.plane(token).read_stream(...)            # fabric.client.http.HttpPlane on the spoke
        spoke.stats()                                  # GET /api/v1/stats (as the spoke's token)
        spoke.kill()                                   # SIGKILL, no clean-up at all
        spoke.restart()                                # same cache dir, same port
        spoke.log()

Like tests/hubserver.py: stdout and stderr go to a log file next to the cache
directory; on exit the spoke gets SIGTERM, then SIGKILL after 10 seconds.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from fabric.util.net import free_port
from tests.hubserver import ROOT, PortTaken, exited_before_healthy, hub_env, listens_on, stop, unique_name

START_TIMEOUT = 60.0


@dataclass
class Spoke:
    url: str  # http://127.0.0.1:PORT
    hub_url: str
    cache: str
    cache_size: str
    token: (
        str | None
    )  # the spoke's own token at the hub (also used as the default caller token)
    proc: subprocess.Popen
    log_path: str
    port: int
    args: list[str] = field(default_factory=list)
    env: dict | None = None

    @property
    def api(self) -> str:
        return self.url + "/api/v1"

    def argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "fabric.cli.main",
            "spoke",
            "--hub",
            self.hub_url,
            "--cache",
            self.cache,
            "--cache-size",
            self.cache_size,
            "--listen",
            f"127.0.0.1:{self.port}",
        ]
        if self.token:
            argv += ["--token", self.token]
        return argv + list(self.args)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Start the spoke process (again, after :meth:`stop` or :meth:`kill`) and wait until it is healthy."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=hub_env(self.env),
                cwd=ROOT,
            )
        _wait_healthy(self.url, self.proc, self.log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        stop(self.proc)

    def kill(self) -> None:
        """SIGKILL (kill -9): the spoke gets no chance to clean up."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, kill: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with ``kill``) and start again on the same cache and port."""
        self.kill() if kill else self.stop()
        self.start()

    # -- talking to it -------------------------------------------------------------
    def client(self, token: str | None | bool = True, **kwargs) -> httpx.Client:
        """An httpx client on ``/`` of the spoke; ``token=True`` uses the spoke's own token."""
        if token is True:
            token = self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kwargs.pop("headers", {}))
        return httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=kwargs.pop("timeout", 120.0),
            **kwargs,
        )

    def plane(self, token: str | None | bool = True):
        from fabric.client.http import HttpPlane

        return HttpPlane(self.url, self.token if token is True else (token or None))

    def stats(self, token: str | None | bool = True) -> dict:
        with self.client(token, timeout=30.0) as c:
            r = c.get("/api/v1/stats")
            r.raise_for_status()
            return r.json()

    def healthz(self) -> dict:
        return httpx.get(self.url + "/healthz", timeout=10).json()

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def cache_disk_bytes(self) -> int:
        """Bytes of the files under the cache's chunk and metadata directories (like ``du -sb``, files only)."""
        total = 0
        for sub in ("chunks", "meta"):
            for dirpath, _, names in os.walk(os.path.join(self.cache, sub)):
                for name in names:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_size
                    except FileNotFoundError:
                        pass
        return total


@contextlib.contextmanager
def start_spoke(
    hub_url: str,
    cache: str | os.PathLike[str],
    cache_size: str = "1GiB",
    token: str | None = None,
    lease: float | None = None,
    durability: str | None = None,
    no_auth: bool = False,
    args: Sequence[str] = (),
    env: dict | None = None,
    port: int | None = None,
    group: str | None = None,
) -> Iterator[Spoke]:
    """``port``: listen there (e.g. one a test put in another spoke's arguments); default: a free one.
    ``group``: join that spoke group at the hub, advertising this spoke's URL."""
    cache = str(cache)
    os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
    port = port or free_port()
    log_path = os.path.abspath(cache).rstrip("/") + f".spoke.{port}.log"
    extra = list(args)
    if group is not None:
        extra += ["--group", group, "--advertise", f"http://127.0.0.1:{port}"]
    if lease is not None:
        extra += ["--lease", str(lease)]
    if durability is not None:
        extra += ["--durability", durability]
    if no_auth:
        extra.append("--no-auth")
    spoke = Spoke(
        url=f"http://127.0.0.1:{port}",
        hub_url=hub_url,
        cache=cache,
        cache_size=cache_size,
        token=token,
        proc=None,  # type: ignore[arg-type]
        log_path=log_path,
        port=port,
        args=extra,
        env=env,
    )
    try:
        spoke.start()
        yield spoke
    finally:
        if spoke.proc is not None:
            stop(spoke.proc)


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise exited_before_healthy("spoke", proc, log_path)
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200 and listens_on(proc, url):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(
        f"the spoke at {url} was not healthy within {START_TIMEOUT:.0f}s (log: {log_path})"
    )


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy; that value, or AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


# -- a hub that can be killed and brought back on the same port ------------------
@dataclass
class RestartableHub:
    """A hub subprocess on a fixed port that tests may kill -9 and start again (same data)."""

    url: str
    data: str
    port: int
    log_path: str
    token: str | None = None
    proc: subprocess.Popen | None = None

    @property
    def api(self) -> str:
        return self.url + "/api/v1"

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "fabric.cli.main",
            "hub",
            "--data",
            self.data,
            "--listen",
            f"127.0.0.1:{self.port}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=hub_env(), cwd=ROOT
            )
        _wait_healthy(self.url, self.proc, self.log_path)
        token_file = os.path.join(self.data, "admin.token")
        if os.path.exists(token_file):
            with open(token_file) as f:
                self.token = f.read().strip()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def plane(self, token: str | None | bool = True):
        from fabric.client.http import HttpPlane

        return HttpPlane(self.url, self.token if token is True else (token or None))

    def client(self, token: str | None | bool = True, **kwargs) -> httpx.Client:
        if token is True:
            token = self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=kwargs.pop("timeout", 120.0),
            **kwargs,
        )

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


@contextlib.contextmanager
def start_restartable_hub(data: str | os.PathLike[str]) -> Iterator[RestartableHub]:
    data = str(data)
    os.makedirs(os.path.dirname(os.path.abspath(data)), exist_ok=True)
    for attempt in range(3):  # (a port picked free may be taken before the hub listens on it)
        port = free_port()
        hub = RestartableHub(f"http://127.0.0.1:{port}", data, port, os.path.abspath(data).rstrip("/") + f".{port}.log")
        try:
            hub.start()
            break
        except PortTaken:
            if attempt == 2:
                raise
    try:
        yield hub
    finally:
        hub.stop()


# -- data helpers ----------------------------------------------------------------
def random_bytes(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


_WORDS: list[str] = []


def text_bytes(n: int, seed: int) -> bytes:
    """Compressible text (random words from a fixed vocabulary), ``n`` bytes."""
    import random

    if not _WORDS:
        rng = random.Random(0)
        letters = "abcdefghijklmnopqrstuvwxyz"
        _WORDS.extend(
            "".join(rng.choice(letters) for _ in range(rng.randint(2, 10)))
            for _ in range(4000)
        )
    rng = random.Random(seed)
    out = " ".join(rng.choices(_WORDS, k=n // 5 + 16)).encode()
    return out[:n]


def frame_bytes(plane, ids) -> int:
    """Sum of the stored (compressed) frame sizes of chunk ids, as the hub serves them."""
    ids = list(dict.fromkeys(ids))
    total = 0
    for i in range(0, len(ids), 2000):
        for _, frame in plane.frames(ids[i : i + 2000]):
            total += len(frame)
    return total


def chunk_ids(plane, repo: str, ref: str) -> list[bytes]:
    """Every distinct chunk id of the files at ``repo@ref``, in path order."""
    return list(dict.fromkeys(cid for ids in commit_chunks(plane, repo, ref).values() for cid in ids))


@dataclass
class Dataset:
    """Files committed to a repository of their own, as :func:`random_dataset` makes them."""

    repo: str
    commit: str
    files: dict[str, bytes]
    ids: list[bytes]  # its distinct chunk ids
    frames: int  # stored (compressed) bytes of its chunks


def random_dataset(plane, mib: int, seed: int, stem: str = "data") -> Dataset:
    """``mib`` files of 1 MiB of random bytes (``part/NNN.bin``) in a new repository, committed."""
    repo = unique_name(stem)
    plane.create_repo(repo)
    files = {f"part/{i:03d}.bin": random_bytes(1 << 20, seed + i) for i in range(mib)}
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    commit = plane.commit(repo, "main", "data").id
    ids = chunk_ids(plane, repo, commit)
    return Dataset(repo, commit, files, ids, frame_bytes(plane, ids))


def commit_chunks(plane, repo: str, ref: str) -> dict[str, list[bytes]]:
    """path -> chunk ids of every file at ``repo@ref`` (asked of ``plane``, e.g. the hub)."""
    out: dict[str, list[bytes]] = {}
    after = ""
    while True:
        page = plane.list(repo, ref, after=after, limit=1000)
        for path, _ in page.entries:
            out[path] = [cid for cid, _ in plane.stat_chunks(repo, ref, path).chunks]
        if not page.next_after:
            return out
        after = page.next_after
