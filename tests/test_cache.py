"""The spoke's DiskCache on a real directory: budget, scan resistance, pins, restart, verification."""

from __future__ import annotations

import os
import random
import threading

import pytest

from fabric.cache.disk import CacheFull, DiskCache
from fabric.cache.ghosts import GHOSTS_MAX, GHOSTS_MIN, Ghosts, ghosts_for
from fabric.errors import Corruption
from fabric.format import frames
from fabric.format.chunking import chunk_id

KiB = 1024


def key(i: int | str) -> bytes:
    return chunk_id(str(i).encode())


def disk_bytes(root: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def blob(i: int, size: int) -> bytes:
    return random.Random(i).randbytes(size)


def read_through(cache: DiskCache, i: int, size: int) -> bool:
    """A reader's access: True on a hit; a miss fetches and caches the blob."""
    k = key(i)
    if cache.get(k) is not None:
        return True
    cache.put(k, blob(i, size))
    return False


def epoch_hits(cache: DiskCache, ids, size: int) -> float:
    ids = list(ids)
    return sum(read_through(cache, i, size) for i in ids) / len(ids)


# -- budget ------------------------------------------------------------------
def test_budget_never_exceeded_on_disk_or_in_accounting(tmp_path) -> None:
    budget = 512 * KiB
    cache = DiskCache(str(tmp_path / "c"), budget)
    rng = random.Random(1)
    for i in range(600):
        size = rng.randint(1, 40 * KiB)
        cache.put(key(i), bytes(size))
        assert cache.used <= budget
        if i % 10 == 0:
            assert disk_bytes(cache.root) <= budget
        if i % 3 == 0:
            cache.get(key(rng.randrange(i + 1)))
    s = cache.stats()
    assert s["cache_bytes"] == disk_bytes(cache.root)
    assert s["cache_evictions"] > 0
    assert s["cache_bytes"] > budget // 2, (
        "the cache should be used, not kept nearly empty"
    )


def test_advice_ahead_of_reads_changes_nothing_but_the_page_cache(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1024 * KiB)
    for i in range(8):
        cache.put(key(i), blob(i, 10 * KiB))
    os.unlink(cache.file(key(3)))  # gone behind the cache's back
    counts = (cache.hits, cache.misses, cache.corruptions)
    cache.will_need([key(i) for i in range(10)])  # cached, gone, and never cached
    assert (cache.hits, cache.misses, cache.corruptions) == counts
    assert [cache.get(key(i)) == blob(i, 10 * KiB) for i in range(8)] == [i != 3 for i in range(8)]


def test_advice_opens_only_the_files_of_cached_keys(tmp_path, monkeypatch) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1024 * KiB)
    for i in range(4):
        cache.put(key(i), blob(i, 10 * KiB))
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    cache.will_need([key(i) for i in range(100)])  # 4 cached, 96 never cached (a cold request)
    assert sorted(opened) == sorted(cache.file(key(i)) for i in range(4))


def test_blob_larger_than_the_window_is_not_kept(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 100 * KiB)  # window: 10 KiB
    assert cache.put(key("big"), bytes(20 * KiB)) is False
    assert key("big") not in cache
    assert disk_bytes(cache.root) == 0


class MeteredCache(DiskCache):
    """The real cache, with an exact meter of the bytes its files hold on disk.

    The meter's lock makes each file operation and its count one step, so the
    meter equals what the filesystem holds at every instant (a directory walk
    cannot: it mixes moments)."""

    def __init__(self, *args, **kwargs) -> None:
        self.meter_lock = threading.Lock()
        self.on_disk = self.max_on_disk = 0
        super().__init__(*args, **kwargs)

    def _write(self, key: bytes, data: bytes, durable: bool, reuse: str | None = None) -> None:
        with self.meter_lock:
            try:  # the file written over: the blob's own, or an evicted blob's renamed aside
                old = os.stat(reuse or self._path(key)).st_size
            except FileNotFoundError:
                old = 0
            super()._write(key, data, durable, reuse)
            self.on_disk += len(data) - old
            self.max_on_disk = max(self.max_on_disk, self.on_disk)

    def _remove_file(self, path: str) -> None:
        with self.meter_lock:
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = 0
            super()._remove_file(path)
            self.on_disk -= size


