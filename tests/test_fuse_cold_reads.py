"""Cold reads of a mount (issue 21): chunks read back from ``--cache-dir`` ahead of the
reader, many at once, around the page cache; readers in parallel; damaged chunks.

The chunk-level tests run :class:`~fuse.reader.Fetcher` and :class:`~fuse.reader.FileReader`
over an engine; the last ones read through real mounts of a real hub.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fabric.cache.lru import BytesLRU
from fabric.cache.packs import HEADER, INDEX_RECORD, PACKS
from fabric.client.transfer import import_directory
from fabric.errors import Corruption
from fabric.format.frames import HEADER_LEN
from fabric.format.model import HOLE_ID
from fabric.plane.retry import Health, RetryingPlane
from fabric.plane.wrapper import PlaneWrapper
from fabric.util.direct_io import DirectReader
from fuse.reader import Fetcher, FileReader, chunk_disk_cache
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import unique_name

MIB = 1024 * 1024


def make_files(root: str, sizes: dict[str, int], seed: int = 21) -> dict[str, bytes]:
    rnd = random.Random(seed)
    out = {}
    for name, size in sizes.items():
        out[name] = rnd.randbytes(size)
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(out[name])
    return out


class CountingPlane(PlaneWrapper):
    """Counts the chunks asked of ``frames``; ``damage`` spoils every frame it sends."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.asked = 0
        self.damage = False

    def frames(self, ids, repo=None):
        for cid, frame in self.inner.frames(ids, repo=repo):
            self.asked += 1
            if self.damage:
                frame = frame[:HEADER_LEN] + bytes([frame[HEADER_LEN] ^ 0xFF]) + frame[HEADER_LEN + 1 :]
            yield cid, frame


@pytest.fixture
def stored(sqlite_engine, tmp_path):
    """Files committed to an engine: (plane, repo, commit id, {name: bytes})."""
    src = tmp_path / "src"
    data = make_files(str(src), {"big.bin": 9 * MIB + 12345, "other.bin": 5 * MIB + 7, "small.bin": 70_000})
    sqlite_engine.create_repo("cold")
    commit = import_directory(sqlite_engine, str(src), "cold", "main", "files").commit.id
    return CountingPlane(sqlite_engine), "cold", commit, data


def fetcher_for(plane, cache_dir: str, memory: int = 64 * MIB) -> Fetcher:
    return Fetcher(RetryingPlane(plane, Health(5)), BytesLRU(memory), chunk_disk_cache(cache_dir, 1 << 30), repo="cold")


def reader(fetcher: Fetcher, plane, commit: str, name: str, readahead: int = 8 * MIB) -> FileReader:
    return FileReader(fetcher, plane.stat_chunks("cold", commit, name).chunks, readahead)


def read_all(r: FileReader, step: int = MIB) -> bytes:
    out, off = [], 0
    while piece := r.read(off, step):
        out.append(piece)
        off += len(piece)
    return b"".join(out)


def fill_cache(plane, commit: str, cache_dir: str) -> None:
    f = fetcher_for(plane, cache_dir)
    for name in ("big.bin", "other.bin", "small.bin"):
        read_all(reader(f, plane, commit, name))
    f.close()
    f.disk.close()


def test_a_cached_file_reads_whole_from_the_cache_directory(stored, tmp_path):
    plane, _, commit, data = stored
    cache = str(tmp_path / "cache")
    fill_cache(plane, commit, cache)
    asked = plane.asked
    f = fetcher_for(plane, cache)
    try:
        assert read_all(reader(f, plane, commit, "big.bin")) == data["big.bin"]
        assert plane.asked == asked  # nothing from the server: every chunk came from the disk
        assert f.disk_chunks == len(plane.stat_chunks("cold", commit, "big.bin").chunks)
    finally:
        f.close()


def test_reads_across_chunk_boundaries_and_past_the_end(stored, tmp_path):
    plane, _, commit, data = stored
    cache = str(tmp_path / "cache")
    fill_cache(plane, commit, cache)
    f = fetcher_for(plane, cache, memory=1)  # nothing stays in memory: every read goes to the disk
    try:
        r = reader(f, plane, commit, "big.bin")
        want = data["big.bin"]
        offsets = [0]
        for _, n in plane.stat_chunks("cold", commit, "big.bin").chunks[:20]:
            offsets.append(offsets[-1] + n)
        for end in offsets[1:]:
            assert r.read(end - 3, 7) == want[end - 3 : end + 4]  # across a chunk boundary
        assert r.read(len(want) - 10, MIB) == want[-10:]  # a read past the end stops at it
        assert r.read(len(want), MIB) == b""
        rnd = random.Random(3)
        for _ in range(50):
            off, n = rnd.randrange(len(want)), rnd.randrange(1, 3 * MIB)
            assert r.read(off, n) == want[off : off + n]
    finally:
        f.close()


def test_parallel_readers_of_different_files(stored, tmp_path):
    plane, _, commit, data = stored
    cache = str(tmp_path / "cache")
    fill_cache(plane, commit, cache)
    f = fetcher_for(plane, cache, memory=4 * MIB)
    try:
        names = ["big.bin", "other.bin", "small.bin"] * 3
        with ThreadPoolExecutor(len(names)) as pool:
            got = list(pool.map(lambda n: read_all(reader(f, plane, commit, n), step=128 * 1024), names))
        assert got == [data[n] for n in names]
    finally:
        f.close()


def damage_first_chunk(cache) -> bytes:
    """Flip a byte of the first chunk of the first pack of a cache directory; its id."""
    pack = sorted((cache / PACKS).glob("*.pack"))[0]
    raw = bytearray(pack.read_bytes())
    _, _, cid, _ = HEADER.unpack(raw[: HEADER.size])
    raw[HEADER.size + 100] ^= 1
    pack.write_bytes(raw)
    return cid


