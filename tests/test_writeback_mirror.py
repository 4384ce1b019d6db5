"""``fabric mount --writeback --durability replicated`` (issue 16.2): fsync returns once the
file is on the mount's disk and a peer spoke keeps a copy (``fuse/mirror.py``,
``spoke/mirrors.py``), so losing the mount's machine and its spoke loses no file fsync
returned for.

The store on its own, then real mounts of a real spoke pair (``tests.test_spoke_replicated.pair``):
the first spoke mounted, the second keeping the copies.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time

import httpx
import pytest

from fabric.errors import BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge
from fabric.util.net import free_port
from spoke.mirrors import MirrorStore, Upload
from tests.fuse_helpers import fabric, mount_stats, mount_to_kill, mounted, needs_fuse
from tests.hubserver import Hub, unique_name
from tests.spokeserver import random_bytes, start_spoke, wait_for
from tests.test_fuse_writeback import _kill_with_open
from tests.test_spoke_replicated import new_repo, pair, spoke_token

MOUNT, OTHER = "a" * 32, "b" * 32
RID, RID2 = "1" * 32, "2" * 32


def _record(path: str = "ckpt/shard.bin", repo: str = "r") -> dict:
    return {"repo": repo, "branch": "main", "path": path, "mode": 0o644, "mtime_ns": 1, "meta": {}}


def _keep(store: MirrorStore, rid: str, data: bytes, record: dict | None = None, owner: str = "alice") -> None:
    upload = store.begin(MOUNT, owner, rid, record or _record(), len(data))
    with open(upload.path, "wb") as f:
        f.write(data)
    upload.finish(len(data))


# -- the store on its own --------------------------------------------------------------------
def test_the_store_keeps_copies_for_their_owner_only(tmp_path):
    store = MirrorStore(str(tmp_path), capacity=100)
    _keep(store, RID, b"x" * 60)
    assert store.stats()["mirrors_bytes"] == 60 and store.stats()["mirrors_files"] == 1
    with pytest.raises(PayloadTooLarge):  # 60 + 50 > 100: the mount stages the file instead
        store.begin(MOUNT, "alice", RID2, _record(), 50)
    with pytest.raises(Forbidden):
        store.drop(MOUNT, "mallory", RID)
    with pytest.raises(Forbidden):
        store.begin(MOUNT, "mallory", RID2, _record(), 1)
    with pytest.raises(NotFound):
        store.renew(OTHER, "alice")
    for bad in ("../" + "a" * 29, "A" * 32, "a" * 31):
        with pytest.raises(BadRequest):
            store.begin(bad, "alice", RID2, _record(), 1)
        with pytest.raises(BadRequest):
            store.drop(MOUNT, "alice", bad)
    for record in ({**_record(), "mode": "rw"}, {**_record(), "meta": {"k": 1}}, ["not", "a", "dict"], {"repo": "r"}):
        with pytest.raises(BadRequest):
            store.begin(MOUNT, "alice", RID2, record, 1)
    assert sorted(os.listdir(tmp_path / MOUNT)) == [f"{RID}.data", f"{RID}.json", "lease", "owner"]  # (nothing of the refused)
    assert store.drop(MOUNT, "alice", RID)
    assert store.stats()["mirrors_files"] == 0


def _half_sent(store: MirrorStore, size: int) -> Upload:
    """An upload of ``size`` bytes begun and cut short (4 bytes written)."""
    upload = store.begin(MOUNT, "alice", RID, _record(), size)
    with open(upload.path, "wb") as f:
        f.write(b"half")
    return upload


def test_a_short_body_keeps_nothing(tmp_path):
    store = MirrorStore(str(tmp_path), capacity=10)
    upload = _half_sent(store, 10)
    with pytest.raises(BadRequest, match="held 4 bytes, not the 10"):
        upload.finish(4)
    assert sorted(os.listdir(tmp_path / MOUNT)) == ["lease", "owner"]
    store.begin(MOUNT, "alice", RID2, _record(), 10)  # the room it took is free again


def test_a_lost_mounts_newest_copy_of_each_path_is_staged_then_forgotten(tmp_path):
    store = MirrorStore(str(tmp_path), promote_after=0.5)
    staged: list[tuple] = []

    def stage(repo, branch, path, f, mode, mtime_ns, meta):
        staged.append((repo, branch, path, f.read()))
        return path != "c.bin"  # (the branch holds a later version of c.bin)

    _keep(store, RID, b"old version", _record("a.bin"))
    time.sleep(0.02)  # (records are ordered by when they were written)
    _keep(store, RID2, b"new version", _record("a.bin"))
    _keep(store, "3" * 32, b"renamed", _record("b.tmp"))
    store.rename(MOUNT, "alice", "3" * 32, _record("b.bin"))
    _keep(store, "4" * 32, b"older than the branch's", _record("c.bin"))
    assert store.promote_lost(stage) == 0  # its lease is fresh
    time.sleep(0.6)
    assert store.promote_lost(stage) == 2
    assert sorted(staged) == [("r", "main", "a.bin", b"new version"), ("r", "main", "b.bin", b"renamed"),
                              ("r", "main", "c.bin", b"older than the branch's")]
    assert not os.path.exists(tmp_path / MOUNT)
    assert store.stats()["mirrors_promoted"] == 2 and store.stats()["mirrors_superseded"] == 1


def test_a_restarted_spoke_gives_every_mount_a_whole_takeover_to_renew(tmp_path):
    store = MirrorStore(str(tmp_path), promote_after=0.5)
    _keep(store, RID, b"data")
    time.sleep(0.6)  # the lease ran out while the spoke was down
    again = MirrorStore(str(tmp_path), promote_after=0.5)
    assert again.promote_lost(lambda *args: True) == 0
    time.sleep(0.6)
    assert again.promote_lost(lambda *args: True) == 1


def test_a_copy_that_cannot_be_staged_stays_for_the_next_round(tmp_path):
    store = MirrorStore(str(tmp_path), promote_after=0.0)
    calls = []

    def refuse(*args):
        calls.append(args[2])
        raise NotFound("branch 'main' does not exist")

    _keep(store, RID, b"data")
    assert store.promote_lost(refuse) == 0 and calls == ["ckpt/shard.bin"]
    assert store.stats()["mirrors_files"] == 1


def test_a_copy_that_only_grew_is_appended_to_and_nothing_else_is(tmp_path):
    store = MirrorStore(str(tmp_path), capacity=100)
    data, record = tmp_path / MOUNT / f"{RID}.data", tmp_path / MOUNT / f"{RID}.json"
    _keep(store, RID, b"x" * 10)

    def append(offset: int, body: bytes, size: int, path: str = "ckpt/shard.bin") -> None:
        upload = store.begin(MOUNT, "alice", RID, _record(path), size, offset)
        with open(upload.path, "r+b") as f:
            f.seek(offset)
            f.write(body)
        upload.finish(len(body))

    for offset, rid, owner, error in ((8, RID, "alice", Conflict), (10, RID2, "alice", Conflict), (10, RID, "mallory", Forbidden)):
        with pytest.raises(error):  # another length than the copy's; no copy of RID2; another token's
            store.begin(MOUNT, owner, rid, _record(), 5, offset)
    append(10, b"y" * 5, 5, "ckpt/renamed.bin")
    assert data.read_bytes() == b"x" * 10 + b"y" * 5 and json.loads(record.read_text())["path"] == "ckpt/renamed.bin"
    with pytest.raises(BadRequest, match="held 3 bytes, not the 10"):
        append(15, b"zzz", 10)  # cut short: cut off again, the record unchanged
    assert data.read_bytes() == b"x" * 10 + b"y" * 5 and json.loads(record.read_text())["path"] == "ckpt/renamed.bin"
    with pytest.raises(PayloadTooLarge):  # 15 held + 90 > 100
        store.begin(MOUNT, "alice", RID, _record(), 90, 15)
    append(15, b"z" * 85, 85)  # the room the refused ones took is free again
    assert store.stats()["mirrors_bytes"] == 100


def test_a_spoke_killed_mid_copy_drops_the_partial_upload_when_it_starts(tmp_path):
    _half_sent(MirrorStore(str(tmp_path)), 10)
    MirrorStore(str(tmp_path))  # the spoke's next start
    assert sorted(os.listdir(tmp_path / MOUNT)) == ["lease", "owner"]


# -- through a spoke's routes -----------------------------------------------------------------
def test_the_routes_refuse_bad_input_and_other_tokens(hub: Hub, tmp_path):
    repo, other_repo = new_repo(hub), new_repo(hub)
    writer = hub.plane().create_token(unique_name("w"), roles={repo: "write"})["token"]
    reader = hub.plane().create_token(unique_name("r"), roles={repo: "read"})["token"]
    with pair(hub, tmp_path) as p:
        base = f"{p.b.url}/api/v1/mirror/{MOUNT}"

        def put(token: str, record: object, body: bytes, rid: str = RID, **headers: str) -> httpx.Response:
            h = {"Authorization": f"Bearer {token}", "X-Fabric-Record": json.dumps(record), **headers}
            return httpx.put(f"{base}/files/{rid}", content=body, headers=h)

        r = put(reader, _record(repo=repo), b"data")
        assert r.status_code == 403, r.text
        assert put(writer, _record(repo=other_repo), b"data").status_code == 403  # another repository's
        assert put(writer, {"repo": repo}, b"data").status_code == 400
        assert put(writer, _record(repo=repo), b"data", rid="../x").status_code in (400, 404)
        assert put(writer, "not json{", b"data").status_code == 400
        assert p.b.stats()["mirrors_files"] == 0

        assert put(writer, _record(repo=repo), b"kept").status_code == 204
        assert p.b.stats()["mirrors_files"] == 1 and p.b.stats()["mirrors_bytes"] == 4
        spoke_token = {"Authorization": f"Bearer {p.token}"}  # (it may write every repository, but sent no copy)
        assert httpx.delete(f"{base}/files/{RID}", headers=spoke_token).status_code == 403
        assert httpx.post(f"{base}/lease", headers=spoke_token).status_code == 403
        assert httpx.delete(f"{base}/lease", headers=spoke_token).status_code == 403
        mine = {"Authorization": f"Bearer {writer}"}
        assert httpx.post(f"{base}/lease", headers=mine).status_code == 204
        assert httpx.delete(f"{base}/files/{RID}", headers=mine).status_code == 204
        assert p.b.stats()["mirrors_files"] == 0

        peer = httpx.get(f"{p.a.url}/api/v1/mirror/peer", headers=mine)
        assert peer.status_code == 200 and peer.json() == {"peer": p.b.url}


# -- mounts ------------------------------------------------------------------------------------
def _fsynced(path: str, data: bytes):
    """``path`` written with ``data`` and fsynced, and kept open: it stays parked (a file is
    staged after its last close)."""
    f = open(path, "wb")  # noqa: SIM115 - the caller closes it (or kills the mount first)
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
    return f


def _opts(write_dir) -> tuple[str, ...]:
    return ("--rw", "--writeback", "--write-dir", str(write_dir), "--durability", "replicated")


@needs_fuse
def test_fsync_leaves_a_copy_at_the_peer_which_is_dropped_once_staged(hub: Hub, tmp_path):
    repo = new_repo(hub)
    data = random_bytes(3 << 20, 61)
    with pair(hub, tmp_path) as p:
        with mounted(p.a.url, p.token, f"{repo}@main", tmp_path / "mnt", *_opts(tmp_path / "w")) as mnt:
            with open(f"{mnt}/shard.bin", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                held = p.b.stats()
                assert held["mirrors_files"] == 1 and held["mirrors_bytes"] == len(data)  # before fsync returned
                [mount_dir] = [d for d in os.listdir(p.b.cache + "/mirrors")]
                kept = [n for n in os.listdir(f"{p.b.cache}/mirrors/{mount_dir}") if n.endswith(".data")]
                assert open(f"{p.b.cache}/mirrors/{mount_dir}/{kept[0]}", "rb").read() == data
            wait_for(lambda: p.b.stats()["mirrors_files"] == 0, timeout=30, interval=0.2)  # staged, so dropped
        assert p.b.stats()["mirrors_mounts"] == 0  # a clean unmount ends the lease
        wait_for(lambda: p.b.stats()["replicas_held"] == 0, timeout=60, interval=0.5)
    assert hub.plane().read(repo, "main", "shard.bin") == data


@needs_fuse
@pytest.mark.timeout(300)
def test_losing_the_mounts_machine_after_fsync_loses_nothing(hub: Hub, tmp_path):
    """kill -9 of the mount and of the spoke beside it, and the write-dir and the spoke's cache
    deleted (the machine lost) while fsynced files were parked: the peer stages them once the lease runs out, except
    one whose path meanwhile got a later version at the hub."""
    repo = new_repo(hub)
    data = random_bytes(2 << 20, 62)
    with pair(hub, tmp_path, takeover=5.0) as p:
        mp = str(tmp_path / "mnt")
        with mount_to_kill(p.a.url, p.token, f"{repo}@main", mp, _opts(tmp_path / "w")) as pid:
            os.makedirs(f"{mp}/ckpt")
            shard = _fsynced(f"{mp}/ckpt/shard.bin", data)
            meta = _fsynced(f"{mp}/ckpt/.metadata.tmp", b"step 1")  # DCP's last step
            os.rename(f"{mp}/ckpt/.metadata.tmp", f"{mp}/ckpt/.metadata")  # made on the mount alone; the peer hears
            log = _fsynced(f"{mp}/train.log", b"old line\n")
            assert p.b.stats()["mirrors_files"] == 3
            _kill_with_open(pid, shard)
            for f in (meta, log):
                with contextlib.suppress(OSError):  # (its mount is gone)
                    f.close()
            p.a.kill()
        shutil.rmtree(tmp_path / "w")
        shutil.rmtree(p.a.cache)  # (the machine's disk is gone: the mounted spoke's cache with it)
        hub.plane().put_object(repo, "main", "train.log", io.BytesIO(b"newer, from elsewhere\n"))  # (its mtime: now)
        wait_for(lambda: p.b.stats()["mirrors_promoted"] == 2, timeout=30, interval=0.5)
        wait_for(lambda: p.b.stats()["writeback_pending"] == 0, timeout=60, interval=0.5)
        assert p.b.stats()["mirrors_superseded"] == 1
    assert hub.plane().read(repo, "main", "ckpt/shard.bin") == data
    assert hub.plane().read(repo, "main", "ckpt/.metadata") == b"step 1"
    assert sorted(path for path, _ in hub.plane().list(repo, "main", "ckpt/").entries) == ["ckpt/.metadata", "ckpt/shard.bin"]
    assert hub.plane().read(repo, "main", "train.log") == b"newer, from elsewhere\n"


@needs_fuse
@pytest.mark.timeout(300)
def test_a_mount_restarted_in_time_takes_its_copies_back_and_the_peer_stages_nothing(hub: Hub, tmp_path):
    """kill -9 of the mount alone, started again with the same --write-dir within the peer's
    takeover: it renews the same lease, stages the parked file, and drops the peer's copy."""
    repo = new_repo(hub)
    data = random_bytes(1 << 20, 63)
    with pair(hub, tmp_path, takeover=60.0) as p:
        mp = str(tmp_path / "mnt")
        with mount_to_kill(p.a.url, p.token, f"{repo}@main", mp, _opts(tmp_path / "w")) as pid:
            shard = _fsynced(f"{mp}/shard.bin", data)
            assert p.b.stats()["mirrors_files"] == 1
            _kill_with_open(pid, shard)
        with mounted(p.a.url, p.token, f"{repo}@main", mp, *_opts(tmp_path / "w")) as mnt:
            assert open(f"{mnt}/shard.bin", "rb").read() == data
            wait_for(lambda: p.b.stats()["mirrors_files"] == 0, timeout=30, interval=0.2)
        assert p.b.stats()["mirrors_promoted"] == 0 and p.b.stats()["mirrors_mounts"] == 0
        wait_for(lambda: p.a.stats()["writeback_pending"] == 0, timeout=60, interval=0.5)
    assert hub.plane().read(repo, "main", "shard.bin") == data