def test_budget_holds_under_concurrent_writers_and_readers(tmp_path) -> None:
    budget = 1024 * KiB
    cache = MeteredCache(str(tmp_path / "c"), budget)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            i = rng.randrange(300)
            if cache.get(key(i)) is None:
                cache.put(key(i), blob(i, 8 * KiB + (i % 7) * KiB))

    workers = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert cache.max_on_disk <= budget, (
        f"files held {cache.max_on_disk} bytes at one instant; budget {budget}"
    )
    assert cache.evictions > 100
    assert cache.used <= budget
    # No file is left that the index does not know (e.g. one evicted while it was being written).
    on_disk = {bytes.fromhex(n) for _, _, names in os.walk(cache.root) for n in names}
    assert on_disk == set(cache.keys())
    assert cache.used == disk_bytes(cache.root) == cache.on_disk



def test_a_store_into_a_full_cache_writes_over_an_evicted_blobs_file(tmp_path) -> None:
    """A new file per blob, beside an unlinked one, costs an inode allocation that churn makes
    slow on ext4 without a journal: a full cache writes the new blob over a victim's file."""
    budget = 16 * KiB
    cache = DiskCache(str(tmp_path / "c"), budget)
    for i in range(16):
        assert cache.put(key(i), blob(i, KiB))
    inodes = {os.stat(cache.file(k)).st_ino for k in cache.keys()}
    full = cache.stats()
    assert full["cache_evictions"] > 0  # full already
    # Smaller than every victim: no file is reused (one must never hold more than the new blob
    # was given room for).
    assert cache.put(key("small"), blob(100, 700))
    assert cache.stats()["cache_files_reused"] == full["cache_files_reused"]
    inodes.add(os.stat(cache.file(key("small"))).st_ino)
    # As large as a victim, or larger: the victim's file, cut to length, holds the new blob.
    for i in range(16, 24):
        assert cache.put(key(i), blob(i, KiB + i))
    assert cache.stats()["cache_files_reused"] == full["cache_files_reused"] + 8
    assert {os.stat(cache.file(k)).st_ino for k in cache.keys()} <= inodes  # no new file
    for i in range(16, 24):
        if key(i) in cache:
            assert cache.get(key(i)) == blob(i, KiB + i)
    names = [n for _, _, files in os.walk(cache.root) for n in files]
    assert not [n for n in names if n.startswith(".tmp")]
    assert cache.used == disk_bytes(cache.root) <= budget
    # Start-up finds the reused files as any others.
    cache.close()
    again = DiskCache(str(tmp_path / "c"), budget)
    assert sorted(again.keys()) == sorted(cache.keys())
    assert all(again.get(k) is not None for k in again.keys())

# -- scan resistance ---------------------------------------------------------
@pytest.mark.parametrize("cycle, warm_from", [(1.5, 1), (3, 2)])
def test_cyclic_scan_larger_than_the_cache_keeps_hitting(tmp_path, cycle: float, warm_from: int) -> None:
    """Plain LRU hits nothing on a cyclic scan over more than the cache; the window/main
    policy keeps most of it. Past twice the budget main's blobs would look dead by age
    alone: the reuse distance the cache remembers of an evicted blob (it comes back only
    after a whole cycle) keeps main's blobs, which the cycle reads sooner."""
    size = 4 * KiB
    budget = 100 * size
    n = int(cycle * 100)
    cache = DiskCache(str(tmp_path / "c"), budget)
    ratios = [epoch_hits(cache, range(n), size) for _ in range(5)]
    assert ratios[0] == 0
    for r in ratios[warm_from:]:
        assert r >= 0.8 * budget / (n * size), ratios
    assert cache.used <= budget


