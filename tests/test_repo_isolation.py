"""What a token for repository A may learn about repository B: nothing (issue 11, point 2).

Chunks are stored once (dedup on the hub's disk) but belong to repositories: a
token for A cannot fetch B's chunks by id, cannot learn whether B holds some
content, cannot build a file of A out of B's chunks, and a revoked token stops
receiving watch events. Real hub and spoke servers on loopback.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time

import httpx
import msgpack
import pytest

from fabric.client.http import HttpPlane
from fabric.engine.engine import OWNERSHIP_SETTING, Engine
from fabric.errors import BadRequest, NotFound, Unauthorized
from fabric.format import chunking, packs
from fabric.format.frames import encode
from fabric.format.model import Entry
from tests.hubserver import Hub
from tests.spokeserver import start_spoke
from tests.test_auth import make_repo, make_token
from tests.test_rest_api import expect_error

API = "/api/v1"


def pack_of(*raws: bytes) -> tuple[bytes, list[bytes]]:
    builder = packs.PackBuilder()
    ids = []
    for raw in raws:
        cid = chunking.chunk_id(raw)
        builder.add(cid, encode(raw))
        ids.append(cid)
    return builder.finish(), ids


def file_wire(ids: list[bytes], raws: list[bytes]) -> dict:
    sizes = [len(r) for r in raws]
    return Entry("file", sum(sizes), 0o644, 1, md5="0" * 32, chunks=tuple(zip(ids, sizes))).to_wire()


def tenants(hub: Hub) -> tuple[str, str, dict, bytes, list[bytes]]:
    """Repositories A and B; B holds a secret file; a token that may write A only; the secret's bytes and chunk ids."""
    a, b = make_repo(hub, "iso-a"), make_repo(hub, "iso-b")
    secret = os.urandom(300_000)
    with hub.client() as admin:
        r = admin.put(f"{API}/repos/{b}/branches/main/objects", params={"path": "secret.bin"}, content=secret)
        assert r.status_code == 201, r.text
        assert admin.post(f"{API}/repos/{b}/branches/main/commits", json={"message": "s"}).status_code == 201
        ids = _chunk_ids(admin, b, "secret.bin")
    tok = make_token(hub, "a-writer", {a: "write"})
    return a, b, tok, secret, ids


def _chunk_ids(c: httpx.Client, repo: str, path: str) -> list[bytes]:
    plane = HttpPlane(str(c.base_url), c.headers["authorization"][7:])
    try:
        return [cid for cid, _ in plane.stat_chunks(repo, "main", path).chunks]
    finally:
        plane.close()


def test_a_token_for_a_cannot_fetch_probe_or_reference_chunks_of_b(hub: Hub):
    a, b, tok, secret, ids = tenants(hub)
    never_stored = chunking.chunk_id(os.urandom(1000))
    with hub.client(token=tok["token"]) as c:
        # No fetch by id: 403 without a repository, 404 for A (the same answer as for an id stored nowhere).
        expect_error(c.post(f"{API}/chunks/frames", json={"ids": [ids[0].hex()]}), 403, "a-writer", "?repo=")
        foreign = expect_error(c.post(f"{API}/chunks/frames", json={"ids": [ids[0].hex()]}, params={"repo": a}), 404)
        nowhere = expect_error(c.post(f"{API}/chunks/frames", json={"ids": [never_stored.hex()]}, params={"repo": a}), 404)
        assert foreign["message"].replace(ids[0].hex(), "X") == nowhere["message"].replace(never_stored.hex(), "X")
        expect_error(c.post(f"{API}/chunks/frames", json={"ids": [ids[0].hex()]}, params={"repo": b}), 403, "a-writer", b)
        # No probing: B's chunks are as missing for A as chunks stored nowhere.
        asked = [cid.hex() for cid in ids] + [never_stored.hex()]
        assert c.post(f"{API}/chunks/missing", json={"ids": asked}, params={"repo": a}).json()["missing"] == asked
        expect_error(c.post(f"{API}/chunks/missing", json={"ids": asked}), 403, "a-writer")
        # No copying by reference: an entry of A built on B's chunk ids is refused, staged or committed.
        wire = Entry("file", len(secret), 0o644, 1, md5="0" * 32, chunks=tuple(zip(ids, [0] * len(ids)))).to_wire()
        body = msgpack.packb({"changes": {"stolen.bin": wire}}, use_bin_type=True)
        refused = expect_error(c.post(f"{API}/repos/{a}/branches/main/entries", content=body), 400, "not stored for repository", a)
        assert refused["code"] == "chunks_missing" and refused["missing"] and set(refused["missing"]) <= {cid.hex() for cid in ids}
        body = msgpack.packb({"changes": {"stolen.bin": wire}, "message": "m"}, use_bin_type=True)
        expect_error(c.post(f"{API}/repos/{a}/branches/main/commit-changes", content=body), 400, "not stored for repository")
        assert c.get(f"{API}/repos/{a}/branches/main/changes").json()["changes"] == []
        # Nor by sharing: that needs read access to B.
        expect_error(
            c.post(f"{API}/repos/{a}/chunks/share", json={"source_repo": b, "ids": [ids[0].hex()]}), 403, "a-writer", b
        )