@needs_fuse
def test_without_a_peer_fsync_never_returns_as_if_replicated(hub: Hub, tmp_path):
    """The peer is down: fsync stages at the spoke at replicated, which needs that peer too,
    so it fails (EIO, after --server-timeout) rather than return with a single copy."""
    repo = new_repo(hub)
    with pair(hub, tmp_path) as p:
        with mounted(p.a.url, p.token, f"{repo}@main", tmp_path / "mnt", *_opts(tmp_path / "w"), "--server-timeout", "3") as mnt:
            p.b.kill()
            with open(f"{mnt}/shard.bin", "wb") as f:
                f.write(b"x" * 1000)
                f.flush()
                with pytest.raises(OSError):
                    os.fsync(f.fileno())


@needs_fuse
def test_writeback_at_replicated_needs_a_spoke_in_a_group(hub: Hub, tmp_path):
    repo = new_repo(hub)
    mp = tmp_path / "mnt"
    os.makedirs(mp)
    refused = fabric("mount", hub.url, f"{repo}@main", str(mp), *_opts(tmp_path / "w"), token=hub.token, check=False)
    assert refused.returncode != 0 and "needs a spoke in a group" in refused.stderr, refused.stderr
    assert not os.path.ismount(mp)


@needs_fuse
@pytest.mark.timeout(300)
def test_a_mount_whose_peer_dies_stages_inline_then_takes_another_peer(hub: Hub, tmp_path):
    """Three spokes in a group: the mount's peer is killed; the next fsync stages inline (at
    replicated, which the spoke copies to the third), and the mount takes the third as its
    peer for the fsyncs after it."""
    repo = new_repo(hub)
    token = spoke_token(hub)
    ports = [free_port() for _ in range(3)]
    peers = ",".join(f"http://127.0.0.1:{port}" for port in ports)
    with contextlib.ExitStack() as stack:
        spokes = {f"http://127.0.0.1:{port}": stack.enter_context(
            start_spoke(hub.url, tmp_path / f"s{port}", "256MiB", token=token, port=port,
                        args=["--peers", peers, "--advertise", f"http://127.0.0.1:{port}"])) for port in ports}
        mounted_spoke = spokes[f"http://127.0.0.1:{ports[0]}"]
        with mounted(mounted_spoke.url, token, f"{repo}@main", tmp_path / "mnt", *_opts(tmp_path / "w")) as mnt:
            first = spokes[mount_stats(mnt, "writeback")["mirror"]["peer"]]
            [other] = [s for url, s in spokes.items() if s not in (mounted_spoke, first)]
            first.kill()
            _fsynced(f"{mnt}/second.bin", b"2" * 1000).close()  # staged inline: the peer does not answer
            taken = mount_stats(mnt, "writeback", until=lambda s: s["mirror"]["switched"] == 1)["mirror"]
            assert taken["peer"] == other.url and taken["failed"] >= 1
            with _fsynced(f"{mnt}/third.bin", b"3" * 1000):
                assert other.stats()["mirrors_files"] == 1  # the copy went to the peer it took
        wait_for(lambda: mounted_spoke.stats()["writeback_pending"] == 0, timeout=60, interval=0.5)
        for name, byte in (("second.bin", b"2"), ("third.bin", b"3")):
            assert hub.plane().read(repo, "main", name) == byte * 1000


