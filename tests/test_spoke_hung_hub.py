"""A spoke whose hub hangs (SIGSTOP) or never answers: reads degrade within a bound, never wait.

Real processes on loopback: a hub stopped with SIGSTOP (and resumed with SIGCONT),
and a "black hole" hub that accepts TCP connections and never answers. The spoke
runs with short hub timeouts (``--hub-timeout``) and a short lease, so a hung hub
is detected in seconds; each read below must return within ``BOUND`` seconds,
where a spoke without bounded timeouts and a circuit breaker waits minutes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from fabric.client.breaker import BreakerTransport, CircuitBreaker
from fabric.client.http import HttpPlane, Timeouts
from fabric.errors import BadRequest, Unavailable
from tests.hubserver import ROOT, hub_env, unique_name
from tests.spokeserver import random_bytes, start_restartable_hub, start_spoke, wait_for

pytestmark = pytest.mark.timeout(150)

LEASE = 1.0
#: Longest wait for a read through the spoke while its hub hangs.
BOUND = 10.0
HUB_TIMEOUT = "connect=2,read=2,write=5,pool=5"


@dataclass
class Hole:
    url: str
    accepted: int = 0


@contextlib.contextmanager
def black_hole(first_bytes: bytes = b"") -> Iterator[Hole]:
    """A TCP server on loopback that accepts every connection, sends ``first_bytes`` on each
    and then never answers again (``accepted`` counts the connections)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    hole = Hole(f"http://127.0.0.1:{server.getsockname()[1]}")
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            hole.accepted += 1
            if first_bytes:
                conn.sendall(first_bytes)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield hole
    finally:
        done.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def fabric_ls(server: str, token: str, target: str) -> tuple[subprocess.CompletedProcess, float]:
    """``fabric ls TARGET`` against ``server`` in a subprocess: the result and how long it took."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "--server", server, "--token", token, "ls", "-r", target],
        capture_output=True,
        text=True,
        env=hub_env({"FABRIC_DATA": os.path.join(ROOT, "no-such-dir")}),
        cwd=ROOT,
        timeout=60,
    )
    return proc, time.monotonic() - started


def get(c: httpx.Client, repo: str, ref: str, path: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = c.get(f"/api/v1/repos/{repo}/refs/{ref}/objects", params={"path": path})
    return r, time.monotonic() - started


def seed(plane, repo: str) -> tuple[dict[str, bytes], str]:
    plane.create_repo(repo)
    files = {f"d/f{i}.bin": random_bytes(200_000, 40 + i) for i in range(3)}
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    return files, plane.commit(repo, "main", "v1").id


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_on_a_timeout_fails_fast_and_lets_one_probe_through_per_interval() -> None:
    clock = Clock()
    breaker = CircuitBreaker(retry_after=2.0, clock=clock)
    breaker.admit()
    breaker.failed(httpx.ReadTimeout("silence"))
    state = breaker.state()
    assert state["reachable"] is False and state["open_since"] is not None and state["trips"] == 1
    assert "ReadTimeout" in state["last_error"]
    with pytest.raises(httpx.TransportError, match="not asking again"):
        breaker.admit()
    clock.now += 2.0
    breaker.admit()  # the probe
    with pytest.raises(httpx.TransportError):
        breaker.admit()  # everyone else while the probe is out
    breaker.failed(httpx.ConnectTimeout("still silent"))
    assert breaker.state()["trips"] == 1  # still the same outage
    clock.now += 2.0
    breaker.admit()
    breaker.succeeded()
    assert breaker.state() == {"reachable": True, "open_since": None, "trips": 1, "last_error": ""}
    breaker.admit()
    with pytest.raises(ValueError):
        CircuitBreaker(retry_after=0)


def test_timeouts_parse_and_refuse_bad_values() -> None:
    base = Timeouts(connect=5, read=10, write=60, pool=10, slow=300)
    assert Timeouts.parse("3", base) == Timeouts(5, 3, 60, 10, 300)
    assert Timeouts.parse("connect=1, read=2,slow=9", base) == Timeouts(1, 2, 60, 10, 9)
    for bad in ("read=-1", "soon", "read=2,nap=3", "0", "read=inf", ""):
        with pytest.raises(BadRequest):
            Timeouts.parse(bad, base)


def test_a_stalled_stream_is_cut_and_opens_the_breaker_so_the_next_call_fails_fast() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\npartial"
    with black_hole(head) as hole:
        breaker = CircuitBreaker(retry_after=30.0)
        plane = HttpPlane(hole.url, None, Timeouts(connect=1, read=0.5, write=1, pool=1, slow=1), BreakerTransport(breaker, httpx.HTTPTransport()))
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="broke off"):
                b"".join(plane.read_stream("r", "main", "a.bin"))
            assert time.monotonic() - started < 5
            assert breaker.state()["reachable"] is False
            accepted = hole.accepted
            started = time.monotonic()
            with pytest.raises(Unavailable, match="not asking again"):
                plane.list_repos()
            assert time.monotonic() - started < 0.5 and hole.accepted == accepted  # not even a connection
        finally:
            plane.close()


def spoke_with_short_timeouts(hub, cache):  # noqa: ANN001, ANN201 - a running Hub; a context manager
    """A spoke of ``hub`` that gives up on a silent hub after HUB_TIMEOUT (auth off: these tests are about the data path)."""
    return start_spoke(hub.url, cache, "256MiB", token=hub.token, lease=LEASE, no_auth=True, args=["--hub-timeout", HUB_TIMEOUT])


@pytest.mark.slow
def test_hub_stopped_with_sigstop_reads_degrade_then_recover(tmp_path) -> None:
    with (
        start_restartable_hub(tmp_path / "hub") as hub,
        spoke_with_short_timeouts(hub, tmp_path / "cache") as spoke,
    ):
        plane = hub.plane()
        repo = unique_name("hung")
        files, c1 = seed(plane, repo)
        with spoke.client(timeout=120) as c:
            for path, data in files.items():  # warm the spoke: refs, trees, chunks
                r, _ = get(c, repo, "main", path)
                assert r.status_code == 200 and r.content == data
            assert spoke.stats()["hub_reachable"] is True

            os.kill(hub.proc.pid, signal.SIGSTOP)
            try:
                # The watch stream falls silent; once the spoke notices, reads must ask the hub.
                wait_for(lambda: not spoke.stats()["watch_stream_live"], timeout=30, interval=0.5)
                time.sleep(LEASE + 0.2)

                # (a) fabric ls of the branch: the last known listing, promptly.
                proc, took = fabric_ls(spoke.url, hub.token, f"{repo}@main")
                assert proc.returncode == 0, proc.stderr
                assert took < BOUND, f"fabric ls took {took:.1f}s with the hub hung"
                assert all(path in proc.stdout for path in files)

                # A REST read of a cached file on the branch: the data, marked stale.
                for path, data in files.items():
                    r, took = get(c, repo, "main", path)
                    assert took < BOUND, f"GET {path} took {took:.1f}s with the hub hung"
                    assert r.status_code == 200, r.text
                    assert r.content == data and r.headers["x-fabric-stale"] == "true"
                    assert r.headers["x-fabric-commit"] == c1

                stats = spoke.stats()
                assert stats["hub_reachable"] is False
                assert stats["hub_breaker_open_since"] is not None
            finally:
                os.kill(hub.proc.pid, signal.SIGCONT)

            # (c) the hub is back: the breaker closes and fresh answers come back.
            plane.put_object(repo, "main", "d/f0.bin", io.BytesIO(b"after the hang"))
            c2 = plane.commit(repo, "main", "v2").id

            def fresh() -> bool:
                r, _ = get(c, repo, "main", "d/f0.bin")
                return r.status_code == 200 and r.headers["x-fabric-stale"] == "false" and r.content == b"after the hang"

            wait_for(fresh, timeout=30, interval=0.5)
            assert get(c, repo, "main", "d/f1.bin")[0].headers["x-fabric-commit"] == c2
            stats = spoke.stats()
            assert stats["hub_reachable"] is True and stats["hub_breaker_open_since"] is None
            assert stats["hub_breaker_trips"] >= 1


@pytest.mark.slow
def test_hub_that_accepts_and_never_answers(tmp_path) -> None:
    with start_restartable_hub(tmp_path / "hub") as hub:
        plane = hub.plane()
        repo = unique_name("hole")
        files, c1 = seed(plane, repo)
        with (
            spoke_with_short_timeouts(hub, tmp_path / "cache") as spoke,
            black_hole() as hole,
        ):
            with spoke.client(timeout=120) as c:
                for path, data in files.items():
                    r, _ = get(c, repo, "main", path)
                    assert r.status_code == 200 and r.content == data
            # The same spoke (same cache), now pointed at a hub that never answers.
            spoke.stop()
            spoke.hub_url = hole.url
            spoke.start()

            proc, took = fabric_ls(spoke.url, hub.token, f"{repo}@main")
            assert proc.returncode == 0, proc.stderr
            assert took < BOUND, f"fabric ls took {took:.1f}s against a silent hub"
            assert all(path in proc.stdout for path in files)
            with spoke.client(timeout=120) as c:
                for path, data in files.items():
                    r, took = get(c, repo, "main", path)
                    assert took < BOUND, f"GET {path} took {took:.1f}s against a silent hub"
                    assert r.status_code == 200, r.text
                    assert r.content == data and r.headers["x-fabric-stale"] == "true"
                    assert r.headers["x-fabric-commit"] == c1
                # Something only the hub has: a clear 503, promptly, not a hang.
                started = time.monotonic()
                r = c.get(f"/api/v1/repos/{repo}/branches/main/changes")
                assert time.monotonic() - started < BOUND
                assert r.status_code == 503, r.text
            assert spoke.stats()["hub_reachable"] is False


def test_bad_hub_timeout_is_refused(tmp_path) -> None:
    for bad in ("read=-1", "soon", "read=2,nap=3", "0"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fabric.cli.main",
                "spoke",
                "--hub",
                "http://127.0.0.1:9",
                "--cache",
                str(tmp_path / "c"),
                "--cache-size",
                "64MiB",
                "--hub-timeout",
                bad,
            ],
            capture_output=True,
            text=True,
            env=hub_env(),
            cwd=ROOT,
            timeout=60,
        )
        assert proc.returncode != 0 and "--hub-timeout" in proc.stderr, (bad, proc.stderr)
    assert not os.path.exists(tmp_path / "c")