def test_sending_the_bytes_makes_them_yours_and_is_stored_once(hub: Hub):
    """A writer who holds the bytes may use them: it sends them (dedup is per repository on
    the wire) and the hub keeps one copy on disk."""
    a, b = make_repo(hub, "iso-da"), make_repo(hub, "iso-db")
    raws = [os.urandom(50_000), os.urandom(70_000)]
    data, ids = pack_of(*raws)
    with hub.client() as admin:
        assert admin.post(f"{API}/chunks/packs", content=data, params={"repo": b}).json() == {"chunks": 2, "new": 2}
        stored = admin.get(f"{API}/stats").json()["stored_bytes"]
    tok = make_token(hub, "a-dedup", {a: "write"})
    with hub.client(token=tok["token"]) as c:
        assert c.post(f"{API}/chunks/packs", content=data, params={"repo": a}).json() == {"chunks": 2, "new": 0}
        assert c.post(f"{API}/chunks/missing", json={"ids": [i.hex() for i in ids]}, params={"repo": a}).json() == {"missing": []}
        body = msgpack.packb({"changes": {"mine.bin": file_wire(ids, raws)}, "message": "mine"}, use_bin_type=True)
        assert c.post(f"{API}/repos/{a}/branches/main/commit-changes", content=body).status_code == 201
        assert c.get(f"{API}/repos/{a}/refs/main/objects", params={"path": "mine.bin"}).content == b"".join(raws)
        frames = c.post(f"{API}/chunks/frames", json={"ids": [i.hex() for i in ids]}, params={"repo": a})
        assert frames.status_code == 200 and len(frames.content) > 100_000
    with hub.client() as admin:
        assert admin.get(f"{API}/stats").json()["stored_bytes"] == stored


def test_share_needs_read_on_the_source(hub: Hub):
    a, b, _, secret, ids = tenants(hub)
    both = make_token(hub, "reads-b-writes-a", {a: "write", b: "read"})
    with hub.client(token=both["token"]) as c:
        expect_error(
            c.post(f"{API}/repos/{a}/chunks/share", json={"source_repo": b, "ids": [chunking.chunk_id(b"x").hex()]}), 404
        )
        r = c.post(f"{API}/repos/{a}/chunks/share", json={"source_repo": b, "ids": [i.hex() for i in ids]})
        assert r.status_code == 204, r.text
        stat = HttpPlane(hub.url, hub.token).stat_chunks(b, "main", "secret.bin")
        body = msgpack.packb({"changes": {"copy.bin": stat.to_wire()}, "message": "copy"}, use_bin_type=True)
        assert c.post(f"{API}/repos/{a}/branches/main/commit-changes", content=body).status_code == 201
        assert c.get(f"{API}/repos/{a}/refs/main/objects", params={"path": "copy.bin"}).content == secret


def test_s3_copies_between_repositories_share_chunks(tmp_path):
    """CopyObject and UploadPartCopy from a bucket of B into a bucket of A, by a token that may
    read B and write A: the chunks are shared, no bytes move; without read on B, AccessDenied."""
    from botocore.exceptions import ClientError

    from tests.s3_helpers import start_s3_hub

    with start_s3_hub(tmp_path / "data") as h:
        a, b = "iso-s3a", "iso-s3b"
        h.plane().create_repo(a)
        h.plane().create_repo(b)
        body = os.urandom(300_000)
        h.boto3(h.token(admin=True)).put_object(Bucket=b, Key="main/src.bin", Body=body)
        s3 = h.boto3(h.token(roles={a: "write", b: "read"}, name="copier"))
        s3.copy_object(Bucket=a, Key="main/dst.bin", CopySource={"Bucket": b, "Key": "main/src.bin"})
        assert s3.get_object(Bucket=a, Key="main/dst.bin")["Body"].read() == body
        up = s3.create_multipart_upload(Bucket=a, Key="main/mp.bin")["UploadId"]
        part = s3.upload_part_copy(
            Bucket=a, Key="main/mp.bin", UploadId=up, PartNumber=1, CopySource={"Bucket": b, "Key": "main/src.bin"}
        )
        s3.complete_multipart_upload(
            Bucket=a, Key="main/mp.bin", UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["CopyPartResult"]["ETag"]}]},
        )
        assert s3.get_object(Bucket=a, Key="main/mp.bin")["Body"].read() == body
        outsider = h.boto3(h.token(roles={a: "write"}, name="outsider"))
        with pytest.raises(ClientError) as err:
            outsider.copy_object(Bucket=a, Key="main/x.bin", CopySource={"Bucket": b, "Key": "main/src.bin"})
        assert err.value.response["Error"]["Code"] == "AccessDenied"


