"""A spoke while its hub is killed: what it still serves, what it queues, what it refuses.

Real processes: a hub that is killed with SIGKILL and started again on the
same port and data, and a spoke that is itself killed with SIGKILL and
restarted on the same cache directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import sqlite3
import time
from collections.abc import Iterator

import httpx
import pytest

from fabric.client.http import UPLOAD_PACK_SIZE, HttpPlane
from fabric.errors import BadRequest, ChunksMissing, StorageFull, Unavailable
from fabric.format import frames, packs
from fabric.format.chunking import chunk_id
from fabric.format.ingest import PackSession, file_entry, ingest_stream
from fabric.format.model import Entry
from fabric.fsspec import FabricFileSystem
from spoke.plane import SpokePlane
from testbed.wanproxy import WanProxy
from tests.hubserver import unique_name
from tests.spokeserver import (
    RestartableHub,
    Spoke,
    random_bytes,
    start_restartable_hub,
    start_spoke,
    text_bytes,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

LEASE = 1.0


@pytest.fixture
def outage(tmp_path) -> Iterator[tuple[RestartableHub, Spoke]]:
    with (
        start_restartable_hub(tmp_path / "hub") as hub,
        start_spoke(
            hub.url, tmp_path / "cache", "256MiB", token=hub.token, lease=LEASE
        ) as spoke,
    ):
        yield hub, spoke


def get(c: httpx.Client, repo: str, ref: str, path: str) -> httpx.Response:
    return c.get(f"/api/v1/repos/{repo}/refs/{ref}/objects", params={"path": path})


def put(
    c: httpx.Client, repo: str, path: str, data: bytes, durability: str
) -> httpx.Response:
    return c.put(
        f"/api/v1/repos/{repo}/branches/main/objects",
        params={"path": path},
        content=data,
        headers={
            "X-Fabric-Durability": durability,
            "Content-Type": "application/octet-stream",
        },
    )


def queued_rows(cache: str) -> int:
    db = sqlite3.connect(
        f"file:{os.path.join(cache, 'writeback.db')}?mode=ro", uri=True
    )
    try:
        return db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
    finally:
        db.close()


@pytest.mark.slow
def test_hub_killed_pinned_reads_stale_branch_reads_local_writes_land_once(
    outage,
) -> None:
    hub, spoke = outage
    plane = hub.plane()
    repo = unique_name("outage")
    plane.create_repo(repo)
    v1 = {f"d/r{i}.bin": random_bytes(512 * 1024, 500 + i) for i in range(8)}
    v1["d/notes.txt"] = text_bytes(700_000, 77)
    for path, data in v1.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    c1 = plane.commit(repo, "main", "v1").id
    plane.create_tag(repo, "v1", c1)
    head = dict(v1, **{"d/r0.bin": random_bytes(512 * 1024, 999)})
    plane.put_object(repo, "main", "d/r0.bin", io.BytesIO(head["d/r0.bin"]))
    c2 = plane.commit(repo, "main", "v2").id

    with spoke.client(timeout=30) as c:
        # Warm the spoke: the commit id, the tag and the branch, every file.
        for ref, files in ((c1, v1), ("v1", v1), ("main", head)):
            for path, data in files.items():
                r = get(c, repo, ref, path)
                assert r.status_code == 200 and r.content == data

        hub.kill()
        time.sleep(LEASE + 0.5)

        # Pinned commits and tags: served completely from the cache.
        for ref in (c1, "v1"):
            for path, data in v1.items():
                r = get(c, repo, ref, path)
                assert r.status_code == 200, (ref, path, r.status_code, r.text)
                assert r.content == data
                assert r.headers["x-fabric-commit"] == c1
            r = c.get(f"/api/v1/repos/{repo}/refs/{ref}/list", params={"prefix": "d/"})
            assert r.status_code == 200 and len(r.json()["entries"]) == len(v1)
        # The branch: served at the last known head, marked stale.
        for path, data in head.items():
            r = get(c, repo, "main", path)
            assert r.status_code == 200, (path, r.text)
            assert r.content == data
            assert r.headers["x-fabric-commit"] == c2
            assert r.headers["x-fabric-stale"] == "true"

        # Writes asking for hub durability: a clear 503.
        r = put(c, repo, "d/hub-durable.bin", b"must reach the hub", "hub")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "unavailable"
        assert "hub durability" in err["message"] and "local" in err["message"]

        # Writes with local durability: accepted, and read back at once from the spoke.
        writes = {
            "d/new-a.bin": random_bytes(300_000, 1),
            "d/new-b.txt": text_bytes(200_000, 2),
            "d/r1.bin": random_bytes(400_000, 3),  # an existing file, overwritten
        }
        r = put(c, repo, "d/new-a.bin", b"first version, replaced below", "local")
        assert r.status_code == 201, r.text
        for path, data in writes.items():
            r = put(c, repo, path, data, "local")
            assert r.status_code == 201, r.text
        for path, data in writes.items():
            r = get(c, repo, "main", path)
            assert r.status_code == 200 and r.content == data
        listed = [
            e["path"]
            for e in c.get(
                f"/api/v1/repos/{repo}/refs/main/list", params={"prefix": "d/"}
            ).json()["entries"]
        ]
        assert listed == sorted(set(head) | set(writes))
        assert spoke.stats()["writeback_pending"] == 4

    # kill -9 of the spoke, restarted on the same cache while the hub is still away.
    spoke.kill()
    assert queued_rows(spoke.cache) == 4
    spoke.restart()
    time.sleep(1.0)
    assert queued_rows(spoke.cache) == 4  # nothing could land: the hub is down

    # Restarted while the hub is away: what it served before is still served (the branch
    # marked stale), and the caller's token, checked before the restart, still works.
    with spoke.client(timeout=30) as c:
        for ref in (c1, "v1"):
            for path, data in v1.items():
                r = get(c, repo, ref, path)
                assert r.status_code == 200, (ref, path, r.status_code, r.text)
                assert r.content == data
        r = get(c, repo, "main", "d/notes.txt")
        assert r.status_code == 200 and r.content == head["d/notes.txt"]
        assert r.headers["x-fabric-stale"] == "true"
        r = get(c, repo, "main", "d/new-b.txt")
        assert r.status_code == 200 and r.content == writes["d/new-b.txt"]
        unknown = c.get(f"/api/v1/repos/{repo}/refs/v1/list", headers={"Authorization": "Bearer fab_000000000000_x"})
        assert unknown.status_code in (401, 503)

    # The hub returns: the queued writes land.
    hub.start()
    wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=45, interval=0.2)
    assert queued_rows(spoke.cache) == 0
    changes = list(plane.uncommitted(repo, "main"))
    assert sorted(ch.path for ch in changes) == sorted(writes), (
        "each queued write lands exactly once"
    )
    for path, data in writes.items():
        assert b"".join(plane.read_stream(repo, "main", path)) == data
    c3 = plane.commit(repo, "main", "writes made while the hub was away").id
    for path, data in {**head, **writes}.items():
        assert b"".join(plane.read_stream(repo, c3, path)) == data

    # A second kill -9 and restart replays nothing.
    spoke.restart(kill=True)
    time.sleep(2.0)
    assert list(plane.uncommitted(repo, "main")) == []
    s = spoke.stats()
    assert s["writeback_pending"] == 0 and s["writeback_landed"] == 0
    with spoke.client(timeout=30) as c:
        wait_for(
            lambda: (
                get(c, repo, "main", "d/new-b.txt").headers.get("x-fabric-commit") == c3
            ),
            timeout=5,
        )
        for path, data in writes.items():
            assert get(c, repo, "main", path).content == data


def test_hub_durability_is_the_default_and_fails_clearly_when_the_hub_is_away(
    outage,
) -> None:
    hub, spoke = outage
    repo = unique_name("hubdur")
    hub.plane().create_repo(repo)
    with spoke.client(timeout=30) as c:
        assert c.get(f"/api/v1/repos/{repo}/refs/main/list").status_code == 200
        r = c.put(
            f"/api/v1/repos/{repo}/branches/main/objects",
            params={"path": "x"},
            content=b"x",
        )
        assert r.status_code == 201
        hub.kill()
        r = c.put(
            f"/api/v1/repos/{repo}/branches/main/objects",
            params={"path": "y"},
            content=b"y",
        )
        assert r.status_code == 503
        assert "hub" in r.json()["error"]["message"]
        assert spoke.stats()["writeback_pending"] == 0


def test_fabric_fsspec_asks_the_spoke_for_the_durability_it_is_given(outage, monkeypatch) -> None:
    """``fabric://``'s ``durability=`` (or ``$FABRIC_DURABILITY``) goes with every write: ``local``
    writes while the hub is away; the spoke's default (``hub``) fails clearly; a bad level is
    refused before anything is sent."""
    hub, spoke = outage
    repo = unique_name("fsdur")
    hub.plane().create_repo(repo)

    def fs(**options):
        return FabricFileSystem(server=spoke.url, token=hub.token, skip_instance_cache=True, **options)

    with pytest.raises(ValueError, match="unknown durability 'disk': use one of local, replicated, hub"):
        fs(durability="disk")
    local, default = fs(durability="local"), fs()
    monkeypatch.setenv("FABRIC_DURABILITY", "local")
    from_env = fs()
    data = random_bytes(300_000, 21)
    for f in (local, default, from_env):
        assert not f.exists(f"{repo}@main/kept.bin")  # (the spoke now knows the token and the branch)
    hub.kill()
    local.pipe_file(f"{repo}@main/kept.bin", data)
    from_env.pipe_file(f"{repo}@main/env.bin", b"from the environment")
    assert local.cat_file(f"{repo}@main/kept.bin") == data
    with pytest.raises(OSError, match="hub"):
        default.pipe_file(f"{repo}@main/lost.bin", b"not kept")
    hub.start()
    plane = hub.plane()
    wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=30)
    assert plane.read(repo, "main", "kept.bin") == data
    assert plane.read(repo, "main", "env.bin") == b"from the environment"
    assert sorted(p for p, _ in plane.walk(repo, "main")) == ["env.bin", "kept.bin"]


def test_a_commit_while_chunks_go_up_early_sends_each_chunk_once(tmp_path) -> None:
    """A file written at ``local`` goes up to the hub early, in the background. A commit right
    after it (``--commit-checkpoints``, a checkpoint's ``finish()``) waits for those uploads
    rather than asking the hub for the chunks while they are still on the link, and sending
    them a second time."""
    data = random_bytes(4 * 1024 * 1024, 31)
    with (
        start_restartable_hub(tmp_path / "hub") as hub,
        WanProxy("127.0.0.1", hub.port, rate_mbit=20) as link,  # 4 MiB: about 1.7 s on the link
        start_spoke(link.url_for(), tmp_path / "cache", "256MiB", token=hub.token) as spoke,
    ):
        repo = unique_name("early")
        hub.plane().create_repo(repo)
        plane = HttpPlane(spoke.url, hub.token)
        sent = link.bytes_up
        plane.put_object(repo, "main", "ckpt.bin", io.BytesIO(data), durability="local")
        plane.commit(repo, "main", "right after the write")
        assert hub.plane().read(repo, "main", "ckpt.bin") == data
        assert link.bytes_up - sent < 1.2 * len(data), f"{link.bytes_up - sent} bytes sent up for {len(data)}"


def _local_upload(sp, repo: str, data: bytes) -> Entry:
    """Chunk ``data`` and upload what the spoke lacks for ``repo`` with local durability; the file entry."""
    sink = PackSession(
        lambda ids: sp.missing_chunks(ids, "local", repo=repo),
        lambda builder: sp.receive_pack(builder.finish(), "local", repo=repo),
        UPLOAD_PACK_SIZE,
    )
    chunks, md5 = ingest_stream(io.BytesIO(data), sink)
    sink.close()
    return file_entry(chunks, md5)


@pytest.mark.slow
def test_chunk_exchange_and_staging_with_local_durability_queue_at_the_spoke(outage) -> None:
    """What a mount does (missing chunks, packs, entries), asking ``local``: kept on the
    spoke's disk while the hub is away, landed once when it returns."""
    hub, spoke = outage
    plane = hub.plane()
    repo = unique_name("localx")
    plane.create_repo(repo)
    keep, cold = random_bytes(600_000, 11), random_bytes(700_000, 12)
    plane.put_object(repo, "main", "keep.bin", io.BytesIO(keep))
    plane.put_object(repo, "main", "cold.bin", io.BytesIO(cold))
    plane.commit(repo, "main", "base")
    sp = spoke.plane()
    cold_entry = sp.stat_chunks(repo, "main", "cold.bin")  # metadata cached; its bytes never fetched
    hub.kill()
    time.sleep(LEASE + 0.5)

    new = random_bytes(3_000_000, 13)
    chunked = PackSession(lambda ids: list(ids), lambda b: None, UPLOAD_PACK_SIZE)
    ids = [cid for cid, _ in ingest_stream(io.BytesIO(new), chunked)[0]]
    assert sp.missing_chunks(ids, "local") == list(dict.fromkeys(ids))
    # Staging before the chunks are anywhere: refused (the hub cannot vouch for them), nothing queued.
    premature = file_entry([(cid, 0) for cid in ids], "0" * 32)
    with pytest.raises(Unavailable, match="neither in the spoke's cache"):
        sp.stage(repo, "main", {"new.bin": premature}, "local")
    assert spoke.stats()["writeback_pending"] == 0

    entry = _local_upload(sp, repo, new)
    assert sp.missing_chunks(ids, "local") == []
    # A new file, a rename of a file whose bytes this spoke never held, a delete.
    sp.stage(repo, "main", {"new.bin": entry, "cold.bin": None, "moved/cold.bin": cold_entry}, "local")
    sp.delete_object(repo, "main", "keep.bin", "local")
    assert spoke.stats()["writeback_pending"] == 4
    assert sp.read(repo, "main", "new.bin") == new
    assert [p for p, _ in sp.walk(repo, "main")] == ["moved/cold.bin", "new.bin"]

    # Uploaded, not staged yet: its chunks are pinned waiting for their entry, across a restart too.
    later = random_bytes(2_000_000, 16)
    pinned = spoke.stats()["cache_pinned_bytes"]
    later_entry = _local_upload(sp, repo, later)
    later_ids = [cid for cid, _ in later_entry.chunks]
    assert spoke.stats()["cache_pinned_bytes"] > pinned
    pinned = spoke.stats()["cache_pinned_bytes"]

    spoke.restart(kill=True)  # queued writes and their pinned chunks survive kill -9
    assert sp.read(repo, "main", "new.bin") == new
    assert spoke.stats()["cache_pinned_bytes"] == pinned
    hub.start()
    wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=45, interval=0.2)
    # ... and are sent on to the hub by themselves, then unpinned.
    wait_for(lambda: plane.missing_chunks(later_ids, repo=repo) == [], timeout=45, interval=0.2)
    wait_for(lambda: spoke.stats()["cache_pinned_bytes"] == 0, timeout=30, interval=0.2)
    changes = {ch.path: ch.kind for ch in plane.uncommitted(repo, "main")}
    assert changes == {"new.bin": "added", "cold.bin": "removed", "moved/cold.bin": "added", "keep.bin": "removed"}
    assert plane.read(repo, "main", "new.bin") == new
    assert plane.read(repo, "main", "moved/cold.bin") == cold

    # An entry whose chunks nobody holds, with the hub up: 400, nothing queued or staged.
    with pytest.raises(ChunksMissing, match="is not stored") as refused:
        sp.stage(repo, "main", {"ghost.bin": file_entry([(b"\x01" * 32, 10)], "0" * 32)}, "local")
    assert refused.value.missing == ["01" * 32]
    assert spoke.stats()["writeback_pending"] == 0
    assert "ghost.bin" not in {ch.path for ch in plane.uncommitted(repo, "main")}
    # Packs with a bad frame, or not packs at all: refused whole, nothing pinned.
    good, bad = random_bytes(5000, 14), random_bytes(5000, 15)
    builder = packs.PackBuilder()
    builder.add(chunk_id(good), frames.encode(good))
    builder.add(chunk_id(bad), frames.encode(bad))
    pack = bytearray(builder.finish())
    pack[builder.chunks[1].offset + 40] ^= 0xFF
    pinned = spoke.stats()["cache_pinned_bytes"]
    for refused in (bytes(pack), b"not a pack at all" * 100):
        with pytest.raises(BadRequest, match="pack"):
            sp.receive_pack(refused, "local", repo=repo)
    assert spoke.stats()["cache_pinned_bytes"] == pinned
    assert sp.missing_chunks([chunk_id(good)], "local") == [chunk_id(good)]


def test_chunks_uploaded_with_local_durability_go_on_to_the_hub_before_their_entries(outage) -> None:
    """The push to the hub overlaps the client's upload: chunks are sent on as they arrive,
    the entry staged later lands without sending them again, and reading it back at the
    spoke afterwards costs no round trip to the hub."""
    hub, spoke = outage
    plane, sp = hub.plane(), spoke.plane()
    repo = unique_name("early")
    plane.create_repo(repo)
    data = random_bytes(2_000_000, 21)
    entry = _local_upload(sp, repo, data)
    ids = list(dict.fromkeys(cid for cid, _ in entry.chunks))
    wait_for(lambda: plane.missing_chunks(ids) == [], timeout=30, interval=0.1)
    stats = spoke.stats()
    assert stats["writeback_early_chunks"] == len(ids) and stats["writeback_pending"] == 0
    sent = stats["upstream_bytes_sent_push"]
    assert sent >= len(data)

    assert [p for p, _ in sp.walk(repo, "main")] == []  # the spoke now caches main's staging
    sp.stage(repo, "main", {"ckpt.bin": entry}, "local")
    wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=30, interval=0.1)
    assert plane.read(repo, "main", "ckpt.bin") == data
    stats = spoke.stats()
    assert stats["upstream_bytes_sent_push"] - sent < 100_000  # the entry, not the data again
    # Its own landed write is added to the cached staging: reading it back asks the hub nothing.
    assert sp.read(repo, "main", "ckpt.bin") == data
    assert [p for p, _ in sp.walk(repo, "main")] == ["ckpt.bin"]
    assert spoke.stats()["upstream_requests"] == stats["upstream_requests"]


def test_uploaded_chunks_that_no_entry_claims_are_unpinned_after_the_hold(hub, tmp_path) -> None:
    """A client that uploads with local durability and dies before staging does not leave
    its chunks pinned for good: after the hold they are ordinary cached chunks (already
    sent on to the hub), which the cache may evict."""
    repo = unique_name("hold")
    hub.plane().create_repo(repo)
    plane = SpokePlane(hub.url, hub.token, str(tmp_path / "cache"), 64 << 20, upload_hold=3.0)
    try:
        entry = _local_upload(plane, repo, random_bytes(1_500_000, 31))
        ids = list(dict.fromkeys(cid for cid, _ in entry.chunks))
        wait_for(lambda: plane.stats()["cache_pinned_bytes"] == 0, timeout=30, interval=0.1)
        assert all(cid in plane.chunk_cache for cid in ids)
        assert hub.plane().missing_chunks(ids) == []
    finally:
        plane.close()


def test_local_writes_beyond_the_pinned_budget_are_refused_whole_with_507(hub, tmp_path) -> None:
    """Writes queued at a spoke are pinned in its cache: a pack that cannot fit beside them
    is refused whole (507; a mount turns it into ENOSPC, see test_fuse_rw) and pins nothing."""
    with start_spoke(hub.url, tmp_path / "cache", "4MiB", token=hub.token) as spoke:
        sp = spoke.plane()
        repo = unique_name("full")
        hub.plane().create_repo(repo)
        with pytest.raises(StorageFull, match="cache budget"):
            _local_upload(sp, repo, random_bytes(4_000_000, 41))
        assert spoke.stats()["cache_pinned_bytes"] == 0
        entry = _local_upload(sp, repo, random_bytes(1_000_000, 42))  # what fits is taken
        ids = [cid for cid, _ in entry.chunks]
        assert entry.size == 1_000_000 and sp.missing_chunks(ids, "local", repo=repo) == []