def test_a_blob_back_soon_after_eviction_replaces_a_main_blob_read_longer_ago(tmp_path) -> None:
    """Within twice the budget a main blob is not dead by age; one read further back than an
    evicted blob's last reuse distance makes way for it."""
    size = 4 * KiB
    budget = 100 * size
    cache = DiskCache(str(tmp_path / "c"), budget)
    old = range(2000, 2090)
    for _ in range(2):
        epoch_hits(cache, old, size)  # main: 90 blobs, proven by a second read
    small = range(3000, 3030)  # 30 blobs read over and over: each comes back after 30 reads
    ratios = [epoch_hits(cache, small, size) for _ in range(4)]
    # Pass 1 misses; in the window (10 blobs) none is read again. Pass 2 finds their reuse
    # distance (30 blobs) shorter than main's blobs' age (90 and more): they displace them.
    assert ratios[0] == 0 and ratios[-1] == 1.0, ratios
    assert sum(key(i) in cache for i in small) == len(small)


def test_the_evictions_remembered_are_bounded_and_the_oldest_forgotten_first() -> None:
    ghosts = Ghosts(limit=3)
    for i in range(5):
        ghosts.evicted(key(i), last_read=10 * i)
    ghosts.evicted(key(2), last_read=45)  # remembered anew: now the newest
    assert len(ghosts) == 3
    assert [ghosts.reuse_distance(key(i), 100) for i in range(5)] == [0, 0, 55, 70, 60]
    assert len(ghosts) == 0  # a blob back is forgotten
    assert ghosts_for(1 << 20) == GHOSTS_MIN
    assert ghosts_for(1 << 40) == GHOSTS_MAX
    assert ghosts_for(1 << 30) == 4 * (1 << 30) // (64 * KiB)


def test_new_working_set_replaces_a_dead_one(tmp_path) -> None:
    size = 4 * KiB
    budget = 100 * size
    cache = DiskCache(str(tmp_path / "c"), budget)
    for _ in range(3):
        epoch_hits(cache, range(150), size)  # old set A (scanned cyclically)
    new = range(1000, 1060)  # set B: 60% of the cache, read over and over
    ratios = [epoch_hits(cache, new, size) for _ in range(8)]
    assert ratios[-1] >= 0.9, ratios
    # B displaced A: few of A's blobs are left.
    left = sum(key(i) in cache for i in range(150))
    assert left <= 45, left


def test_hot_set_survives_a_one_off_scan(tmp_path) -> None:
    size = 4 * KiB
    budget = 100 * size
    cache = DiskCache(str(tmp_path / "c"), budget)
    hot = range(40)
    for _ in range(3):
        epoch_hits(cache, hot, size)
    epoch_hits(cache, range(5000, 5150), size)  # a scan 1.5x the cache, read once
    assert epoch_hits(cache, hot, size) >= 0.9


# -- pins ----------------------------------------------------------------------
def test_pinned_blobs_are_never_evicted(tmp_path) -> None:
    budget = 200 * KiB
    cache = DiskCache(str(tmp_path / "c"), budget)
    pinned = [key(f"p{i}") for i in range(10)]
    for i, k in enumerate(pinned):
        cache.put(k, blob(i, 10 * KiB), pin=True)
    for i in range(500):
        read_through(cache, i, 8 * KiB)
    for k in pinned:
        assert k in cache
        assert cache.get(k) is not None
    s = cache.stats()
    assert s["cache_pinned_bytes"] == 100 * KiB
    assert s["cache_bytes"] <= budget
    assert disk_bytes(cache.root) <= budget


def test_pinning_past_the_budget_is_refused(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 50 * KiB)
    for i in range(5):
        cache.put(key(f"p{i}"), bytes(10 * KiB), pin=True)
    with pytest.raises(CacheFull):
        cache.put(key("p5"), bytes(10 * KiB), pin=True)
    assert cache.used <= 50 * KiB


