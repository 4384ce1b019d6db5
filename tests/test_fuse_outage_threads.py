"""A mount whose server is down keeps answering what needs no server (:mod:`fuse.outage`).

libfuse serves a mount with a few threads (``fuse.libfuse.MAX_THREADS``). Reads that miss
the caches while the server is unreachable wait for it (up to ``--server-timeout``); if
they could take every thread, a ``stat``, a listing, a read of cached data or the flush
of a ``close()`` would wait behind them. Here the hub is killed while a dozen readers of
uncached files wait, and everything that needs no server must still be answered at once.

The first tests run :class:`~fuse.outage.MountHealth` with threads that play FUSE
callbacks; the last one mounts a real hub. There, all file access runs in child processes: a hang fails the test (the child is killed)
rather than hanging pytest, and the hub restarted by this process inherits no descriptor
on the mount (whose close would be a FUSE flush).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest

from fabric.client.transfer import import_directory
from fabric.errors import NotFound, Unavailable
from fuse.outage import MountHealth, MountPlane, ThreadsBusy, begin_op, end_op
from tests.fuse_helpers import RestartableHub, file_digest, mount_log, mounted, needs_fuse

pytestmark = pytest.mark.timeout(180)

READERS = 12
SIZE = 300_000

_READ = """
import hashlib, json, sys
print("reading", flush=True)
try:
    with open(sys.argv[1], "rb") as f:
        print(json.dumps({"sha": hashlib.sha256(f.read()).hexdigest()}))
except OSError as exc:
    print(json.dumps({"errno": exc.errno}))
"""

# What needs no server: a lookup and stat of a name whose listing the mount holds, a
# listing, a read of chunks the mount has cached (under a name the kernel has not read,
# so the read reaches the mount), an open and close (close: a FUSE flush).
_CHECKS = """
import errno, hashlib, json, os, sys, time
mnt = sys.argv[1]
out = {}

def attempt(name, fn):
    try:
        out[name] = fn()
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, exc.errno)

