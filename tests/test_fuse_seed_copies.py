"""``fabric mount --rw --seed-copies DIR`` (issue 16, warm restore): the files a writable mount
stages are left as plain copies in DIR (fabric/cache/seeds.py), and a ``--passthrough`` mount of
the commit with ``--cache-dir DIR`` has the kernel read them, asking the mount for no byte.

The seeder's bookkeeping is tested on its own first; then real mounts of a real hub.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time

import pytest

from fabric.cache.files import INCOMING, FileCopies, checked_at, copy_key
from fabric.cache.seeds import CopySeeder
from fabric.engine.metastore import CHUNKLIST, MetaStore
from fabric.format.model import INLINE_CHUNKS, Entry, chunk_list_object
from fabric.store import open_store
from fuse import copies
from tests.fuse_helpers import _state, fabric, mount_stats, mounted, needs_fuse
from tests.test_corruption import flip
from tests.test_fuse_passthrough import kernel_stats, needs_passthrough

MIB = 1024 * 1024


def _file(directory, name: str, data: bytes) -> int:
    """``data`` in a new file, open read-only: what a mount hands the seeder."""
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return os.open(path, os.O_RDONLY)


def _settle(seeder: CopySeeder) -> None:
    seeder.close()


def test_a_seed_is_a_copy_a_running_cache_finds_and_a_starting_one_loads(tmp_path):
    root = str(tmp_path / "cache")
    running = FileCopies(root, budget=64 * MIB, min_size=1)  # a passthrough mount already up
    seeder = CopySeeder(root, budget=64 * MIB, min_size=1)
    data = os.urandom(3 * MIB + 5)
    key = copy_key(len(data), [b"k" * 32])
    fd = _file(tmp_path, "written", data)
    assert seeder.seed(fd, key, len(data))
    os.close(fd)
    os.unlink(tmp_path / "written")  # the writer drops its file at once: the seed is a link of its own
    _settle(seeder)
    assert seeder.snapshot() == {"seeded": 1, "linked": 1, "failed": 0, "evicted": 0}
    assert os.listdir(os.path.join(root, "files", INCOMING)) == []

    got = running.open(key, len(data))  # a key it did not know: found on disk, checked
    assert got is not None and os.pread(got, len(data) + 1, 0) == data
    os.close(got)
    assert running.snapshot()["copies"] == 1
    later = FileCopies(root, budget=64 * MIB, min_size=1)  # a mount started after
    fd = later.open(key, len(data))
    assert fd is not None and os.pread(fd, 16, len(data) - 16) == data[-16:]
    os.close(fd)
    assert running.open(copy_key(len(data), [b"x" * 32]), len(data)) is None  # nothing there: nothing adopted


def test_a_seed_across_file_systems_is_a_copy_and_a_damaged_one_is_never_served(tmp_path):
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's directory")
    root = str(tmp_path / "cache")
    seeder = CopySeeder(root, budget=64 * MIB, min_size=1)
    data = os.urandom(2 * MIB)
    key = copy_key(len(data), [b"s" * 32])
    src = f"/dev/shm/fabric-seed-{os.getpid()}"
    fd = _file("/dev/shm", os.path.basename(src), data)
    try:
        assert seeder.seed(fd, key, len(data))
    finally:
        os.close(fd)
        os.unlink(src)
    _settle(seeder)
    assert seeder.snapshot()["seeded"] == 1 and seeder.snapshot()["linked"] == 0
    (placed,) = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(root, "files")) for n in names]
    flip(placed, MIB)  # a bit flipped at rest
    assert checked_at(placed, os.path.basename(placed).partition("-")[2]) is not None  # summed as it was placed
    cache = FileCopies(root, budget=64 * MIB, min_size=1, recheck_after=0)  # (no earlier check counts)
    assert cache.open(key, len(data)) is None and cache.snapshot()["corruptions"] == 1
    assert not os.path.exists(placed)


def test_seeds_stay_within_their_budget_and_what_a_killed_seeder_left_is_removed(tmp_path):
    root = str(tmp_path / "cache")
    incoming = os.path.join(root, "files", INCOMING)
    os.makedirs(incoming)
    orphan = os.path.join(incoming, f"999999999-{'a' * 64}")  # a seeder's process that is gone
    open(orphan, "wb").close()
    seeder = CopySeeder(root, budget=5 * MIB, min_size=MIB)
    assert not os.path.exists(orphan)
    keys = [copy_key(2 * MIB, [bytes([i]) * 32]) for i in range(3)]
    for i, key in enumerate(keys):
        fd = _file(tmp_path, f"f{i}", os.urandom(2 * MIB))
        assert seeder.seed(fd, key, 2 * MIB)
        os.close(fd)
        seeder._placer.submit(lambda: None).result()  # placed in turn: mtimes in this order
        time.sleep(0.02)
    fd = _file(tmp_path, "small", b"x" * 1000)
    assert not seeder.seed(fd, copy_key(1000, [b"t" * 32]), 1000)  # below min_size
    fd2 = _file(tmp_path, "again", os.urandom(2 * MIB))
    assert not seeder.seed(fd2, keys[2], 2 * MIB)  # that version is there already
    os.close(fd)
    os.close(fd2)
    _settle(seeder)
    assert seeder.snapshot()["evicted"] == 1
    cache = FileCopies(root, budget=64 * MIB, min_size=1)
    assert [cache.open(k, 2 * MIB) is not None for k in keys] == [False, True, True]  # the oldest went


def test_a_long_file_has_one_copy_name_whether_its_chunk_list_is_inline_or_an_object(tmp_path):
    chunks = tuple((bytes([i % 256, i // 256]) * 16, 1000) for i in range(INLINE_CHUNKS + 1))
    written = Entry(size=1000 * len(chunks), chunks=chunks)  # as the mount that wrote it knows it
    stored = MetaStore(open_store(str(tmp_path / "objects"))).put(CHUNKLIST, chunk_list_object(chunks))  # as a hub stores it
    listed = Entry(size=written.size, chunklist=stored)  # as a listing gives it
    assert copies.copy_key(written) == copies.copy_key(listed)
    short = Entry(size=3000, chunks=chunks[:3])
    assert copies.copy_key(short) == copy_key(3000, [c for c, _ in chunks[:3]])
    assert copies.copy_key(short) != copies.copy_key(Entry(size=3000, chunks=chunks[1:4]))


# -- real mounts ----------------------------------------------------------------------------
def _seed_stats(mp: str, until, part: str = "seeded_copies") -> dict:
    return mount_stats(mp, part, until)


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@needs_fuse
@needs_passthrough
def test_a_checkpoint_written_with_seed_copies_is_restored_by_the_kernel_from_them(hub, tmp_path):
    plane, repo = hub.plane(), hub.new_repo("seed")
    seeds = str(tmp_path / "copies")
    shards = {"ckpt/shard0.bin": os.urandom(2 * MIB + 17),  # under 64 chunks: its ids name it
              "ckpt/shard1.bin": os.urandom(9 * MIB + 3),  # over 64: its chunk list's id names it
              "ckpt/.metadata": b"m" * 5000}  # too small to copy
    opts = ("--rw", "--writeback", "--write-dir", str(tmp_path / "w"), "--seed-copies", seeds)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "rw", *opts) as mp:
        _write(os.path.join(mp, "ckpt/shard1.bin"), os.urandom(9 * MIB))  # an earlier save under the name
        _seed_stats(mp, lambda s: s["seeded"] == 1)
        for name, data in shards.items():
            _write(os.path.join(mp, name), data)
        stats = _seed_stats(mp, lambda s: s["seeded"] == 3)
        assert stats["linked"] == 3 and stats["failed"] == 0  # links of the mount's files: no bytes copied
        journal = os.path.join(tmp_path, "w", "writeback")
        assert os.listdir(journal) == []  # (each kept its name there until its seed was made: none is left)
    plane.commit(repo, "main", "step 1")
    plane.create_tag(repo, "step-1", "main")

    with mounted(hub.url, hub.token, f"{repo}@step-1", tmp_path / "restore", "--passthrough", "--cache-dir", seeds) as mp:
        at_start = kernel_stats(mp)["copies"]
        assert at_start["unchecked"] == 0 and at_start["scrubbed"] == 0  # summed as they were placed: not read again
        for name, data in shards.items():
            with open(os.path.join(mp, name), "rb") as f:
                assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
        got = kernel_stats(mp, lambda s: s["passthrough_opens"] + s["cached_opens"] >= 3)
        assert got["passthrough_opens"] == 2  # both shards, from the copies the writer left
        assert got["copies"]["copies"] == 3  # and the earlier save's, unused (another version), until evicted
        assert got["copies"]["made"] == 0  # nothing had to be filled from chunks


@needs_fuse
@needs_passthrough
def test_a_running_passthrough_mount_takes_up_copies_seeded_after_its_start(hub, tmp_path):
    plane, repo = hub.plane(), hub.new_repo("seedlive")
    seeds = str(tmp_path / "copies")
    data = os.urandom(4 * MIB + 1)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "rw", "--rw", "--write-dir", str(tmp_path / "w")) as mp:
        _write(os.path.join(mp, "a.bin"), data)  # written without seeding
    plane.commit(repo, "main", "a")
    commit = plane.resolve_commit(repo, "main")
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "ro", "--passthrough", "--cache-dir", seeds) as ro:
        fd = os.open(os.path.join(ro, "a.bin"), os.O_RDONLY)
        assert os.pread(fd, 100, 0) == data[:100]  # open from chunks, no copy (and none filled: not read whole)
        os.close(fd)
        # Another writer saves the same bytes: the same version, seeded into the running mount's directory.
        with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "rw2", "--rw", "--write-dir", str(tmp_path / "w2"),
                     "--seed-copies", seeds) as mp:
            _write(os.path.join(mp, "b.bin"), data)
            _seed_stats(mp, lambda s: s["seeded"] == 1)
        with open(os.path.join(ro, "a.bin"), "rb") as f:
            assert f.read() == data
        assert kernel_stats(ro, lambda s: s["passthrough_opens"] >= 1)["passthrough_opens"] == 1


@needs_fuse
def test_seed_copies_refuses_what_it_cannot_do(hub, tmp_path):
    repo = hub.new_repo("seedbad")
    mp = str(tmp_path / "m")
    os.makedirs(mp)
    ro = fabric("mount", hub.url, f"{repo}@main", mp, "--seed-copies", str(tmp_path / "c"), token=hub.token, check=False)
    assert ro.returncode != 0 and "--seed-copies needs --rw" in ro.stderr
    same = fabric("mount", hub.url, f"{repo}@main", mp, "--rw", "--cache-dir", str(tmp_path / "c"), "--seed-copies",
                  str(tmp_path / "c"), token=hub.token, check=False)
    assert same.returncode != 0 and "must not be this mount's own --cache-dir" in same.stderr
    open(tmp_path / "afile", "w").close()
    unusable = fabric("mount", hub.url, f"{repo}@main", mp, "--rw", "--seed-copies", str(tmp_path / "afile" / "c"),
                      token=hub.token, check=False)
    assert unusable.returncode != 0 and "cannot keep files in --seed-copies" in unusable.stderr
    bad_write_dir = fabric("mount", hub.url, f"{repo}@main", mp, "--rw", "--write-dir", str(tmp_path / "afile" / "w"),
                           token=hub.token, check=False)
    assert bad_write_dir.returncode != 0 and "cannot keep files in --write-dir" in bad_write_dir.stderr
    assert not os.path.ismount(mp) and not os.path.exists(tmp_path / "c")


@needs_fuse
@needs_passthrough
@pytest.mark.timeout(300)
def test_a_writer_killed_while_it_keeps_a_staged_files_name_restarts_clean(hub, tmp_path):
    # A file staged while still open keeps its journal name (for its seed) until it is closed;
    # a kill -9 then leaves that name, and the restarted mount removes it and stages nothing twice.
    from fuse.writeback import OPEN_IDLE_SECONDS

    plane, repo = hub.plane(), hub.new_repo("seedkill")
    write_dir, seeds = tmp_path / "w", str(tmp_path / "copies")
    journal = write_dir / "writeback"
    opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--seed-copies", seeds)
    data = os.urandom(3 * MIB)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "m1", *opts) as mp:
        f = open(os.path.join(mp, "open.bin"), "wb")
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        deadline = time.monotonic() + OPEN_IDLE_SECONDS * 6
        while sorted(os.listdir(journal)) != [n for n in os.listdir(journal) if n.endswith(".data")] or not os.listdir(journal):
            assert time.monotonic() < deadline, f"not staged while open: {os.listdir(journal)}"
            time.sleep(0.2)
        assert plane.read(repo, "main", "open.bin") == data
        os.kill(_state(mp)["pid"], 9)
        with contextlib.suppress(OSError):
            f.close()
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "m2", *opts) as mp:
        assert os.listdir(journal) == []
        with open(os.path.join(mp, "open.bin"), "rb") as f:
            assert f.read() == data
        assert _seed_stats(mp, lambda s: True, part="writeback")["staged"] == 0  # nothing came back to be staged again
    assert os.listdir(os.path.join(seeds, "files", INCOMING)) == []
