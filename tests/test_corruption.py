"""Corruption on disk is detected (fsck exits 6 naming the damage) and never served as data."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

from fabric.client.transfer import import_directory
from fabric.engine.engine import Engine
from fabric.errors import Corruption, FabricError
from fabric.format.frames import HEADER_LEN, RAW, ZSTD
from tests.helpers.fstree import write_file

MiB = 1 << 20


CONTENTS_SEED = 42


def _contents() -> dict[str, bytes]:
    rng = random.Random(CONTENTS_SEED)
    return {
        "random.bin": rng.randbytes(8 * MiB),  # > 64 chunks: has its own chunk list object
        "text.csv": b"".join(b"%d,sample,%d,label-%d\n" % (i, i * 7, i % 10) for i in range(60_000)),
        "small.txt": b"a small file\n",
        "dir/other.bin": rng.randbytes(300_000),
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    """A hub data directory with one commit holding a raw-stored, a compressed and a small file."""
    root = tmp_path_factory.mktemp("corruption-template")
    for path, data in _contents().items():
        write_file(str(root / "src" / path), data)
    e = Engine.open(str(root / "hub"))
    try:
        e.create_repo("demo")
        import_directory(e, str(root / "src"), "demo", "main", "v1")
    finally:
        e.close()
    return str(root / "hub")


@pytest.fixture
def seeded(cli, template):
    """A private copy of the template hub for one test to damage."""
    shutil.copytree(template, cli.data)  # a copied data directory uses its own store
    return cli, _contents()


def locate(data: str, path: str, index: int | None = None):
    """(chunk id, location, all chunk ids of the file) of one chunk of ``path`` (default: the middle one)."""
    e = Engine.open(data)
    try:
        chunks = e.stat_chunks("demo", "main", path).chunks
        cid = chunks[len(chunks) // 2 if index is None else index][0]
        return cid, e.catalog.locate(cid), [c for c, _ in chunks]
    finally:
        e.close()


def pack_path(data: str, pack_id: str) -> str:
    return os.path.join(data, "store", "packs", pack_id[:8], pack_id)


def flip(path: str, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def frame_kind(path: str, offset: int) -> int:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(1)[0]


def cat_bytes(cli, path: str) -> tuple[int, bytes, str]:
    """``fabric cat``: exit code, standard output as bytes, standard error."""
    p = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "--data", cli.data, "cat", "demo@main", path],
        capture_output=True,
        env=cli.env,
        timeout=120,
        check=False,
    )
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def assert_reads_refused(cli, data: str, path: str, good: bytes, tmp_path) -> None:
    # fabric cat: exit 6 with a message, and whatever reached stdout before the error is a correct prefix.
    rc, out, err = cat_bytes(cli, path)
    assert rc == 6, (rc, err)
    assert "corrupt" in err.lower() or "missing" in err.lower(), err
    assert "Traceback" not in err
    assert good.startswith(out), "cat wrote bytes that are not the file's"
    # The engine raises Corruption on a fresh instance (no cache to hide behind).
    e = Engine.open(data)
    try:
        with pytest.raises(Corruption):
            e.read("demo", "main", path)
    finally:
        e.close()
    # Export fails and leaves no file with wrong content, and no partial file, behind.
    out_dir = tmp_path / f"export-{os.urandom(4).hex()}"
    r = cli("export", "demo@main", str(out_dir), check=False)
    assert r.returncode == 6, (r.returncode, r.stderr)
    target = out_dir / path
    if target.exists():
        assert target.read_bytes() == good
    leftovers = [os.path.join(d, f) for d, _, fs in os.walk(out_dir) for f in fs if f.startswith(".")]
    assert leftovers == [], f"export left partial files behind: {leftovers}"


# Where in a frame the flipped byte lands: header fields and payload.
POSITIONS = {
    "kind": lambda loc: 0,
    "raw_len": lambda loc: 1,
    "checksum": lambda loc: 5,
    "payload_middle": lambda loc: HEADER_LEN + (loc.length - HEADER_LEN) // 2,
    "payload_last": lambda loc: loc.length - 1,
}


@pytest.mark.parametrize(
    "path,where",
    [("random.bin", w) for w in POSITIONS] + [("text.csv", "payload_middle"), ("text.csv", "kind")],
)
def test_flipped_byte_in_pack_is_reported_and_never_served(seeded, tmp_path, path: str, where: str) -> None:
    cli, contents = seeded
    cid, loc, _ = locate(cli.data, path)
    pack = pack_path(cli.data, loc.pack)
    assert frame_kind(pack, loc.offset) == (RAW if path == "random.bin" else ZSTD)
    flip(pack, loc.offset + POSITIONS[where](loc))

    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6, r.stdout + r.stderr
    report = r.json()
    assert not report["ok"]
    assert len(report["problems"]) == 1, report["problems"]
    assert cid.hex() in report["problems"][0]
    if where == "kind":
        human = cli("fsck", check=False)
        assert human.returncode == 6 and cid.hex() in human.stdout

    assert_reads_refused(cli, cli.data, path, contents[path], tmp_path)
    # The rest of the store is unaffected: other files (same pack) read back exactly.
    e = Engine.open(cli.data)
    try:
        for other, data in contents.items():
            if other != path:
                assert e.read("demo", "main", other) == data
        # A range that avoids the bad chunk still reads; one that covers it does not.
        sizes = e.stat_chunks("demo", "main", path).chunks
        start = sum(n for c, n in sizes[: [c for c, _ in sizes].index(cid)])
        assert e.read("demo", "main", path, 0, start) == contents[path][:start]
        with pytest.raises(Corruption):
            e.read("demo", "main", path, start, 10)
    finally:
        e.close()


def test_chunk_id_mismatch_is_caught_even_with_a_valid_checksum(seeded, tmp_path) -> None:
    """A frame rewritten with a correct checksum but other bytes (a bad copy) still fails its id."""
    import xxhash

    from fabric.format.frames import HEADER

    cli, contents = seeded
    cid, loc, _ = locate(cli.data, "random.bin")
    pack = pack_path(cli.data, loc.pack)
    with open(pack, "r+b") as f:
        f.seek(loc.offset)
        frame = bytearray(f.read(loc.length))
        kind, raw_len, _ = HEADER.unpack_from(frame)
        assert kind == RAW
        frame[HEADER_LEN + 10] ^= 0xFF
        HEADER.pack_into(frame, 0, kind, raw_len, xxhash.xxh3_64_intdigest(bytes(frame[HEADER_LEN:])))
        f.seek(loc.offset)
        f.write(frame)
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6
    assert [p for p in r.json()["problems"] if cid.hex() in p]
    assert_reads_refused(cli, cli.data, "random.bin", contents["random.bin"], tmp_path)


def test_deleted_pack_is_reported(seeded, tmp_path) -> None:
    cli, contents = seeded
    _, loc, _ = locate(cli.data, "random.bin")
    e = Engine.open(cli.data)
    try:
        in_pack = {cid for cid, *_ in e.catalog.chunks_of_pack(loc.pack)}
    finally:
        e.close()
    os.unlink(pack_path(cli.data, loc.pack))
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6
    problems = r.json()["problems"]
    assert len(problems) == len(in_pack)
    assert {cid.hex() for cid in in_pack} == {p.split()[1].rstrip(":") for p in problems}
    assert all("missing" in p for p in problems)
    assert_reads_refused(cli, cli.data, "random.bin", contents["random.bin"], tmp_path)
    # gc does not make things worse: afterwards fsck reports exactly the same problems.
    cli("gc", "--grace", "0", check=False)
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6 and r.json()["problems"] == problems


def test_truncated_pack_is_reported(seeded, tmp_path) -> None:
    cli, contents = seeded
    cid, loc, _ = locate(cli.data, "random.bin")
    path = pack_path(cli.data, loc.pack)
    with open(path, "r+b") as f:
        f.truncate(loc.offset + loc.length // 2)
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6
    problems = r.json()["problems"]
    assert any(cid.hex() in p for p in problems)
    assert_reads_refused(cli, cli.data, "random.bin", contents["random.bin"], tmp_path)


def _objects(data: str) -> dict[str, str]:
    root = os.path.join(data, "store", "objects")
    return {name: os.path.join(d, name) for d, _, names in os.walk(root) for name in names if not name.startswith(".")}


def _meta_ids(data: str) -> dict[str, str]:
    """Object ids of the head commit, its tree, one range and random.bin's chunk list."""
    e = Engine.open(data)
    try:
        head = e.head("demo", "main")
        tree = e.get_commit("demo", head).tree
        ranges = e.trees.ranges(tree)
        entry = e.stat("demo", "main", "random.bin")
        assert entry.chunklist, "random.bin should have its chunk list in its own object"
        return {"commit": head, "metarange": tree, "range": ranges[0].id, "chunklist": entry.chunklist}
    finally:
        e.close()