def read(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

def open_close(path):
    os.close(os.open(path, os.O_RDONLY))
    return "closed"

t0 = time.monotonic()
attempt("stat", lambda: os.stat(f"{mnt}/meta/b.txt").st_size)
attempt("listdir", lambda: sorted(os.listdir(f"{mnt}/meta")))
attempt("cached", lambda: read(f"{mnt}/cached/copy.bin"))
attempt("open_close", lambda: open_close(f"{mnt}/meta/c.txt"))
out["seconds"] = time.monotonic() - t0
print(json.dumps(out))
"""


class Server:
    """A plane with one call, ``get``: answers after ``delay``, or fails while ``down``
    (``busy``: with a 503 that says when to come back)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.down = threading.Event()
        self.busy = False

    def get(self) -> str:
        if self.down.is_set():
            raise Unavailable("too busy", retry_after=1) if self.busy else Unavailable("cannot reach the server")
        time.sleep(self.delay)
        return "ok"


def _as_fuse_callback(fn, results: list, fuse: bool = True, name: str = "read") -> threading.Thread:
    def run() -> None:
        if fuse:
            begin_op(name)
        try:
            results.append(fn())
        except Exception as exc:  # noqa: BLE001 - the outcome is the result
            results.append(exc)
        finally:
            if fuse:
                end_op()

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_only_waiters_for_an_unreachable_server_take_the_bounded_places():
    server = Server()
    health = MountHealth(60, waiters=2)
    plane = MountPlane(server, health)
    server.down.set()
    results: list = []
    waiting = [_as_fuse_callback(plane.get, results) for _ in range(2)]
    _wait_until(lambda: health.waiting == 2)
    # A third callback fails at once; a thread outside FUSE callbacks (readahead) is not bounded.
    t0 = time.monotonic()
    _as_fuse_callback(plane.get, results).join(10)
    assert isinstance(results[-1], ThreadsBusy) and time.monotonic() - t0 < 2
    background = _as_fuse_callback(plane.get, results, fuse=False)
    # So is a callback that would wait for another's fetch (or load) during the outage.
    fut: Future = Future()
    _as_fuse_callback(lambda: health.result(fut), results).join(10)
    assert isinstance(results[-1], ThreadsBusy)
    lock = threading.Lock()
    lock.acquire()
    _as_fuse_callback(lambda: health.acquire(lock), results).join(10)
    assert isinstance(results[-1], ThreadsBusy)
    assert health.refused == 3 and len(results) == 3
    # The sync of written data is never refused (it waits as before), but takes a place.
    fsync = _as_fuse_callback(plane.get, results, name="fsync")
    _wait_until(lambda: health.waiting == 3)
    server.down.clear()
    for t in [*waiting, background, fsync]:
        t.join(10)
    assert results[3:] == ["ok"] * 4
    assert health.waiting == 0 and health.unreachable_since is None
    # Back to normal: nothing refused.
    _as_fuse_callback(plane.get, results).join(10)
    assert results[-1] == "ok"


def test_the_help_says_how_many_requests_may_wait():
    from fuse import cli
    from fuse.libfuse import MAX_THREADS, WAIT_RESERVE

    assert f"Only {MAX_THREADS - WAIT_RESERVE} requests at a time wait" in " ".join(cli.MOUNT_HELP.split())


def test_slow_answers_and_busy_servers_take_no_place():
    server = Server(delay=0.5)
    health = MountHealth(60, waiters=1)
    plane = MountPlane(server, health)
    results: list = []
    for t in [_as_fuse_callback(plane.get, results) for _ in range(4)]:
        t.join(10)
    assert results == ["ok"] * 4 and health.refused == 0
    # A server that answers "busy, come back later" is not an outage either.
    server.delay, server.busy = 0.0, True
    server.down.set()
    threads = [_as_fuse_callback(plane.get, results) for _ in range(3)]
    time.sleep(0.3)
    assert health.waiting == 0 and health.refused == 0 and health.down_since is not None
    server.down.clear()
    for t in threads:
        t.join(10)
    assert results[4:] == ["ok"] * 3
    # Nor is a failure that is no outage at all.
    fut: Future = Future()
    fut.set_exception(NotFound("gone"))
    with pytest.raises(NotFound):
        health.result(fut)


@pytest.fixture
def rhub(tmp_path):
    h = RestartableHub(tmp_path / "hub")
    h.start()
    try:
        yield h
    finally:
        h.stop()


def _reader(path: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _READ, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_fuse
@pytest.mark.parametrize("kind", ["commit", "branch"])
def test_a_server_outage_leaves_threads_for_what_needs_no_server(rhub, tmp_path, kind):
    """A commit's mount has all it needs cached; a branch's (close-to-open) needs the server
    for opens and listings: those fail with EIO at once, never hang, and names resolve
    from the expired listing."""
    plane = rhub.plane()
    plane.create_repo("outage-threads")
    src = tmp_path / "src"
    files: dict[str, bytes] = {}
    cached = os.urandom(SIZE)
    files["cached/orig.bin"] = files["cached/copy.bin"] = cached  # one content: the same chunks
    for i in range(READERS):
        files[f"cold/f{i:02d}.bin"] = os.urandom(SIZE)
    for name in ("a", "b", "c"):
        files[f"meta/{name}.txt"] = name.encode() * 10
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    commit = import_directory(plane, str(src), "outage-threads", "main", "files").commit.id

    opts = ("--server-timeout", "60")
    target = f"outage-threads@{commit if kind == 'commit' else 'main'}"
    with mounted(rhub.url, rhub.token, target, tmp_path / "mnt", *opts) as mnt:
        # The mount's caches: the listings of meta/ and cold/ and the chunks of cached/orig.bin.
        assert os.stat(f"{mnt}/meta/a.txt").st_size == 10
        assert len(os.listdir(f"{mnt}/cold")) == READERS
        assert file_digest(f"{mnt}/cached/orig.bin") == hashlib.sha256(cached).hexdigest()

        readers: list[subprocess.Popen] = []
        try:
            rhub.stop(kill=True)
            readers = [_reader(f"{mnt}/cold/f{i:02d}.bin") for i in range(READERS)]
            for r in readers:
                assert r.stdout is not None and r.stdout.readline() == "reading\n"
            time.sleep(1.0)  # they are in flight, waiting for the server (or refused)
            assert all(r.poll() is None or r.returncode == 0 for r in readers)
            try:
                done = subprocess.run([sys.executable, "-c", _CHECKS, mnt], capture_output=True, text=True, timeout=15)
            except subprocess.TimeoutExpired:
                pytest.fail("stat, listdir, a cached read or open+close hung while reads waited for the server")
            assert done.returncode == 0, done.stderr
            got = json.loads(done.stdout)
            assert got["seconds"] < 10, got
            digest = hashlib.sha256(cached).hexdigest()
            if kind == "commit":
                want = {"stat": 10, "listdir": ["a.txt", "b.txt", "c.txt"], "cached": digest, "open_close": "closed"}
                assert {k: got[k] for k in want} == want
            else:
                assert got["stat"] == 10, got
                assert got["listdir"] in (["a.txt", "b.txt", "c.txt"], "EIO"), got
                assert got["cached"] in (digest, "EIO"), got
                assert got["open_close"] in ("closed", "EIO"), got
        finally:
            if rhub.proc is None:
                rhub.start()
            if sys.exc_info()[0] is not None:
                for r in readers:  # (the test failed: no reader left holding the mount busy)
                    r.kill()
                    r.wait()
        # Each waiting read either completed right or failed with EIO, none hung.
        outcomes = []
        for i, r in enumerate(readers):
            r.wait(timeout=90)  # (the output is a line: no pipe fills up)
            assert r.returncode == 0, r.stderr.read()  # type: ignore[union-attr]
            res = json.loads(r.stdout.read())  # type: ignore[union-attr]
            r.stdout.close()  # type: ignore[union-attr]
            r.stderr.close()  # type: ignore[union-attr]
            if "errno" in res:
                assert res["errno"] == errno.EIO, res
                outcomes.append("EIO")
            else:
                assert res["sha"] == hashlib.sha256(files[f"cold/f{i:02d}.bin"]).hexdigest()
                outcomes.append("ok")
        assert "ok" in outcomes, f"no read waited for the server: {outcomes}\n{mount_log(str(tmp_path / 'mnt'))[-3000:]}"
        if "EIO" in outcomes:
            assert "requests already wait for it" in mount_log(str(tmp_path / "mnt"))
        # The mount works normally afterwards: every file reads right (the refused ones too).
        for rel, data in files.items():
            assert file_digest(f"{mnt}/{rel}") == hashlib.sha256(data).hexdigest(), rel
