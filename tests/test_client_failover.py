"""Clients given a list of servers (the spokes of a region, then the hub): the nearest healthy
one serves them, and a server killed in the middle of a read costs a pause, never an error.

Real processes on loopback: the session hub, two spokes of it (killed with SIGKILL), and for
the spoke's own hub list, one hub behind two WAN proxies of which one is cut.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fabric.client.http import HttpPlane
from fabric.client.servers import ServerSet
from fabric.errors import BadRequest, Unavailable
from fabric.fsspec.filesystem import FabricFileSystem
from fabric.util.net import free_port
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import mount_log, mounted, needs_fuse
from tests.hubserver import ROOT, hub_env, unique_name
from tests.spokeserver import Spoke, random_bytes, start_spoke, wait_for

pytestmark = pytest.mark.timeout(180)

SIZE = 24 * 1024 * 1024
PIECE = 1 << 20


@pytest.fixture(scope="module")
def dataset(hub) -> tuple[str, bytes]:
    """A repository with one large file, ``big.bin``, committed on main."""
    plane = hub.plane()
    repo = unique_name("fo")
    plane.create_repo(repo)
    data = random_bytes(SIZE, 15)
    plane.put_object(repo, "main", "big.bin", io.BytesIO(data))
    plane.commit(repo, "main", "a large file")
    return repo, data


@pytest.fixture
def region(hub, tmp_path) -> Iterator[tuple[Spoke, Spoke]]:
    """Two spokes of the session hub, cold."""
    with (
        start_spoke(hub.url, tmp_path / "a", "256MiB", token=hub.token) as a,
        start_spoke(hub.url, tmp_path / "b", "256MiB", token=hub.token) as b,
    ):
        yield a, b


@pytest.fixture
def plane(hub, region) -> Iterator[HttpPlane]:
    """A client of the region's spokes, then the hub (the order of the list)."""
    client = HttpPlane(_servers(*(s.url for s in region), hub.url), hub.token)
    yield client
    client.close()


def _servers(*urls: str) -> str:
    return ",".join(urls)


def _current_spoke(region: tuple[Spoke, Spoke], plane: HttpPlane) -> Spoke:
    """The spoke ``plane`` uses now (one of the region's, being nearer than the hub)."""
    url = plane.url
    spoke = next((s for s in region if s.url == url), None)
    assert spoke is not None, f"the client chose {url}, not a spoke: {plane.servers.state()}"
    return spoke


def _read_with_kill(pieces: Iterator[bytes], kill: Callable[[], None], kill_after: int) -> tuple[bytes, float]:
    """Everything ``pieces`` yields, calling ``kill`` once ``kill_after`` bytes were read;
    also the longest wait for one piece after the kill (the failover's pause)."""
    out = bytearray()
    pause = 0.0
    killed = False
    while True:
        t0 = time.monotonic()
        piece = next(pieces, None)
        if killed:
            pause = max(pause, time.monotonic() - t0)
        if piece is None:
            return bytes(out), pause
        out += piece
        if not killed and len(out) >= kill_after:
            kill()
            killed = True


def test_nearest_healthy_is_chosen_and_every_server_gets_the_token(hub, region, dataset, plane):
    a, b = region
    repo, _ = dataset
    # All on loopback: round trips tie, so the list order decides.
    assert plane.url == a.url, plane.servers.state()
    assert [s["up"] for s in plane.servers.state()] == [True, True, True]
    assert all(s["rtt_ms"] is not None for s in plane.servers.state())
    assert plane.stat(repo, "main", "big.bin").size == SIZE
    a.kill()
    # Reads go on at b, with the same token (b checks it with the hub).
    assert plane.stat(repo, "main", "big.bin").size == SIZE
    assert plane.url == b.url
    b.kill()
    assert plane.stat(repo, "main", "big.bin").size == SIZE
    assert plane.url == hub.url


