"""The mount's ``--cache-dir`` of packs (fabric/cache/packs.py): appends, reads in runs,
restarts, torn tails, damage, eviction by pack, a full disk, kill -9."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from fabric.cache import packs
from fabric.cache.packs import HEADER, PackCache
from fabric.format.chunking import chunk_id
from tests.chaos.faults import flip

KiB, MiB = 1024, 1 << 20


def chunks(n: int, size: int = 64 * KiB, seed: int = 0) -> list[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        data = rnd.randbytes(size)
        out.append((chunk_id(data), data))
    return out


def pack_files(root) -> list[str]:
    d = os.path.join(str(root), packs.PACKS)
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".pack"))


def read_all(cache: PackCache, items: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    bufs = [(cid, memoryview(bytearray(len(data)))) for cid, data in items]
    served = cache.read_into(bufs)
    return {cid: bytes(buf) for cid, buf in bufs if cid in served}


def assert_served_all_but(cache: PackCache, items: list[tuple[bytes, bytes]], victim: int) -> None:
    """Every chunk of ``items`` comes back intact but the damaged one, counted once."""
    got = read_all(cache, items)
    assert set(got) == {cid for cid, _ in items} - {items[victim][0]}
    assert all(got[cid] == data for cid, data in items if cid in got)
    assert cache.stats()["cache_corruptions"] == 1


def filled(root, items: list[tuple[bytes, bytes]], budget: int = 64 * MiB) -> PackCache:
    """A cache in ``root`` holding ``items`` (its last pack still being written)."""
    cache = PackCache(str(root), budget)
    for cid, data in items:
        cache.put(cid, data)
    return cache


def test_chunks_come_back_whole_and_checked_in_one_request(tmp_path) -> None:
    cache = PackCache(str(tmp_path), 64 * MiB)
    items = chunks(40, seed=1) + chunks(3, size=200 * KiB, seed=2)
    for cid, data in items:
        assert cache.put(cid, data)
    assert cache.put(*items[0])  # already cached: nothing appended
    assert cache.stats()["cache_entries"] == len(items)
    assert cache.stats()["cache_bytes"] == sum(len(d) + HEADER.size for _, d in items)
    # One request of all of them (more than one run's worth), in another order, one chunk twice.
    shuffled = items[::-1] + [items[5]]
    bufs = [(cid, memoryview(bytearray(len(data)))) for cid, data in shuffled]
    assert cache.read_into(bufs) == {cid for cid, _ in items}
    assert all(bytes(buf) == data for (_, buf), (_, data) in zip(bufs, shuffled, strict=True))
    assert cache.read(items[7][0]) == items[7][1]
    unknown = chunks(1, seed=3)[0]
    assert cache.read(unknown[0]) is None and unknown[0] not in cache
    assert cache.read_into([(unknown[0], memoryview(bytearray(len(unknown[1]))))]) == set()
    assert not cache.put(b"\1" * 32, b"")  # nothing to cache
    assert not cache.put(b"\2" * 32, bytes(packs.MAX_CHUNK + 1))  # larger than any chunk
    cache.close()
    assert not cache.put(*chunks(1, seed=4)[0])  # closed: not cached


def test_a_restart_keeps_every_chunk_whether_closed_or_not(tmp_path) -> None:
    items = chunks(64, seed=5)
    filled(tmp_path, items, 16 * MiB)  # packs of 1 MiB: several sealed, one open
    assert len(pack_files(tmp_path)) > 2
    # Not closed (a crash): the open pack has no index and is scanned.
    again = PackCache(str(tmp_path), 16 * MiB)
    assert read_all(again, items) == dict(items)
    again.close()
    assert all(os.path.exists(p[: -len("pack")] + "idx") for p in pack_files(tmp_path))
    third = PackCache(str(tmp_path), 16 * MiB)
    assert read_all(third, items) == dict(items)
    assert third.stats()["cache_corruptions"] == 0


def test_a_torn_record_at_the_end_is_cut_off(tmp_path) -> None:
    items = chunks(5, seed=6)
    filled(tmp_path, items)
    (last,) = pack_files(tmp_path)
    whole = os.path.getsize(last)
    torn, data = chunks(1, seed=7)[0]
    with open(last, "ab") as f:  # a header and half a chunk: the process died mid-append
        f.write(HEADER.pack(packs.MAGIC, len(data), torn, 0) + data[: len(data) // 2])
    again = PackCache(str(tmp_path), 64 * MiB)
    assert os.path.getsize(last) == whole
    assert torn not in again
    assert read_all(again, items) == dict(items)
    assert again.put(torn, data) and again.read(torn) == data


def test_an_index_that_does_not_fit_its_pack_is_rebuilt_from_the_headers(tmp_path) -> None:
    items = chunks(8, seed=8)
    filled(tmp_path, items).close()
    (pack,) = pack_files(tmp_path)
    with open(pack[: -len("pack")] + "idx", "r+b") as f:
        f.truncate(17)  # not a whole number of index records
    with open(os.path.join(str(tmp_path), packs.PACKS, "00000099.idx"), "wb") as f:
        f.write(b"an index without its pack")
    again = PackCache(str(tmp_path), 64 * MiB)
    assert read_all(again, items) == dict(items)
    assert not os.path.exists(os.path.join(str(tmp_path), packs.PACKS, "00000099.idx"))


def test_a_damaged_chunk_is_dropped_counted_and_cached_again(tmp_path) -> None:
    items = chunks(6, seed=9)
    cache = filled(tmp_path, items)
    (pack,) = pack_files(tmp_path)
    victim = 3
    flip(pack, (HEADER.size + 64 * KiB) * victim + HEADER.size + 1000)
    assert_served_all_but(cache, items, victim)
    assert items[victim][0] not in cache
    assert cache.put(*items[victim])
    assert cache.read(items[victim][0]) == items[victim][1]
    cache.close()
    # A restart indexes both copies; the later (good) one wins.
    again = PackCache(str(tmp_path), 64 * MiB)
    assert read_all(again, items) == dict(items)
    assert again.stats()["cache_corruptions"] == 0


def test_the_budget_holds_and_eviction_goes_by_pack(tmp_path) -> None:
    budget = 8 * MiB  # packs of 1 MiB (15 chunks of 64 KiB), a window of 1 MiB
    hot = chunks(15, seed=10)
    cache = filled(tmp_path, hot, budget)
    for i in range(12):  # 12 more packs' worth; the first pack is read between them
        for cid, data in chunks(15, seed=100 + i):
            cache.put(cid, data)
            assert cache.used <= budget + cache.pack_bytes
        assert read_all(cache, hot[:1]) == dict(hot[:1]), f"the pack read all along was evicted (round {i})"
    assert sum(os.path.getsize(p) for p in pack_files(tmp_path)) <= budget + cache.pack_bytes
    assert cache.stats()["cache_evictions"] > 0
    # Every chunk of a hot pack survives with it, though only one was read.
    assert read_all(cache, hot) == dict(hot)


def read_through(cache: PackCache, items: list[tuple[bytes, bytes]]) -> int:
    """A reader's pass: each chunk read, fetched and put on a miss; the hits."""
    got = 0
    for cid, blob in items:
        if cache.read(cid) is not None:
            got += 1
        else:
            cache.put(cid, blob)
    return got


