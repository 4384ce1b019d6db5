"""Sparse files (issue 13, point 6): a hole costs neither time nor bytes.

A file extended far through a ``--rw`` mount (a write far past its end, or a
``truncate``) is stored with its holes as ``(HOLE_ID, n)`` runs of its chunk list:
nothing of a hole is hashed, uploaded or fetched. Reads (the mount, REST ranges,
export) give zeros for it; export writes it as a hole; fsck and gc know it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time

from fabric.format.chunking import chunk_id
from fabric.format.model import HOLE_ID
from tests.fuse_helpers import fabric, mounted, needs_fuse
from tests.hubserver import unique_name

GIB = 1 << 30
FAR = 2 * GIB
#: A close that hashed or uploaded the 2 GiB hole took seconds; one that skips it, milliseconds.
FAST = 1.0
#: What a sparse file may add to the hub's packs (its data bytes are few).
FEW_BYTES = 1 << 20


class _Taken:
    """A chunk sink that keeps what it takes (the destination lacks every chunk)."""

    def __init__(self) -> None:
        self.chunks: dict[bytes, bytes] = {}
        self.new_chunks = self.new_bytes = self.stored_bytes = 0

    def filter_new(self, ids):
        return {cid for cid in ids if cid not in self.chunks}

    def add_many(self, pairs):
        for cid, raw in pairs:
            assert chunk_id(raw) == cid
            self.chunks[cid] = bytes(raw)

    def close(self):
        pass


def test_runs_keep_holes_out_of_the_chunks():
    from fabric.format.ingest import HOLE_MIN, ingest_runs

    data = os.urandom(300_000)
    sink = _Taken()
    runs = [(io.BytesIO(data), len(data)), (None, 5 * GIB), (io.BytesIO(b"tail"), 4), (None, 7)]
    chunks, etag = ingest_runs(runs, sink)
    assert sum(n for _, n in chunks) == len(data) + 5 * GIB + 4 + 7
    holes = [n for cid, n in chunks if cid == HOLE_ID]
    assert holes == [5 * GIB, 7]
    assert HOLE_ID not in sink.chunks  # never stored
    assert b"".join(sink.chunks[cid] for cid, _ in chunks if cid != HOLE_ID) == data + b"tail"
    assert etag.endswith(f"-{len(runs)}")  # not an MD5 of the content: its holes were not hashed
    # Without holes the ETag stays the MD5 of the content.
    chunks, etag = ingest_runs([(io.BytesIO(data), len(data))], _Taken())
    assert HOLE_ID not in {cid for cid, _ in chunks}
    assert etag == hashlib.md5(data).hexdigest()
    assert HOLE_MIN <= 1 << 20


def _stored(hub) -> int:
    return hub.plane().stats()["stored_bytes"]


@needs_fuse
def test_a_far_write_stores_a_hole(hub, tmp_path):
    repo = unique_name("sparse")
    plane = hub.plane()
    plane.create_repo(repo)
    before = _stored(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        path = os.path.join(mnt, "far.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(fd, b"head", 0)
        os.pwrite(fd, b"x", FAR)
        t0 = time.monotonic()
        os.close(fd)
        took = time.monotonic() - t0
        assert took < FAST, f"closing a file with a 2 GiB hole took {took:.2f}s"
        # truncate to 2 GiB: a hole too
        open(os.path.join(mnt, "cut.bin"), "wb").close()
        t0 = time.monotonic()
        os.truncate(os.path.join(mnt, "cut.bin"), FAR)
        took = time.monotonic() - t0
        assert took < FAST, f"truncating to 2 GiB took {took:.2f}s"
        assert os.stat(path).st_size == FAR + 1
        with open(path, "rb") as f:
            assert f.read(4) == b"head"
            f.seek(GIB)
            assert f.read(1 << 20) == bytes(1 << 20)
            f.seek(FAR - 3)
            assert f.read() == b"\0\0\0x"
        with open(os.path.join(mnt, "cut.bin"), "rb") as f:
            f.seek(FAR - 5)
            assert f.read() == bytes(5)
    assert _stored(hub) - before < FEW_BYTES
    entry = plane.stat_chunks(repo, "main", "far.bin")
    holes = [n for cid, n in entry.chunks if cid == HOLE_ID]
    assert len(holes) == 1 and holes[0] > FAR - FEW_BYTES  # (data regions are whole blocks of the local file)
    assert sum(n for _, n in entry.chunks) == FAR + 1

    # A remount opens it for writing again: the hole is not copied into the local file.
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt2", "--rw") as mnt:
        path = os.path.join(mnt, "far.bin")
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b"mid", GIB)
        t0 = time.monotonic()
        os.close(fd)
        took = time.monotonic() - t0
        assert took < FAST, f"rewriting a byte of a sparse file took {took:.2f}s"
        with open(path, "rb") as f:
            f.seek(GIB - 2)
            assert f.read(6) == b"\0\0mid\0"
            f.seek(FAR)
            assert f.read() == b"x"
    assert _stored(hub) - before < FEW_BYTES

    fabric("--server", hub.url, "commit", f"{repo}@main", "-m", "sparse", token=hub.token)
    # REST ranges across the hole
    with hub.client() as c:
        url = f"/api/v1/repos/{repo}/refs/main/objects"
        r = c.get(url, params={"path": "far.bin"}, headers={"Range": f"bytes={GIB - 2}-{GIB + 4}"})
        assert r.status_code == 206 and r.content == b"\0\0mid\0\0"
        r = c.get(url, params={"path": "far.bin"}, headers={"Range": f"bytes={FAR - 2}-"})
        assert r.status_code == 206 and r.content == b"\0\0x"
        r = c.get(url, params={"path": "far.bin"}, headers={"Range": "bytes=0-5"})
        assert r.content == b"head\0\0"

    report = plane.fsck()
    assert report["ok"], report["problems"]
    plane.gc(grace=0)
    report = plane.fsck()
    assert report["ok"], report["problems"]
    assert plane.read(repo, "main", "far.bin", GIB, 3) == b"mid"
    assert plane.read(repo, "main", "far.bin", FAR, 1) == b"x"


def test_a_pack_session_never_takes_a_hole():
    from fabric.format.ingest import HOLE_MIN, PackSession, ingest_runs

    session = PackSession(lambda ids: list(ids), lambda b: None, 1 << 20)
    chunks, _ = ingest_runs([(None, 10 * HOLE_MIN)], session)
    assert chunks == [(HOLE_ID, 10 * HOLE_MIN)]
    assert session.new_chunks == 0


def test_export_writes_holes_as_holes(hub, tmp_path):
    from fabric.format.ingest import file_entry, ingest_runs

    repo = unique_name("sparse")
    plane = hub.plane()
    plane.create_repo(repo)
    data = os.urandom(100 * 70_000)  # long.bin has more chunks than INLINE_CHUNKS: its list is an object of its own
    files = {
        "far.bin": [(io.BytesIO(b"head"), 4), (None, FAR), (io.BytesIO(b"x"), 1)],
        "long.bin": [(io.BytesIO(data), len(data)), (None, GIB), (io.BytesIO(data), len(data))],
        "hole.bin": [(None, FAR)],
    }
    sink = plane.chunk_sink(repo)
    entries = {name: file_entry(*ingest_runs(runs, sink)) for name, runs in files.items()}
    sink.close()
    plane.stage(repo, "main", entries)
    out = json.loads(fabric("--server", hub.url, "--json", "commit", f"{repo}@main", "-m", "sparse", token=hub.token).stdout)
    dest = tmp_path / "export"
    t0 = time.monotonic()
    fabric("--server", hub.url, "export", f"{repo}@{out['id']}", str(dest), token=hub.token)
    took = time.monotonic() - t0
    sizes = {"far.bin": FAR + 5, "long.bin": GIB + 2 * len(data), "hole.bin": FAR}
    for name, size in sizes.items():
        st = os.stat(dest / name)
        assert st.st_size == size
        assert st.st_blocks * 512 < FEW_BYTES + (2 * len(data) if name == "long.bin" else 0), name
    with open(dest / "far.bin", "rb") as f:
        assert f.read(5) == b"head\0"
        f.seek(FAR + 4)
        assert f.read() == b"x"
    with open(dest / "long.bin", "rb") as f:
        assert f.read(len(data)) == data
        f.seek(len(data) + GIB - 1)
        assert f.read() == b"\0" + data
    assert took < 30, f"the export took {took:.1f}s"  # (streaming its 5 GiB of zeros takes minutes)


def test_a_sparse_file_through_a_spoke_with_local_durability(hub, tmp_path):
    """The spoke pins, queues and pushes only the data chunks; the hub reads the holes as zeros."""
    from fabric.client.http import UPLOAD_PACK_SIZE
    from fabric.format.ingest import PackSession, file_entry, ingest_runs
    from tests.spokeserver import start_spoke, wait_for

    repo = unique_name("sparse")
    plane = hub.plane()
    plane.create_repo(repo)
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as spoke:
        sp = spoke.plane()
        sink = PackSession(
            lambda ids: sp.missing_chunks(ids, "local", repo=repo),
            lambda builder: sp.receive_pack(builder.finish(), "local", repo=repo),
            UPLOAD_PACK_SIZE,
        )
        entry = file_entry(*ingest_runs([(io.BytesIO(b"head"), 4), (None, FAR), (io.BytesIO(b"x"), 1)], sink))
        sink.close()
        sp.stage(repo, "main", {"far.bin": entry}, "local")
        assert sp.read(repo, "main", "far.bin", FAR - 1, 10) == b"\0\0\0\0\0x"
        wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=30, interval=0.1)
    assert plane.read(repo, "main", "far.bin", 0, 6) == b"head\0\0"
    assert plane.read(repo, "main", "far.bin", FAR + 4, 1) == b"x"