def test_a_spoke_killed_mid_read_stream(region, dataset, plane):
    repo, data = dataset
    first = _current_spoke(region, plane)
    got, pause = _read_with_kill(plane.read_stream(repo, "main", "big.bin"), first.kill, SIZE // 3)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert plane.servers.failovers >= 1 and plane.url != first.url
    print(f"\nread_stream: failover pause after SIGKILL of {first.url}: {pause * 1000:.0f} ms")
    # A ranged read through the new server; then every byte again with read().
    assert plane.read(repo, "main", "big.bin", 5_000_000, 1_000_000) == data[5_000_000:6_000_000]
    assert plane.read(repo, "main", "big.bin") == data


def test_a_spoke_killed_mid_frames_stream(region, dataset, plane):
    repo, data = dataset
    ids = [cid for cid, _ in plane.stat_chunks(repo, "main", "big.bin").chunks]
    first = _current_spoke(region, plane)
    frames = plane.frames(ids, repo=repo)
    got = [next(frames) for _ in range(len(ids) // 3)]
    first.kill()
    got += list(frames)
    assert [cid for cid, _ in got] == ids
    from fabric.format import frames as frame_format

    assert b"".join(frame_format.decode(f, cid) for cid, f in got) == data
    assert plane.url != first.url


def test_a_spoke_killed_while_fsspec_reads(hub, region, dataset):
    repo, data = dataset
    fs = FabricFileSystem(server=_servers(*(s.url for s in region), hub.url), token=hub.token, skip_instance_cache=True)
    first = _current_spoke(region, fs.plane)
    with fs.open(f"{repo}@main/big.bin", "rb", block_size=2 * PIECE) as f:

        def pieces() -> Iterator[bytes]:
            while piece := f.read(PIECE):
                yield piece

        got, pause = _read_with_kill(pieces(), first.kill, SIZE // 3)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert fs.plane.servers.failovers >= 1 and fs.plane.url != first.url
    print(f"\nfsspec: failover pause after SIGKILL of {first.url}: {pause * 1000:.0f} ms")


@needs_fuse
def test_a_spoke_killed_while_a_mount_reads(hub, region, dataset, tmp_path):
    a, b = region
    repo, data = dataset
    opts = ("--memory-cache", "16M", "--readahead", "4M", "--server-timeout", "60")
    with mounted(_servers(a.url, b.url), hub.token, f"{repo}@main", tmp_path / "mnt", *opts) as mnt:
        with open(f"{mnt}/big.bin", "rb", buffering=0) as f:

            def pieces() -> Iterator[bytes]:
                while piece := f.read(PIECE):
                    yield piece

            # Loopback round trips tie: the mount reads from a, the first of its list.
            got, pause = _read_with_kill(pieces(), a.kill, SIZE // 3)
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
        log = mount_log(str(tmp_path / "mnt"))
        assert f"server {a.url} marked down" in log
        assert "server unreachable" not in log  # the retry wrapper never saw an outage
        print(f"\nmount: failover pause after SIGKILL of {a.url}: {pause * 1000:.0f} ms")


def test_every_server_down_names_them_all(tmp_path):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]
    plane = HttpPlane(_servers(*dead))
    try:
        with pytest.raises(Unavailable) as err:
            plane.list_repos()
        for url in dead:
            assert url in err.value.message
        assert "cannot reach any of" in err.value.message
    finally:
        plane.close()
    proc = _fabric("--server", _servers(*dead), "repo", "list")
    assert proc.returncode != 0
    assert all(url in proc.stderr for url in dead), proc.stderr


@pytest.mark.parametrize(
    "spec, named",
    [
        ("http://127.0.0.1:1,ftp://x", "'ftp://x'"),
        ("http://127.0.0.1:1,,http://127.0.0.1:2", "empty entry"),
        ("http://127.0.0.1:1,127.0.0.1:2", "'127.0.0.1:2'"),
        ("http://127.0.0.1:1,http://127.0.0.1:1/", "named twice"),
        ("http://127.0.0.1:1,http://h:2/?x=1", "query"),
    ],
)
def test_a_bad_server_list_is_refused(spec, named, tmp_path):
    with pytest.raises(BadRequest) as err:
        HttpPlane(spec)
    assert named in err.value.message
    with pytest.raises(ValueError, match="fabric://"):
        FabricFileSystem(server=spec, skip_instance_cache=True)
    proc = _fabric("--server", spec, "repo", "list")
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = _fabric("mount", spec, "r@main", str(mp))
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr
    assert not os.path.ismount(mp)


def test_one_server_behaves_as_before(hub):
    plane = HttpPlane(hub.url + "/", hub.token)
    assert plane.url == hub.url and not plane.servers.multiple
    assert plane.servers._thread is None  # no probes for a single server
    dead = HttpPlane(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(Unavailable, match="^cannot reach http://127.0.0.1:"):
        dead.list_repos()


def test_the_hub_list_of_a_spoke(hub, dataset, tmp_path):
    """``fabric spoke --hub A,B``: the hub it uses is cut (its connections reset, new ones refused),
    and the spoke goes on: uncached reads, a token it never saw, a write at the hub and a commit."""
    repo, data = dataset
    port = int(hub.url.rsplit(":", 1)[1])
    with WanProxy("127.0.0.1", port) as hub_a, WanProxy("127.0.0.1", port) as hub_b:
        hubs = _servers(hub_a.url_for(), hub_b.url_for())
        with start_spoke(hubs, tmp_path / "cache", "256MiB", token=hub.token, lease=1.0) as spoke:
            plane = spoke.plane()
            assert plane.read(repo, "main", "big.bin", 0, PIECE) == data[:PIECE]
            # Both are equally near: the spoke uses A, the first of the list, unless a probe of A
            # came out slower than the tie margin on a loaded machine. Cut whichever it uses.
            used, other = (hub_a, hub_b) if hub_a.bytes_down >= hub_b.bytes_down else (hub_b, hub_a)
            assert used.bytes_down > PIECE and other.bytes_down < PIECE
            used.cut()
            assert plane.read(repo, "main", "big.bin") == data
            reader = hub.plane().create_token(unique_name("reader"), roles={repo: "read"})["token"]
            assert spoke.plane(reader).read(repo, "main", "big.bin", PIECE, 10) == data[PIECE : PIECE + 10]
            plane.put_object(repo, "main", "via-b.txt", io.BytesIO(b"written while hub A is away"), durability="hub")
            plane.commit(repo, "main", "through hub B")
            assert hub.plane().read(repo, "main", "via-b.txt") == b"written while hub A is away"
            assert other.bytes_down > SIZE // 2
            wait_for(lambda: spoke.healthz().get("hub_stream_live"), timeout=20)


def test_probes_rank_by_round_trip(hub):
    """A server behind a slow link loses to a fast one listed after it; re-probes follow changes."""
    port = int(hub.url.rsplit(":", 1)[1])
    with WanProxy("127.0.0.1", port, delay_ms_up=40, delay_ms_down=40) as slow:
        servers = ServerSet(_servers(slow.url_for(), hub.url), interval=0.2)
        try:
            assert servers.current() == hub.url
            servers.mark_down(hub.url, "test")
            assert servers.current() == slow.url_for()
            wait_for(lambda: servers.current() == hub.url, timeout=5)  # the next probe finds it healthy
        finally:
            servers.close()


class _Overloaded(BaseHTTPRequestHandler):
    """A server that is up (``/healthz``) but answers every API request 503."""

    def _answer(self) -> None:
        status = 200 if self.path == "/healthz" else 503
        body = b'{"status": "ok"}' if status == 200 else b"overloaded"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


class _OneWay(io.RawIOBase):
    """A body that can be read once (a pipe, a socket)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 - a writable buffer
        return self._data.readinto(b)


def test_what_is_repeated_after_a_503(hub, dataset):
    """An upload goes to the next server only when its body can be sent again; a commit is never
    sent twice."""
    repo, _ = dataset
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Overloaded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    busy = f"http://127.0.0.1:{server.server_address[1]}"
    plane = HttpPlane(_servers(busy, hub.url), hub.token)
    plane.servers._interval = 0.1  # re-probe fast: the busy server counts as healthy again at once
    branch = unique_name("b")
    hub_plane = hub.plane()
    hub_plane.create_branch(repo, branch, "main")
    head = hub_plane.resolve_commit(repo, branch)
    try:
        wait_for(lambda: plane.url == busy)
        plane.put_object(repo, branch, "seekable.bin", io.BytesIO(b"s" * 1000))
        assert hub_plane.stat(repo, branch, "seekable.bin").size == 1000
        wait_for(lambda: plane.url == busy)
        with pytest.raises(Unavailable):
            plane.put_object(repo, branch, "once.bin", _OneWay(b"o" * 1000))
        wait_for(lambda: plane.url == busy)
        with pytest.raises(Unavailable):
            plane.commit(repo, branch, "must not be sent twice")
        assert hub_plane.resolve_commit(repo, branch) == head
        assert [c.path for c in hub_plane.uncommitted(repo, branch)] == ["seekable.bin"]
    finally:
        plane.close()
        server.shutdown()


def _fabric(*args: str) -> subprocess.CompletedProcess:
    env = hub_env()
    env.pop("FABRIC_SERVER", None)
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", *args], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )

