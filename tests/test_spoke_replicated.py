"""The ``replicated`` durability tier (issue 16.2): a write is on its spoke's disk and on one
peer spoke's disk before it is acknowledged, so losing the first spoke machine loses nothing.

Real hub, two real spokes in a static group (``--peers``), the first reaching its hub
through a WAN proxy the tests cut; writes go through the chunk exchange a mount uses
(missing chunks, packs, staged entries) and through ``put_object``.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx
import pytest

from fabric.client.http import UPLOAD_PACK_SIZE
from fabric.errors import BadRequest, Unavailable
from fabric.format.ingest import PackSession, file_entry, ingest_stream
from fabric.format.model import Entry
from fabric.util.net import free_port
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import Hub, unique_name
from tests.spokeserver import Spoke, random_bytes, start_spoke, wait_for


@dataclass
class Pair:
    a: Spoke  # the spoke written to; its link to the hub can be cut
    b: Spoke  # its peer, which keeps the copies
    wan: WanProxy  # a's link to the hub
    token: str


def spoke_token(hub: Hub) -> str:
    return hub.plane().create_token(unique_name("repl"), roles={"*": "write"}, rights=["spoke"])["token"]


@contextmanager
def pair(hub: Hub, tmp_path, takeover: float = 3.0) -> Iterator[Pair]:
    token = spoke_token(hub)
    ports = [free_port(), free_port()]
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    args = ["--peers", peers, "--replica-takeover", str(takeover), "--log-level", "info"]
    hub_port = int(hub.url.rsplit(":", 1)[1])
    with ExitStack() as stack:
        wan = stack.enter_context(WanProxy("127.0.0.1", hub_port))
        a = stack.enter_context(
            start_spoke(wan.url_for(), tmp_path / "a", "256MiB", token=token, port=ports[0], args=[*args, "--advertise", f"http://127.0.0.1:{ports[0]}"])
        )
        b = stack.enter_context(
            start_spoke(hub.url, tmp_path / "b", "256MiB", token=token, port=ports[1], args=[*args, "--advertise", f"http://127.0.0.1:{ports[1]}"])
        )
        yield Pair(a, b, wan, token)


def upload(plane, repo: str, data: bytes, durability: str) -> Entry:
    """What a mount does: chunk, send the packs the spoke lacks, with ``durability``; the entry."""
    sink = PackSession(
        lambda ids: plane.missing_chunks(ids, durability, repo=repo),
        lambda builder: plane.receive_pack(builder.finish(), durability, repo=repo),
        UPLOAD_PACK_SIZE,
    )
    chunks, md5 = ingest_stream(io.BytesIO(data), sink)
    sink.close()
    return file_entry(chunks, md5)


def new_repo(hub: Hub) -> str:
    repo = unique_name("repl")
    hub.plane().create_repo(repo)
    return repo


def test_a_write_acknowledged_as_replicated_survives_the_loss_of_its_spoke(hub: Hub, tmp_path) -> None:
    repo = new_repo(hub)
    shard = random_bytes(24 << 20, 51)
    small = b"step 100 metadata"
    with pair(hub, tmp_path) as p:
        a = p.a.plane()
        a.resolve_commit(repo, "main")  # a knows its token and the branch before the hub goes away
        p.wan.cut()  # a cannot push anything to the hub from now on
        entry = upload(a, repo, shard, "replicated")
        a.stage(repo, "main", {"ckpt/shard-0.bin": entry}, "replicated")
        a.put_object(repo, "main", "ckpt/.metadata", io.BytesIO(small), durability="replicated")
        held = p.b.stats()
        assert held["replicas_held"] == 2 and held["cache_pinned_bytes"] >= len(shard)
        assert p.a.stats()["writeback_pending"] == 2
        # The first spoke's machine is lost: its process and its disk.
        p.a.kill()
        shutil.rmtree(p.a.cache)
        # Its peer notices, and pushes the writes to the hub itself.
        wait_for(lambda: p.b.stats()["replicas_promoted"] == 2, timeout=60, interval=0.5)
        wait_for(lambda: p.b.stats()["writeback_pending"] == 0, timeout=60, interval=0.5)
    plane = hub.plane()
    assert plane.read(repo, "main", "ckpt/shard-0.bin") == shard
    assert plane.read(repo, "main", "ckpt/.metadata") == small


def test_copies_are_dropped_once_the_writes_land(hub: Hub, tmp_path) -> None:
    repo = new_repo(hub)
    data = random_bytes(6 << 20, 52)
    with pair(hub, tmp_path, takeover=3600) as p:
        a = p.a.plane()
        entry = upload(a, repo, data, "replicated")
        a.stage(repo, "main", {"x.bin": entry}, "replicated")
        wait_for(lambda: p.a.stats()["writeback_pending"] == 0, timeout=60, interval=0.2)
        wait_for(lambda: p.b.stats()["replicas_held"] == 0, timeout=30, interval=0.2)
        assert p.b.stats()["cache_pinned_bytes"] == 0
        assert p.a.stats()["replication_copied_bytes"] >= len(data)
    assert hub.plane().read(repo, "main", "x.bin") == data


def test_a_newer_version_replaces_the_copy_of_an_older_one(hub: Hub, tmp_path) -> None:
    repo = new_repo(hub)
    with pair(hub, tmp_path) as p:
        a = p.a.plane()
        a.resolve_commit(repo, "main")
        p.wan.cut()
        for version in (b"v1", b"v2", b"v3"):
            a.put_object(repo, "main", "latest.txt", io.BytesIO(version), durability="replicated")
        assert p.b.stats()["replicas_held"] == 1
        p.a.kill()
        wait_for(lambda: p.b.stats()["writeback_pending"] == 0 and p.b.stats()["replicas_promoted"] == 1, timeout=60, interval=0.5)
    assert hub.plane().read(repo, "main", "latest.txt") == b"v3"


def test_replicated_needs_a_reachable_peer_and_fails_without_queueing(hub: Hub, tmp_path) -> None:
    repo = new_repo(hub)
    token = spoke_token(hub)
    with start_spoke(hub.url, tmp_path / "alone", "64MiB", token=token) as alone:
        with pytest.raises(BadRequest, match="needs a spoke in a group"):
            alone.plane().put_object(repo, "main", "x", io.BytesIO(b"x"), durability="replicated")
    with pair(hub, tmp_path) as p:
        p.b.kill()  # the only peer is gone
        with pytest.raises(Unavailable, match="no peer spoke of the group took a copy"):
            p.a.plane().put_object(repo, "main", "x", io.BytesIO(b"x"), durability="replicated")
        assert p.a.stats()["writeback_pending"] == 0  # nothing acknowledged, nothing queued


def test_only_a_spoke_token_may_hand_over_copies(hub: Hub, tmp_path) -> None:
    repo = new_repo(hub)
    writer = hub.plane().create_token(unique_name("writer"), roles={repo: "write"})["token"]
    with pair(hub, tmp_path) as p:
        with httpx.Client(base_url=p.b.url, headers={"Authorization": f"Bearer {writer}"}) as c:
            r = c.post("/api/v1/replica/missing", params={"repo": repo, "origin": p.a.url}, json={"ids": []})
            assert r.status_code == 403 and "spoke right" in r.json()["error"]["message"]
        with httpx.Client(base_url=p.b.url, headers={"Authorization": f"Bearer {p.token}"}) as c:
            r = c.post("/api/v1/replica/missing", params={"repo": repo, "origin": "ftp://x"}, json={"ids": []})
            assert r.status_code == 400
            r = c.post("/api/v1/replica/packs", params={"repo": repo, "origin": p.a.url}, content=b"not a pack")
            assert r.status_code == 400
        assert p.b.stats()["replicas_held"] == 0


@needs_fuse
def test_a_mount_with_replicated_durability_leaves_a_copy_at_the_peer(hub: Hub, tmp_path) -> None:
    repo = new_repo(hub)
    data = random_bytes(9 << 20, 53)
    with pair(hub, tmp_path) as p:
        with mounted(p.a.url, p.token, f"{repo}@main", tmp_path / "mnt", "--rw", "--durability", "replicated") as mnt:
            p.wan.cut()  # the write stays queued at the first spoke: its copy at the peer is what keeps it
            with open(f"{mnt}/shard.bin", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            assert p.b.stats()["replicas_held"] == 1
            p.wan.restore()
            wait_for(lambda: p.b.stats()["replicas_held"] == 0, timeout=60, interval=0.5)
    assert hub.plane().read(repo, "main", "shard.bin") == data