def test_a_new_working_set_replaces_a_dead_one(tmp_path) -> None:
    """An old set fills main and is never read again; a set 60% of the budget then read over
    and over gets cached (misses advance the read clock, so the old packs age)."""
    budget = 8 * MiB
    cache = PackCache(str(tmp_path), budget)
    old = chunks(110, seed=12)  # about 7 MiB
    for _ in range(2):
        read_through(cache, old)
    new = chunks(75, seed=13)  # about 5 MiB
    hits = [read_through(cache, new) for _ in range(8)]
    assert hits[-1] >= len(new) * 0.9, hits


@pytest.mark.parametrize("cycle", [1.5, 3])
def test_a_cyclic_scan_larger_than_the_cache_keeps_hitting(tmp_path, cycle: float) -> None:
    """Plain LRU (or FIFO) would hit nothing on a loop over more than the budget. Past twice
    the budget, main's packs would also look dead by age alone: a pack whose chunks come back
    after a whole cycle (their reuse distance, remembered past eviction) does not displace
    main's packs, which the cycle reads sooner."""
    budget = 16 * MiB  # packs of 1 MiB, a window of 2 MiB: main holds up to 13 MiB
    cache = PackCache(str(tmp_path), budget)
    data = chunks(int(cycle * 256), seed=14)
    hits = [read_through(cache, data) for _ in range(5)]
    assert hits[0] == 0
    assert min(hits[2:]) >= len(data) * 0.8 * cache.main_cap / (cycle * budget), hits
    assert cache.used <= budget