def test_a_full_pinned_budget_slows_local_writes_to_the_link_and_loses_nothing(hub, tmp_path) -> None:
    """Back-pressure: three times the pinned budget written with local durability through a
    10 MB/s link to the hub. No write fails: each waits until the write-back has moved
    enough to the hub, so the writer runs at about the link's pace, and every byte lands."""
    repo = unique_name("press")
    hub.plane().create_repo(repo)
    data = random_bytes(60 << 20, 43)
    hub_port = int(hub.url.rsplit(":", 1)[1])
    with WanProxy("127.0.0.1", hub_port, rate_mbit=80) as wan:
        with start_spoke(wan.url_for(), tmp_path / "cache", "24MiB", token=hub.token) as spoke:
            budget = 24 << 20
            sp = spoke.plane()
            t0 = time.monotonic()
            entry = _local_upload(sp, repo, data)
            took = time.monotonic() - t0
            sp.stage(repo, "main", {"big.bin": entry}, "local")
            # At least the bytes beyond the budget crossed the 10 MB/s link before the last pack was taken.
            assert took >= (len(data) - budget) / 10e6 * 0.8, took
            wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=60, interval=0.2)
    assert hub.plane().read(repo, "main", "big.bin") == data


@contextlib.contextmanager
def _full_spoke_with_the_hub_away(hub, tmp_path, full_wait: str) -> Iterator[tuple[Spoke, str]]:
    """A spoke with an 8 MiB cache and ``--full-wait``, 3 MiB of local writes pinned in it, and
    its hub unreachable (so nothing leaves the pinned budget); and the repository written to."""
    repo = unique_name("full")
    hub.plane().create_repo(repo)
    hub_port = int(hub.url.rsplit(":", 1)[1])
    with WanProxy("127.0.0.1", hub_port) as wan:
        with start_spoke(wan.url_for(), tmp_path / "cache", "8MiB", token=hub.token, args=["--full-wait", full_wait]) as spoke:
            sp = spoke.plane()
            sp.missing_chunks([bytes(32)], "local", repo=repo)  # the spoke has seen the token
            wan.cut()
            assert _local_upload(sp, repo, random_bytes(3 << 20, 44)).size == 3 << 20
            assert spoke.stats()["cache_pinned_bytes"] >= 3 << 20
            yield spoke, repo