@needs_fuse
def test_a_file_that_only_grew_since_its_copy_is_sent_as_what_it_grew_by(hub: Hub, tmp_path):
    """A log-like file fsynced after each append: the peer gets each fsync's new bytes only; a
    change inside what it holds sends the file whole again."""
    repo = new_repo(hub)
    first, more, head = random_bytes(1 << 20, 63), random_bytes(1 << 20, 64), b"rewritten"
    with pair(hub, tmp_path) as p:
        with mounted(p.a.url, p.token, f"{repo}@main", tmp_path / "mnt", *_opts(tmp_path / "w")) as mnt:

            def peer_copy() -> bytes:
                [mount_dir] = os.listdir(p.b.cache + "/mirrors")
                [kept] = [n for n in os.listdir(f"{p.b.cache}/mirrors/{mount_dir}") if n.endswith(".data")]
                return open(f"{p.b.cache}/mirrors/{mount_dir}/{kept}", "rb").read()

            with open(f"{mnt}/log.bin", "wb") as f:
                for part in (first, more):
                    f.write(part)
                    f.flush()
                    os.fsync(f.fileno())
                sent = mount_stats(mnt, "writeback", until=lambda s: s["mirror"]["kept"] == 2)["mirror"]
                assert sent["kept_bytes"] == len(first) + len(more) and sent["appended"] == 1
                assert peer_copy() == first + more
                f.seek(0)
                f.write(head)
                f.flush()
                os.fsync(f.fileno())
                sent = mount_stats(mnt, "writeback", until=lambda s: s["mirror"]["kept"] == 3)["mirror"]
                assert sent["kept_bytes"] == 2 * (len(first) + len(more)) and sent["appended"] == 1
                assert peer_copy() == head + first[len(head):] + more
            wait_for(lambda: p.b.stats()["mirrors_files"] == 0, timeout=30, interval=0.2)
    assert hub.plane().read(repo, "main", "log.bin") == head + first[len(head):] + more
