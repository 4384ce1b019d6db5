"""A file written in order through a ``--rw`` mount is chunked and sent while it is written (issue 16.1).

What could go wrong, each checked against the server and a local reference: the
chunks do not reach the server before fsync (no streaming at all); streamed
chunk boundaries differ from a whole-file ingest (dedup with other copies lost);
an overwrite, truncate, hole or append after a sync leaves stale streamed
chunks in the stored file.
"""

from __future__ import annotations

import hashlib
import os
import random
import time

from fabric.format import chunking
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = needs_fuse

MIB = 1 << 20


def new_repo(hub) -> str:
    repo = unique_name("stream")
    hub.plane().create_repo(repo)
    return repo


def whole_file_chunks(data: bytes) -> list[tuple[bytes, int]]:
    return [(chunking.chunk_id(p), len(p)) for p in chunking.cut(data)]


def held_bytes(plane, repo: str, data: bytes) -> int:
    """Bytes of ``data``'s chunks the server holds for ``repo``."""
    chunks = whole_file_chunks(data)
    missing = set(plane.missing_chunks([cid for cid, _ in chunks], repo=repo))
    return sum(n for cid, n in chunks if cid not in missing)


def mount_stats(mnt: str) -> dict:
    from fuse.mount import read_stats

    time.sleep(1.2)  # the mount writes its stats every second
    return read_stats(mnt)["streamed_writes"]


def test_a_file_written_in_order_reaches_the_server_before_its_fsync(hub, tmp_path) -> None:
    repo = new_repo(hub)
    plane = hub.plane()
    data = random.Random(1).randbytes(40 * MIB)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        fd = os.open(f"{mnt}/shard.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for i in range(0, len(data), MIB):
                os.write(fd, data[i : i + MIB])
            deadline = time.monotonic() + 30
            while held_bytes(plane, repo, data) < 32 * MIB and time.monotonic() < deadline:
                time.sleep(0.2)
            # Still open, never fsynced: all but the last step is at the server already.
            assert held_bytes(plane, repo, data) >= 32 * MIB
            os.fsync(fd)
        finally:
            os.close(fd)
        stats = mount_stats(mnt)
        assert stats["streamed_bytes"] >= 32 * MIB and stats["finished"] >= 1 and stats["broken"] == 0, stats
    plane.commit(repo, "main", "shard")
    assert plane.read(repo, "main", "shard.bin") == data
    entry = plane.stat_chunks(repo, "main", "shard.bin")
    assert entry.md5 == hashlib.md5(data).hexdigest()
    assert list(entry.chunks) == whole_file_chunks(data)  # the same chunks as any other copy of these bytes


def _write(path: str, steps: list) -> None:
    """Apply ``steps`` to ``path`` (open for writing, created empty), with pauses that let the
    mount's background worker claim what was written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for step in steps:
            kind, *args = step
            if kind == "write":
                offset, data = args
                os.pwrite(fd, data, offset)
            elif kind == "append":
                (data,) = args
                os.pwrite(fd, data, os.fstat(fd).st_size)
            elif kind == "truncate":
                os.ftruncate(fd, args[0])
            elif kind == "fsync":
                os.fsync(fd)
            elif kind == "pause":
                time.sleep(args[0])
    finally:
        os.close(fd)


def test_changes_a_stream_cannot_follow_store_the_right_bytes(hub, tmp_path) -> None:
    rnd = random.Random(2)

    def blob(mib: float) -> bytes:
        return rnd.randbytes(int(mib * MIB))

    cases = {
        # overwrite bytes the worker has already chunked and sent
        "overwrite.bin": [("append", blob(12)), ("pause", 1.0), ("write", MIB, b"X" * 5000)],
        # shrink below the chunked bytes, then grow again
        "shrink.bin": [("append", blob(10)), ("pause", 1.0), ("truncate", 3 * MIB), ("append", blob(2))],
        # a write past the end leaves a hole
        "hole.bin": [("append", blob(6)), ("write", 7 * MIB, blob(5))],
        # fsync in the middle, then go on appending (the stream carries on past a sync)
        "append-after-sync.bin": [("append", blob(9)), ("fsync",), ("append", blob(7)), ("fsync",), ("append", blob(0.3))],
        # grow with ftruncate (zeros), then write on
        "extend.bin": [("append", blob(5)), ("truncate", 8 * MIB), ("append", blob(1))],
        # tiny file, never reaches a step
        "small.bin": [("append", b"hello"), ("fsync",), ("append", b" world")],
        "empty.bin": [],
    }
    repo = new_repo(hub)
    local = tmp_path / "local"
    local.mkdir()
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        for name, steps in cases.items():
            _write(f"{mnt}/{name}", steps)
            _write(str(local / name), steps)
        # reopening with O_TRUNC starts a fresh stream over a file that had one
        again = [("append", blob(9)), ("pause", 0.5), ("append", blob(1))]
        _write(f"{mnt}/overwrite.bin", again)
        _write(str(local / "overwrite.bin"), again)
        stats = mount_stats(mnt)
        assert stats["broken"] >= 3 and stats["finished"] >= 3, stats
    plane = hub.plane()
    plane.commit(repo, "main", "cases")
    for name in cases:
        want = (local / name).read_bytes()
        assert plane.read(repo, "main", name) == want, name
        entry = plane.stat_chunks(repo, "main", name)
        assert entry.size == len(want), name


def test_no_stream_writes_chunks_at_sync_only(hub, tmp_path) -> None:
    repo = new_repo(hub)
    plane = hub.plane()
    data = random.Random(3).randbytes(16 * MIB)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw", "--no-stream-writes") as mnt:
        with open(f"{mnt}/shard.bin", "wb") as f:
            f.write(data)
            f.flush()
            time.sleep(1.0)
            assert held_bytes(plane, repo, data) == 0  # nothing leaves before the sync
        assert mount_stats(mnt) is None
    plane.commit(repo, "main", "shard")
    assert plane.read(repo, "main", "shard.bin") == data