def test_revoked_token_stops_receiving_watch_events(hub: Hub):
    a = make_repo(hub, "iso-w")
    tok = make_token(hub, "watcher", {a: "read"})
    plane = HttpPlane(hub.url, tok["token"])
    got: list[dict] = []
    ended: list[BaseException] = []

    def follow() -> None:
        try:
            for event in plane.watch(read_timeout=60):
                got.append(event)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            ended.append(exc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    with hub.client() as admin:
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert admin.post(f"{API}/repos/{a}/branches", json={"name": "before", "source": "main"}).status_code == 201
        deadline = time.monotonic() + 10
        while not any(e.get("name") == "before" for e in got) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(e.get("name") == "before" for e in got)
        assert admin.delete(f"{API}/tokens/{tok['id']}").status_code == 204
        revoked_at = time.monotonic()
        thread.join(15)
        assert not thread.is_alive(), "the stream of a revoked token stayed open"
        assert time.monotonic() - revoked_at < 10
        assert ended and isinstance(ended[0], Unauthorized), ended
        assert admin.post(f"{API}/repos/{a}/branches", json={"name": "after", "source": "main"}).status_code == 201
    assert not any(e.get("name") == "after" for e in got)
    plane.close()


def test_watch_error_line_is_json(hub: Hub):
    """The last line a revoked token gets names the error (for clients other than ours)."""
    a = make_repo(hub, "iso-wl")
    tok = make_token(hub, "watcher2", {a: "read"})
    with httpx.Client(base_url=hub.url, headers={"Authorization": f"Bearer {tok['token']}"}, timeout=30) as c:
        with c.stream("GET", f"{API}/watch", params={"repo": a}) as r:
            lines = r.iter_lines()
            assert json.loads(next(lines))["type"] == "heartbeat"
            with hub.client() as admin:
                admin.delete(f"{API}/tokens/{tok['id']}")
            last = [json.loads(line) for line in lines if line.strip()][-1]
    assert last["type"] == "error" and last["code"] == "unauthorized" and "revoked" in last["message"]


def test_spoke_serves_a_scoped_token_only_chunks_of_its_repository(hub: Hub, tmp_path):
    a, b, tok, secret, ids = tenants(hub)
    with hub.client() as admin:
        admin.put(f"{API}/repos/{a}/branches/main/objects", params={"path": "own.bin"}, content=os.urandom(200_000))
    own = _chunk_ids(hub.client(), a, "own.bin")
    with start_spoke(hub.url, tmp_path / "spoke", "256MiB", token=hub.token) as spoke:
        # The spoke's cache holds B's secret (an admin read it through the spoke).
        with spoke.client() as admin:
            assert admin.get(f"{API}/repos/{b}/refs/main/objects", params={"path": "secret.bin"}).content == secret
        with spoke.client(token=tok["token"]) as c:
            expect_error(c.post(f"{API}/chunks/frames", json={"ids": [ids[0].hex()]}), 403, "?repo=")
            expect_error(c.post(f"{API}/chunks/frames", json={"ids": [ids[0].hex()]}, params={"repo": a}), 404, a)
            asked = [cid.hex() for cid in ids]
            for durability in ("hub", "local"):
                missing = c.post(
                    f"{API}/chunks/missing", json={"ids": asked}, params={"repo": a},
                    headers={"X-Fabric-Durability": durability},
                )
                assert missing.json()["missing"] == asked, durability
            # A local-durability write built on B's cached chunks is refused at the spoke.
            wire = Entry("file", len(secret), 0o644, 1, md5="0" * 32, chunks=tuple((i, 1) for i in ids)).to_wire()
            body = msgpack.packb({"changes": {"stolen.bin": wire}}, use_bin_type=True)
            expect_error(
                c.post(f"{API}/repos/{a}/branches/main/entries", content=body, headers={"X-Fabric-Durability": "local"}),
                400, "not stored for repository",
            )
            # A's own chunks come through.
            r = c.post(f"{API}/chunks/frames", json={"ids": [i.hex() for i in own]}, params={"repo": a})
            assert r.status_code == 200 and len(r.content) > 0


# -- the engine: ownership is recorded, backfilled, and collected -----------------------------
def test_catalog_from_before_ownership_is_backfilled(tmp_path):
    data = str(tmp_path / "hub")
    engine = Engine.open(data)
    engine.create_repo("old")
    entry = engine.put_object("old", "main", "f.bin", _stream(os.urandom(200_000)))
    engine.commit("old", "main", "f")
    engine.put_object("old", "main", "staged.bin", _stream(os.urandom(100_000)))
    ids = [cid for cid, _ in engine.stat_chunks("old", "main", "f.bin").chunks]
    staged = [cid for cid, _ in engine.stat_chunks("old", "main", "staged.bin").chunks]
    assert entry.size == 200_000
    # Make it look like a catalog written before chunks belonged to repositories.
    with engine.catalog.db.tx() as cur:
        cur.execute("DELETE FROM repo_chunks")
        cur.execute("DELETE FROM settings WHERE key = ?", (OWNERSHIP_SETTING,))
    with pytest.raises(NotFound):
        list(engine.frames(ids, repo="old"))
    engine.close()
    engine = Engine.open(data)
    assert engine.catalog.owned_chunks("old", ids + staged) == set(ids + staged)
    assert len(list(engine.frames(ids, repo="old"))) == len(ids)
    engine.close()


def test_gc_forgets_ownership_of_collected_chunks(sqlite_engine: Engine):
    e = sqlite_engine
    e.create_repo("gcr")
    e.put_object("gcr", "main", "tmp.bin", _stream(os.urandom(100_000)))
    ids = [cid for cid, _ in e.stat_chunks("gcr", "main", "tmp.bin").chunks]
    e.discard("gcr", "main")
    assert e.catalog.owned_chunks("gcr", ids) == set(ids)
    e.gc(grace=0)
    assert e.catalog.owned_chunks("gcr", ids) == set()
    with pytest.raises(BadRequest, match="not stored for repository"):
        e.stage("gcr", "main", {"x": Entry("file", 1, 0o644, 1, md5="0" * 32, chunks=((ids[0], 1),))})


def test_deleting_a_repository_forgets_its_chunks(sqlite_engine: Engine):
    e = sqlite_engine
    e.create_repo("del")
    e.put_object("del", "main", "f.bin", _stream(os.urandom(100_000)))
    ids = [cid for cid, _ in e.stat_chunks("del", "main", "f.bin").chunks]
    e.delete_repo("del")
    e.create_repo("del")  # the same name, a new repository: it holds nothing
    assert e.missing_chunks(ids, repo="del") == ids
    assert e.missing_chunks(ids) == []  # still stored (until gc)


def _stream(data: bytes) -> io.BytesIO:
    return io.BytesIO(data)


def test_watch_once_reads_past_a_page_of_other_repositories_events(hub: Hub):
    """``once`` returns every event after ``since`` the token may see, however many events of
    other repositories come first (the catalog is read a page at a time)."""
    from hub.watch import PAGE

    a, b = make_repo(hub, "iso-pa"), make_repo(hub, "iso-pb")
    tok = make_token(hub, "pager", {a: "read"})
    with hub.client() as admin:
        start = json.loads(admin.get(f"{API}/watch", params={"once": "true"}).text.splitlines()[0])["seq"]
        for i in range(PAGE + 5):
            assert admin.post(f"{API}/repos/{b}/branches", json={"name": f"b{i}", "source": "main"}).status_code == 201
        assert admin.post(f"{API}/repos/{a}/branches", json={"name": "late", "source": "main"}).status_code == 201
    with httpx.Client(base_url=hub.url, headers={"Authorization": f"Bearer {tok['token']}"}, timeout=30) as c:
        lines = [json.loads(x) for x in c.get(f"{API}/watch", params={"once": "true", "since": start}).text.splitlines()]
    events = [e for e in lines if e.get("type") != "heartbeat"]
    assert [(e["repo"], e["name"]) for e in events] == [(a, "late")], events[:3]