def test_old_chunk_files_and_packs_without_checksums_are_removed(tmp_path) -> None:
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / ("ab" * 32)).write_bytes(b"old layout")
    items = chunks(3, seed=21)
    (tmp_path / "packs").mkdir()  # FCK1: 40-byte headers, no checksum
    (tmp_path / "packs" / "00000000.pack").write_bytes(b"".join(b"FCK1" + len(d).to_bytes(4, "little") + cid + d for cid, d in items))
    (tmp_path / "keep").mkdir()
    cache = PackCache(str(tmp_path), 64 * MiB)
    assert not (tmp_path / "ab").exists() and not (tmp_path / "packs").exists()
    assert (tmp_path / "keep").exists()  # not a name of an old layout
    assert read_all(cache, items) == {} and cache.stats()["cache_entries"] == 0


@pytest.mark.parametrize("field", ["checksum", "id", "length", "magic"])
def test_a_chunk_whose_record_header_does_not_match_is_not_served(tmp_path, field) -> None:
    """Every chunk read back is checked against its record: a header damaged in any field
    (or bytes that do not hash to its checksum) make it a miss, counted, never served."""
    items = chunks(4, seed=22)
    cache = filled(tmp_path, items)
    (pack,) = pack_files(tmp_path)
    victim = 2
    flip(pack, (HEADER.size + 64 * KiB) * victim + {"magic": 0, "length": 4, "id": 8, "checksum": 40}[field])
    assert_served_all_but(cache, items, victim)
    assert cache.read(items[victim][0]) is None


def _tmpfs(path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], check=True)


def test_a_full_disk_caches_nothing_more_and_serves_what_it_has(tmp_path) -> None:
    root = tmp_path / "small"
    _tmpfs(root)
    try:
        cache = PackCache(str(root), 64 * MiB)  # a budget far beyond the disk
        items = chunks(20, seed=12)  # 1.25 MiB
        kept = [item for item in items if cache.put(*item)]
        assert 0 < len(kept) < len(items)
        assert read_all(cache, items) == dict(kept)
        assert cache.stats()["cache_corruptions"] == 0
        cache.close()
        assert read_all(PackCache(str(root), 64 * MiB), items) == dict(kept)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


WRITER = """
import itertools, sys
from fabric.cache.packs import PackCache
from tests.test_pack_cache import chunks
cache = PackCache(sys.argv[1], 1 << 30)
print("ready", flush=True)
for group in itertools.count():
    for cid, data in chunks(16, seed=group):
        cache.put(cid, data)
"""


def test_kill_9_mid_append_leaves_a_cache_that_serves_a_prefix_of_the_writes(tmp_path) -> None:
    root = str(tmp_path / "cache")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, root], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    deadline = time.monotonic() + 30
    while sum(os.path.getsize(p) for p in pack_files(root)) < 8 * MiB:
        assert time.monotonic() < deadline, "the writer wrote too little"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    cache = PackCache(root, 1 << 30)
    written = [item for group in range(cache.stats()["cache_entries"] // 16 + 2) for item in chunks(16, seed=group)]
    got = read_all(cache, written)
    kept = len(got)
    assert kept >= 8 * MiB // (64 * KiB + HEADER.size) - 1
    assert set(got) == {cid for cid, _ in written[:kept]}  # every write up to the kill, none after
    assert all(got[cid] == data for cid, data in written[:kept])
    assert cache.stats()["cache_corruptions"] == 0


def test_readers_writers_and_eviction_at_once_serve_only_right_bytes(tmp_path) -> None:
    """Packs sealed, evicted and deleted under readers: a read gets the right bytes or a miss."""
    from concurrent.futures import ThreadPoolExecutor

    cache = PackCache(str(tmp_path), 6 * MiB)  # packs of 1 MiB, constant eviction
    items = chunks(300, seed=14)  # 19 MiB
    stop = time.monotonic() + 3

    def write(k: int) -> None:
        while time.monotonic() < stop:
            for cid, data in items[k::2]:
                cache.put(cid, data)

    def read(k: int) -> int:
        rnd, served = random.Random(k), 0
        while time.monotonic() < stop:
            pick = rnd.sample(items, 16)
            got = read_all(cache, pick)
            assert all(got[cid] == data for cid, data in pick if cid in got)
            served += len(got)
        return served

    with ThreadPoolExecutor(6) as pool:
        writes = [pool.submit(write, k) for k in range(2)]
        reads = [pool.submit(read, k) for k in range(4)]
        for f in writes:
            f.result()
        assert sum(f.result() for f in reads) > 0
    stats = cache.stats()
    assert stats["cache_evictions"] > 0 and stats["cache_corruptions"] == 0
    assert stats["cache_bytes"] <= 6 * MiB + cache.pack_bytes