def test_unpinned_blobs_become_evictable(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 100 * KiB)
    ks = [key(f"p{i}") for i in range(8)]
    for k in ks:
        cache.put(k, bytes(10 * KiB), pin=True)
    for k in ks:
        cache.unpin(k)
    assert cache.stats()["cache_pinned_bytes"] == 0
    for i in range(200):
        read_through(cache, i, 8 * KiB)
    assert sum(k in cache for k in ks) < len(ks)
    assert cache.used <= 100 * KiB


def test_pin_an_already_cached_blob(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 100 * KiB)
    cache.put(key("a"), bytes(5 * KiB))
    assert cache.pin(key("a"))
    assert not cache.pin(key("absent"))
    for i in range(200):
        read_through(cache, i, 8 * KiB)
    assert key("a") in cache


# -- restart -------------------------------------------------------------------
def test_restart_reindexes_and_keeps_pins(tmp_path) -> None:
    root = str(tmp_path / "c")
    budget = 200 * KiB
    cache = DiskCache(root, budget)
    pinned = {key(f"p{i}") for i in range(5)}
    for i, k in enumerate(sorted(pinned)):
        cache.put(k, blob(i, 10 * KiB), pin=True)
    for i in range(12):
        cache.put(key(i), blob(i, 8 * KiB))
    # A torn write from a crash is cleaned up.
    sub = os.path.join(root, "ab")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, ".tmp-1-2-abab"), "wb") as f:
        f.write(b"x" * 1000)
    before = set(cache.keys())

    again = DiskCache(root, budget, pinned=pinned)
    assert set(again.keys()) == before
    assert again.stats()["cache_pinned_bytes"] == 50 * KiB
    assert not os.path.exists(os.path.join(sub, ".tmp-1-2-abab"))
    assert again.get(key(3)) == blob(3, 8 * KiB)
    for i in range(100, 400):  # pressure: the pins must stay
        read_through(again, i, 8 * KiB)
    for k in pinned:
        assert again.get(k) is not None
    assert again.used <= budget


def test_restart_with_a_smaller_budget_trims_but_keeps_pins(tmp_path) -> None:
    root = str(tmp_path / "c")
    cache = DiskCache(root, 400 * KiB)
    pinned = {key(f"p{i}") for i in range(3)}
    for k in pinned:
        cache.put(k, bytes(10 * KiB), pin=True)
    for i in range(30):
        cache.put(key(i), bytes(8 * KiB))
    small = DiskCache(root, 100 * KiB, pinned=pinned)
    assert small.used <= 100 * KiB
    assert disk_bytes(root) <= 100 * KiB
    assert all(k in small for k in pinned)


