"""The chunk exchange of a real hub: missing ids, pack upload (verified, all or nothing),
frame download, staging that refers to absent chunks, and what an import sends over the wire."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys

import httpx
import msgpack
import pytest

from fabric.client.records import parse_records
from fabric.format import chunking, frames, packs
from fabric.format.model import Entry
from tests.hubserver import Hub, hub_env, unique_name
from tests.test_rest_api import expect_error

API = "/api/v1"


# -- helpers --------------------------------------------------------------------
def raw_chunks(n: int, size: int = 30_000, compressible: bool = False) -> list[bytes]:
    if compressible:
        return [(f"chunk {i} {os.urandom(4).hex()} " * (size // 20))[:size].encode() for i in range(n)]
    return [os.urandom(size) for _ in range(n)]


def build_pack(chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    b = packs.PackBuilder()
    ids = []
    for raw in chunks:
        cid = chunking.chunk_id(raw)
        b.add(cid, frames.encode(raw))
        ids.append(cid)
    return b.finish(), ids


def missing(c: httpx.Client, ids: list[bytes]) -> list[bytes]:
    r = c.post(f"{API}/chunks/missing", json={"ids": [i.hex() for i in ids]})
    assert r.status_code == 200, r.text
    return [bytes.fromhex(x) for x in r.json()["missing"]]


@pytest.fixture(scope="module")
def c(hub: Hub):
    with hub.client() as client:
        yield client


# -- /chunks/missing --------------------------------------------------------------
def test_missing_reports_exactly_the_absent_ids(c: httpx.Client):
    present = raw_chunks(5)
    data, present_ids = build_pack(present)
    assert c.post(f"{API}/chunks/packs", content=data).json() == {"chunks": 5, "new": 5}
    absent_ids = [chunking.chunk_id(os.urandom(100)) for _ in range(4)]
    mixed = [absent_ids[0], present_ids[0], absent_ids[1], present_ids[1], absent_ids[0], absent_ids[2], present_ids[4], absent_ids[3]]
    # Exactly the absent ones, in request order, without repeats.
    assert missing(c, mixed) == [absent_ids[0], absent_ids[1], absent_ids[2], absent_ids[3]]
    assert missing(c, present_ids) == []
    assert missing(c, []) == []
    # Upper-case hex is hex too.
    r = c.post(f"{API}/chunks/missing", json={"ids": [present_ids[0].hex().upper(), absent_ids[0].hex().upper()]})
    assert r.json() == {"missing": [absent_ids[0].hex()]}


def test_missing_rejects_bad_ids(c: httpx.Client):
    expect_error(c.post(f"{API}/chunks/missing", json={"ids": ["zz" * 32]}), 400, "hex")
    expect_error(c.post(f"{API}/chunks/missing", json={"ids": ["ab" * 16]}), 400, "32 bytes")
    expect_error(c.post(f"{API}/chunks/missing", json={"ids": "ab"}), 400, "ids")
    expect_error(c.post(f"{API}/chunks/missing", json={}), 400, "ids")
    expect_error(c.post(f"{API}/chunks/missing", json={"ids": ["00" * 32] * 100_001}), 413, "limit")


# -- /chunks/packs ---------------------------------------------------------------------
def test_valid_pack_is_stored_and_indexed(c: httpx.Client):
    chunks = raw_chunks(4) + raw_chunks(4, compressible=True)
    data, ids = build_pack(chunks)
    assert missing(c, ids) == ids
    r = c.post(f"{API}/chunks/packs", content=data, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.json() == {"chunks": 8, "new": 8}
    assert missing(c, ids) == []
    # Sending it again stores nothing new.
    assert c.post(f"{API}/chunks/packs", content=data).json() == {"chunks": 8, "new": 0}
    # A pack with some known and some new chunks indexes only the new ones.
    more = raw_chunks(2)
    data2, ids2 = build_pack(chunks[:3] + more)
    assert c.post(f"{API}/chunks/packs", content=data2).json() == {"chunks": 5, "new": 2}
    assert missing(c, ids + ids2) == []
    # An empty pack is fine and stores nothing.
    assert c.post(f"{API}/chunks/packs", content=packs.PackBuilder().finish()).json() == {"chunks": 0, "new": 0}


def _tampered_packs() -> list[tuple[str, bytes, list[bytes]]]:
    """(what is wrong, pack bytes, every id the pack's index claims)."""
    out = []
    good = raw_chunks(3) + raw_chunks(2, compressible=True)

    # A frame filed under another chunk's id (the frame itself is intact).
    b = packs.PackBuilder()
    ids = []
    for i, raw in enumerate(good):
        cid = chunking.chunk_id(raw if i != 2 else b"something else")
        b.add(cid, frames.encode(raw))
        ids.append(cid)
    out.append(("id mismatch", b.finish(), ids))

    # A payload byte flipped after framing: the xxh3 checksum no longer matches.
    good2 = raw_chunks(4)
    data, ids = build_pack(good2)
    view = bytearray(data)
    index = packs.parse_index(bytes(view))
    victim = index[3]  # the last frame; the first three are valid
    view[victim.offset + frames.HEADER_LEN + 100] ^= 0xFF
    out.append(("checksum mismatch", bytes(view), ids))

    # A compressed frame whose checksum was recomputed over a corrupted payload: only the id catches it.
    good3 = raw_chunks(3, compressible=True)
    b = packs.PackBuilder()
    ids = []
    for i, raw in enumerate(good3):
        cid = chunking.chunk_id(raw)
        frame = frames.encode(raw)
        if i == 0:
            kind, raw_len, _ = frames.HEADER.unpack_from(frame)
            assert kind == frames.ZSTD
            altered = frames.encode(raw[:-1] + bytes([raw[-1] ^ 1]))
            payload = altered[frames.HEADER_LEN :]
            import xxhash

            frame = frames.HEADER.pack(kind, raw_len, xxhash.xxh3_64_intdigest(payload)) + payload
        b.add(cid, frame)
        ids.append(cid)
    out.append(("valid checksum, wrong content", b.finish(), ids))

    # The index says a different raw length than the frame holds.
    good4 = raw_chunks(2)
    data, ids = build_pack(good4)
    view = bytearray(data)
    _, index_off, _ = packs.FOOTER.unpack_from(view, len(view) - packs.FOOTER.size)
    row = index_off + packs.INDEX_ROW.size  # second row
    cid, off, length, raw_len = packs.INDEX_ROW.unpack_from(view, row)
    packs.INDEX_ROW.pack_into(view, row, cid, off, length, raw_len + 1)
    out.append(("raw length mismatch", bytes(view), ids))
    return out


@pytest.mark.parametrize("case", range(4), ids=["id-mismatch", "checksum", "content", "raw-length"])
def test_tampered_pack_is_refused_and_indexes_nothing(hub: Hub, c: httpx.Client, case: int):
    what, data, ids = _tampered_packs()[case]
    assert missing(c, ids) == ids
    stats_before = c.get(f"{API}/stats").json()
    r = c.post(f"{API}/chunks/packs", content=data)
    assert 400 <= r.status_code < 600, (what, r.status_code)
    err = r.json()["error"]
    assert "corrupt" in err["message"] or "mismatch" in err["message"] or "says" in err["message"], (what, err)
    # The message names the bad chunk.
    assert any(cid.hex() in err["message"] for cid in ids), (what, err)
    assert r.status_code == 400, (what, r.status_code, err)  # the client's bad bytes, not a server fault
    # Nothing of the pack was indexed, not even its valid frames.
    assert missing(c, ids) == ids, what
    stats_after = c.get(f"{API}/stats").json()
    assert stats_after["stored_bytes"] == stats_before["stored_bytes"]


def test_malformed_packs_are_refused(c: httpx.Client):
    data, ids = build_pack(raw_chunks(2))
    for what, body in [
        ("empty", b""),
        ("garbage", b"not a pack at all" * 10),
        ("truncated", data[:-5]),
        ("extra bytes", data + b"\x00"),
        ("bad magic", data[:-4] + b"XXXX"),
    ]:
        err = expect_error(c.post(f"{API}/chunks/packs", content=body), 400)
        assert "pack" in err["message"], (what, err)
    assert missing(c, ids) == ids


# -- /chunks/frames ---------------------------------------------------------------------
def test_frames_stream_back_and_decode(c: httpx.Client):
    chunks = raw_chunks(6) + raw_chunks(6, compressible=True)
    data, ids = build_pack(chunks)
    c.post(f"{API}/chunks/packs", content=data).raise_for_status()
    want = [ids[3], ids[0], ids[11], ids[7], ids[0]]
    with c.stream("POST", f"{API}/chunks/frames", json={"ids": [i.hex() for i in want]}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/octet-stream"
        body = r.read()
    records = list(parse_records([body]))  # (a stream that ends inside a record raises)
    got = {cid: frame for cid, frame in records}
    assert set(got) == set(want)
    for cid, frame in records:
        raw = frames.decode(frame, cid)  # checksum and id verified
        assert raw == chunks[ids.index(cid)]
    # Compressible chunks travel compressed.
    assert len(got[ids[11]]) < len(chunks[11]) // 2
    # The client library parses the same stream.
    from fabric.client.http import HttpPlane

    plane = HttpPlane(str(c.base_url).rstrip("/"), c.headers["authorization"][7:])
    assert {cid: frames.decode(f, cid) for cid, f in plane.frames(ids)} == dict(zip(ids, chunks))
    assert c.post(f"{API}/chunks/frames", json={"ids": []}).content == b""


def test_frames_of_unknown_chunk_is_404(c: httpx.Client):
    data, ids = build_pack(raw_chunks(2))
    c.post(f"{API}/chunks/packs", content=data).raise_for_status()
    absent = chunking.chunk_id(b"never uploaded " + os.urandom(8))
    expect_error(c.post(f"{API}/chunks/frames", json={"ids": [absent.hex()]}), 404, absent.hex())
    expect_error(c.post(f"{API}/chunks/frames", json={"ids": [ids[0].hex(), absent.hex()]}), 404, absent.hex())
    expect_error(c.post(f"{API}/chunks/frames", json={"ids": ["xyz"]}), 400, "hex")


# -- staging needs the chunks -----------------------------------------------------------
def test_stage_entries_referencing_absent_chunks_is_400(c: httpx.Client):
    repo = unique_name("stage")
    c.post(f"{API}/repos", json={"name": repo}).raise_for_status()
    data, ids = build_pack(raw_chunks(2))
    c.post(f"{API}/chunks/packs", content=data, params={"repo": repo}).raise_for_status()
    absent_raw = os.urandom(5000)
    absent = chunking.chunk_id(absent_raw)

    def entry(chunk_ids: list[bytes], sizes: list[int]) -> dict:
        return Entry("file", sum(sizes), 0o644, 1, md5="0" * 32, chunks=tuple(zip(chunk_ids, sizes))).to_wire()

    ok = entry(ids, [30_000, 30_000])
    bad = entry([ids[0], absent], [30_000, 5000])
    body = msgpack.packb({"changes": {"good": ok, "bad": bad}}, use_bin_type=True)
    err = expect_error(c.post(f"{API}/repos/{repo}/branches/main/entries", content=body, headers={"Content-Type": "application/msgpack"}), 400, absent.hex())
    assert "upload" in err["message"]
    # Nothing was staged, not even the good entry.
    assert c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"] == []
    body = msgpack.packb({"changes": {"bad": bad}, "message": "m"}, use_bin_type=True)
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/commit-changes", content=body), 400, absent.hex())
    # Uploaded for no repository (or another one), the chunk is still not this repository's.
    c.post(f"{API}/chunks/packs", content=build_pack([absent_raw])[0]).raise_for_status()
    body = msgpack.packb({"changes": {"bad": bad}}, use_bin_type=True)
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/entries", content=body, headers={"Content-Type": "application/msgpack"}), 400, absent.hex())
    # With its chunk uploaded for the repository, the same entry is accepted.
    c.post(f"{API}/chunks/packs", content=build_pack([absent_raw])[0], params={"repo": repo}).raise_for_status()
    body = msgpack.packb({"changes": {"good": ok, "bad": bad}}, use_bin_type=True)
    assert c.post(f"{API}/repos/{repo}/branches/main/entries", content=body).status_code == 204
    assert len(c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"]) == 2


# -- an import sends only what the hub lacks ----------------------------------------------
MiB = 1024 * 1024


def _write(path, data: bytes, mtime: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _make_v1(root: str, rng: random.Random) -> None:
    for i in range(60):
        _write(os.path.join(root, "bin", f"{i:02d}.dat"), rng.randbytes(MiB), 1_600_000_000 + i)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    for i in range(20):
        lines = [" ".join(rng.choice(words) for _ in range(12)) + f" {rng.random()}" for _ in range(3000)]
        _write(os.path.join(root, "text", f"{i:02d}.txt"), "\n".join(lines).encode(), 1_600_000_000 + i)


def _make_v2(root: str, rng: random.Random) -> dict:
    """Edit 10 files in the middle, add 5, rename 3, duplicate 3; untouched files keep their mtimes."""
    changed = {"edited": [], "new": [], "renamed": [], "duplicated": []}
    for i in list(range(0, 16, 2)) :  # 8 binary files
        p = os.path.join(root, "bin", f"{i:02d}.dat")
        with open(p, "r+b") as f:
            f.seek(MiB // 2)
            f.write(rng.randbytes(3000))
        os.utime(p, (1_700_000_000, 1_700_000_000))
        changed["edited"].append(p)
    for i in (3, 7):  # 2 text files: a line replaced in the middle
        p = os.path.join(root, "text", f"{i:02d}.txt")
        with open(p, "rb") as f:
            data = f.read()
        mid = len(data) // 2
        _write(p, data[:mid] + b"\nan edited line in the middle\n" + data[mid:], 1_700_000_000)
        changed["edited"].append(p)
    for i in range(5):
        p = os.path.join(root, "new", f"n{i}.dat")
        _write(p, rng.randbytes(MiB))
        changed["new"].append(p)
    for i in (40, 41, 42):
        src = os.path.join(root, "bin", f"{i:02d}.dat")
        dst = os.path.join(root, "moved", f"{i:02d}.dat")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.rename(src, dst)
        changed["renamed"].append(dst)
    for i in (50, 51):
        src = os.path.join(root, "bin", f"{i:02d}.dat")
        dst = os.path.join(root, "dups", f"{i:02d}.dat")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        changed["duplicated"].append(dst)
    src = os.path.join(root, "text", "10.txt")
    shutil.copyfile(src, os.path.join(root, "dups", "10.txt"))
    changed["duplicated"].append(os.path.join(root, "dups", "10.txt"))
    return changed


def _fabric(hub: Hub, *args: str) -> str:
    env = hub_env({"FABRIC_SERVER": hub.url, "FABRIC_TOKEN": hub.token})
    proc = subprocess.run([sys.executable, "-m", "fabric.cli.main", "-q", *args], capture_output=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def _same_trees(a: str, b: str) -> None:
    def files(root):
        out = {}
        for d, _, fs in os.walk(root):
            for f in fs:
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = (hashlib.md5(fh.read()).hexdigest(), os.stat(p).st_mtime_ns)
        return out

    assert files(a) == files(b)


def test_import_v2_sends_only_the_chunks_the_hub_lacks(fresh_hub: Hub, tmp_path):
    hub = fresh_hub
    rng = random.Random(20240607)
    src = str(tmp_path / "dataset")
    _make_v1(src, rng)
    repo = unique_name("ds")
    _fabric(hub, "repo", "create", repo)
    _fabric(hub, "import", src, f"{repo}@main", "-m", "v1")
    changed = _make_v2(src, rng)
    assert sum(len(v) for v in changed.values()) == 10 + 5 + 3 + 3

    # What the hub lacks for v2, computed here: chunk every file, ask the hub, frame the missing chunks.
    raw_by_id: dict[bytes, bytes] = {}
    for d, _, fs in os.walk(src):
        for f in fs:
            for piece in chunking.file_chunks(os.path.join(d, f)):
                raw_by_id.setdefault(chunking.chunk_id(piece), bytes(piece))
    with hub.client() as c:
        lacking = set(missing(c, list(raw_by_id)))
    assert lacking, "v2 must have new chunks"
    expected = sum(len(frames.encode(raw_by_id[cid])) for cid in lacking)
    # Sanity: the new files alone are 5 MiB of random bytes, the edits add some chunks each.
    assert 5 * MiB < expected < 9 * MiB

    before = hub.metric("fabric_http_bytes_total", direction="in")
    out = _fabric(hub, "--json", "import", src, f"{repo}@main", "-m", "v2")
    sent = hub.metric("fabric_http_bytes_total", direction="in") - before
    import json

    result = json.loads(out)
    assert (result["added"], result["changed"], result["removed"]) == (5 + 3 + 3, 10, 3)
    assert result["new_chunks"] == len(lacking)
    assert result["stored_bytes"] == expected
    ratio = sent / expected
    print(f"\nimport v2: {sent} bytes sent to the hub for {expected} bytes of lacked frames ({len(lacking)} chunks): ratio {ratio:.4f}")
    assert ratio <= 1.1, f"sent {sent} bytes for {expected} bytes of lacked frames (ratio {ratio:.3f})"
    assert sent >= expected  # the frames themselves did cross the wire

    with hub.client() as c:
        assert missing(c, list(raw_by_id)) == []
        assert c.post(f"{API}/admin/fsck").json()["ok"] is True
    # The hub now holds v2 exactly.
    dest = str(tmp_path / "export")
    _fabric(hub, "export", f"{repo}@main", dest)
    _same_trees(src, dest)
    # Importing the same tree again sends almost nothing.
    before = hub.metric("fabric_http_bytes_total", direction="in")
    assert json.loads(_fabric(hub, "--json", "import", src, f"{repo}@main", "-m", "v2 again"))["commit_id"] is None
    assert hub.metric("fabric_http_bytes_total", direction="in") - before < 10_000