@pytest.mark.parametrize("kind", ["commit", "metarange", "range", "chunklist"])
@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_damaged_metadata_object_is_reported(seeded, kind: str, damage: str) -> None:
    cli, _ = seeded
    oid = _meta_ids(cli.data)[kind]
    path = _objects(cli.data)[oid]
    if damage == "flip":
        flip(path, os.path.getsize(path) // 2, 0x10)
    else:
        os.unlink(path)
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6, r.stdout + r.stderr
    problems = r.json()["problems"]
    assert problems and any(oid in p or oid[:12] in p for p in problems), problems
    # Reading through the damaged object fails cleanly (no traceback, non-zero exit).
    rc, out, err = cat_bytes(cli, "random.bin")
    assert rc != 0 and "Traceback" not in err and out == b"", err
    if damage == "flip":
        assert rc == 6
    e = Engine.open(cli.data)
    try:
        with pytest.raises(FabricError):
            e.read("demo", "main", "random.bin")
    finally:
        e.close()


def test_flipped_kind_byte_of_metadata_object(seeded) -> None:
    cli, _ = seeded
    oid = _meta_ids(cli.data)["range"]
    flip(_objects(cli.data)[oid], 0, 0x02)  # 'R' -> 'P': the kind byte is covered by the id
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 6
    assert any(oid in p for p in r.json()["problems"])


def test_a_damaged_small_file_over_rest_answers_an_error_not_a_cut_off_download(seeded) -> None:
    """A download up to 1 MiB is read whole before its status is sent: a damaged chunk makes it
    a 500 naming the chunk, where a streamed body would have sent 200 and then cut off."""
    import httpx

    from tests.hubserver import start_hub

    cli, contents = seeded
    cid, loc, _ = locate(cli.data, "dir/other.bin")
    flip(pack_path(cli.data, loc.pack), loc.offset + HEADER_LEN + 10)
    with start_hub(cli.data, no_auth=True) as hub:
        url = hub.url + "/api/v1/repos/demo/refs/main/objects"
        r = httpx.get(url, params={"path": "dir/other.bin"}, timeout=60)
        assert r.status_code == 500, (r.status_code, len(r.content))
        assert r.json()["error"]["code"] == "corruption" and cid.hex() in r.json()["error"]["message"]
        good = httpx.get(url, params={"path": "small.txt"}, timeout=60)
        assert good.status_code == 200 and good.content == contents["small.txt"]