# -- verification --------------------------------------------------------------
def test_corrupt_frame_is_dropped_and_counted(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1 << 20, lambda _id, frame: frames.verify_checksum(frame))
    raw = b"some text that compresses " * 400
    cid = chunk_id(raw)
    frame = frames.encode(raw)
    cache.put(cid, frame)
    assert cache.get(cid) == frame
    path = cache._path(cid)
    with open(path, "r+b") as f:
        f.seek(len(frame) // 2)
        b = f.read(1)
        f.seek(len(frame) // 2)
        f.write(bytes([b[0] ^ 0x01]))
    assert cache.get(cid) is None
    assert cache.stats()["cache_corruptions"] == 1
    assert cid not in cache
    assert not os.path.exists(path)
    assert cache.used == 0
    # Cached again, it reads back fine.
    cache.put(cid, frame)
    assert frames.decode(cache.get(cid), cid) == raw


def test_truncated_file_is_dropped(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    cache.put(key("a"), bytes(5000))
    with open(cache._path(key("a")), "r+b") as f:
        f.truncate(100)
    assert cache.get(key("a")) is None
    assert key("a") not in cache
    assert cache.stats()["cache_corruptions"] == 1


def test_file_deleted_behind_the_cache_is_a_miss(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    cache.put(key("a"), bytes(5000))
    os.unlink(cache._path(key("a")))
    assert cache.get(key("a")) is None
    assert key("a") not in cache
    assert cache.used == 0


def test_a_longer_file_is_dropped_and_a_directory_removed_behind_the_cache_is_made_again(tmp_path) -> None:
    import shutil

    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    cache.put(key("a"), bytes(5000))
    with open(cache._path(key("a")), "ab") as f:
        f.write(b"more")
    assert cache.get(key("a")) is None and cache.stats()["cache_corruptions"] == 1
    # The cache remembers which fan-out directories it made; one removed since is made again.
    cache.put(key("b"), b"first")
    shutil.rmtree(os.path.dirname(cache._path(key("b"))))
    same_dir = next(key(f"b{i}") for i in range(10_000) if key(f"b{i}").hex()[:2] == key("b").hex()[:2])
    assert cache.put(same_dir, b"second") is True
    assert cache.get(same_dir) == b"second"


def test_a_blob_that_cannot_be_written_is_not_cached_but_a_pinned_one_raises(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    data = b"x" * 1000
    key = chunk_id(data)
    (tmp_path / "c" / key.hex()[:2]).write_bytes(b"a file where the blob's directory should be")
    assert cache.put(key, data) is False  # a cache miss later, not an error now
    assert key not in cache and cache.get(key) is None
    with pytest.raises(OSError):
        cache.put(key, data, pin=True)  # a pinned blob must be kept: the caller hears of it
    assert key not in cache
    stats = cache.stats()
    assert stats["cache_bytes"] == stats["cache_pinned_bytes"] == 0


def test_scrub_reads_without_counting_and_tells_damage_from_a_blob_gone(tmp_path) -> None:
    """fsck's read: a damaged copy is raised (dropped, counted); one evicted or never cached is
    None, not damage (a spoke's fsck listed evictions under live traffic as corrupt chunks)."""
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    cache.put(key("a"), bytes(5000))
    cache.put(key("b"), bytes(6000))
    hits, misses = cache.hits, cache.misses
    assert cache.scrub(key("a")) == bytes(5000)
    assert cache.scrub(key("never")) is None
    assert (cache.hits, cache.misses) == (hits, misses)
    with open(cache._path(key("b")), "r+b") as f:
        f.truncate(100)
    with pytest.raises(Corruption):
        cache.scrub(key("b"))
    assert key("b") not in cache and not os.path.exists(cache._path(key("b")))
    assert cache.stats()["cache_corruptions"] == 1
    cache.drop(key("a"))  # evicted between fsck's listing and its read
    assert cache.scrub(key("a")) is None
    assert cache.stats()["cache_corruptions"] == 1


def test_a_pinned_batch_is_readable_before_the_sync_that_makes_it_durable(tmp_path, monkeypatch) -> None:
    """``written`` runs once every blob of the batch can be read, and before the file system's sync."""
    from fabric.cache import disk

    events: list[str] = []
    monkeypatch.setattr(disk, "sync_filesystem", lambda path: events.append("sync"))
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    blobs = [(os.urandom(32), os.urandom(1000)) for _ in range(8)]

    def written() -> None:
        assert all(cache.get(k) == data for k, data in blobs), "a blob of the batch is not readable yet"
        events.append("written")

    assert cache.put_pinned(blobs, written=written) == 8
    assert events == ["written", "sync"]


def test_a_pinned_batch_whose_sync_fails_pins_nothing_and_leaves_no_file(tmp_path, monkeypatch) -> None:
    import errno

    from fabric.cache import disk

    def failing_sync(path: str) -> None:
        raise OSError(errno.EIO, "syncfs failed")

    monkeypatch.setattr(disk, "sync_filesystem", failing_sync)
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    before = (os.urandom(32), os.urandom(1000))
    cache.put(*before)  # cached before, unpinned: stays cached
    blobs = [before, *((os.urandom(32), os.urandom(1000)) for _ in range(8))]
    with pytest.raises(OSError, match="syncfs failed"):
        cache.put_pinned(blobs, written=lambda: None)
    assert cache.stats()["cache_pinned_bytes"] == 0
    assert all(k not in cache for k, _ in blobs[1:])
    assert not any(os.path.exists(cache.file(k)) for k, _ in blobs[1:]), "a forgotten blob left its file"
    assert cache.get(before[0]) == before[1]