def test_a_damaged_cached_chunk_is_fetched_again(stored, tmp_path):
    plane, _, commit, data = stored
    cache = tmp_path / "cache"
    fill_cache(plane, commit, str(cache))
    victim = damage_first_chunk(cache)
    asked = plane.asked
    f = fetcher_for(plane, str(cache))
    try:
        assert read_all(reader(f, plane, commit, "big.bin")) + read_all(reader(f, plane, commit, "other.bin")) == (
            data["big.bin"] + data["other.bin"]
        )
        assert plane.asked == asked + 1  # only the damaged chunk
        assert f.disk.stats()["cache_corruptions"] == 1
        assert f.disk.read(victim) is not None  # cached again, intact
    finally:
        f.close()


def test_a_chunk_damaged_in_the_cache_and_by_the_server_is_an_error(stored, tmp_path):
    plane, _, commit, _ = stored
    cache = tmp_path / "cache"
    fill_cache(plane, commit, str(cache))
    for pack in (cache / PACKS).glob("*.pack"):  # every chunk, at its first byte
        raw = bytearray(pack.read_bytes())
        for _, off, _ in INDEX_RECORD.iter_unpack(pack.with_suffix(".idx").read_bytes()):
            raw[off] ^= 1
        pack.write_bytes(raw)
    plane.damage = True
    f = fetcher_for(plane, str(cache))
    try:
        r = reader(f, plane, commit, "big.bin")
        with pytest.raises(Corruption):  # the mount answers EIO (fuse.errors.fs_errno)
            r.read(5 * MIB, MIB)
        plane.damage = False
        assert r.read(5 * MIB, 10) == stored[3]["big.bin"][5 * MIB : 5 * MIB + 10]  # and recovers
    finally:
        f.close()


def test_direct_reader_reads_ranges_and_falls_back_where_refused(tmp_path):
    data = os.urandom(300_001)
    (tmp_path / "pack").write_bytes(data)
    r = DirectReader(128 * 1024)
    for offset, length in [(0, 4096), (1, 100), (4095, 2), (70_000, 128 * 1024), (299_990, 100)]:
        assert r.read(str(tmp_path / "pack"), offset, length) == data[offset : offset + length]
    with pytest.raises(FileNotFoundError):
        r.read(str(tmp_path / "gone"), 0, 10)
    with pytest.raises(ValueError):
        r.read(str(tmp_path / "pack"), 0, 128 * 1024 + 1)  # longer than its buffer
    if os.path.isdir("/dev/shm"):  # tmpfs: no O_DIRECT, read the ordinary way
        shm = f"/dev/shm/fabric-direct-{os.getpid()}-{threading.get_ident()}"
        with open(shm, "wb") as fh:
            fh.write(data)
        try:
            assert DirectReader(8192).read(shm, 5, 8000) == data[5:8005]
        finally:
            os.unlink(shm)


# -- through real mounts -----------------------------------------------------------------


@pytest.fixture(scope="module")
def committed_large(hub, tmp_path_factory):
    src = tmp_path_factory.mktemp("cold") / "tree"
    data = make_files(str(src), {f"d/f{i}.bin": 6 * MIB + i * 4099 for i in range(4)})
    repo = unique_name("cold")
    plane = hub.plane()
    plane.create_repo(repo)
    commit = import_directory(plane, str(src), repo, "main", "large files").commit.id
    return hub, repo, commit, data


def digest_of(path: str, step: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while piece := f.read(step):
            h.update(piece)
    return h.hexdigest()


@needs_fuse
def test_a_remount_of_a_cached_commit_reads_right_in_parallel(committed_large, tmp_path):
    hub, repo, commit, data = committed_large
    opts = ("--cache-dir", str(tmp_path / "cache"), "--cache-size", "256M")
    want = {name: hashlib.sha256(b).hexdigest() for name, b in data.items()}
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "m1", *opts) as mnt:
        assert {n: digest_of(os.path.join(mnt, n), MIB) for n in data} == want
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "m2", *opts) as mnt:
        names = sorted(data)
        with ThreadPoolExecutor(len(names)) as pool:
            got = dict(zip(names, pool.map(lambda n: digest_of(os.path.join(mnt, n), 1 << 20), names), strict=True))
        assert got == want
        # Reads at odd offsets, across chunk boundaries and up to the end.
        name = names[-1]
        fd = os.open(os.path.join(mnt, name), os.O_RDONLY)
        try:
            rnd = random.Random(5)
            size = len(data[name])
            for _ in range(40):
                off, n = rnd.randrange(size + 10), rnd.randrange(1, 2 * MIB)
                assert os.pread(fd, n, off) == data[name][off : off + n]
        finally:
            os.close(fd)


def test_holes_read_as_zeros_between_cached_chunks(stored, tmp_path):
    plane, _, commit, data = stored
    cache = str(tmp_path / "cache")
    fill_cache(plane, commit, cache)
    chunks = plane.stat_chunks("cold", commit, "other.bin").chunks
    (a, na), (b, nb) = chunks[0], chunks[1]
    hole = 3 * MIB + 5
    f = fetcher_for(plane, cache)
    try:
        r = FileReader(f, [(a, na), (HOLE_ID, hole), (b, nb)], 8 * MIB)
        want = data["other.bin"][:na] + bytes(hole) + data["other.bin"][na : na + nb]
        assert read_all(r) == want
        assert r.read(na - 2, 4) == want[na - 2 : na + 2]
        assert r.read(na + hole - 2, 2 * MIB) == want[na + hole - 2 :]
    finally:
        f.close()