def test_with_full_wait_0_a_full_budget_fails_at_once_and_pins_nothing_more(hub, tmp_path) -> None:
    """Fail-fast (``--full-wait 0``): the write that does not fit is refused at once (507),
    and what was pinned before stays pinned."""
    with _full_spoke_with_the_hub_away(hub, tmp_path, "0") as (spoke, repo):
        pinned = spoke.stats()["cache_pinned_bytes"]
        t0 = time.monotonic()
        with pytest.raises(StorageFull, match="cache budget"):
            _local_upload(spoke.plane(), repo, random_bytes(5 << 20, 45))
        assert time.monotonic() - t0 < 5
        assert spoke.stats()["cache_pinned_bytes"] == pinned


def test_full_wait_bounds_how_long_a_write_waits_for_an_unreachable_hub(hub, tmp_path) -> None:
    with _full_spoke_with_the_hub_away(hub, tmp_path, "2") as (spoke, repo):
        t0 = time.monotonic()
        with pytest.raises(StorageFull, match="after waiting 2 s"):
            _local_upload(spoke.plane(), repo, random_bytes(5 << 20, 47))
        assert 1.5 < time.monotonic() - t0 < 30


@pytest.mark.parametrize("how", ["discard", "reset"])
def test_discarding_a_branch_drops_its_queued_writes_too(hub, tmp_path, how: str) -> None:
    """Writes queued at the spoke are uncommitted changes of their branch: a discard or a
    reset of the branch drops them (none lands after it); while the hub is away the discard
    fails and the queue keeps them."""
    repo = unique_name("disc")
    hub.plane().create_repo(repo)
    hub_port = int(hub.url.rsplit(":", 1)[1])
    with WanProxy("127.0.0.1", hub_port) as wan:
        with start_spoke(wan.url_for(), tmp_path / "cache", "64MiB", token=hub.token, durability="local") as spoke:
            sp = spoke.plane()
            head = sp.resolve_commit(repo, "main")
            wan.cut()
            sp.put_object(repo, "main", "queued.bin", io.BytesIO(random_bytes(300_000, 48)))
            assert sp.stat(repo, "main", "queued.bin").size == 300_000  # read-your-writes at the spoke
            with pytest.raises(Unavailable):
                sp.discard(repo, "main")
            assert spoke.stats()["writeback_pending"] == 1  # a failed discard drops nothing
            wan.restore()
            if how == "discard":
                sp.discard(repo, "main")
            else:
                sp.reset_branch(repo, "main", head)
            assert spoke.stats()["writeback_pending"] == 0
            time.sleep(3)  # a write that slipped through would land within this
            assert not list(hub.plane().uncommitted(repo, "main"))
            assert spoke.stats()["cache_pinned_bytes"] == 0
