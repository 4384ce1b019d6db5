"""DiskCache read plans: blobs to be read soon are kept before those read late or never."""

from __future__ import annotations

import concurrent.futures
import os
import random

import pytest

from fabric.cache import plans
from fabric.cache.disk import DiskCache
from fabric.format.chunking import chunk_id

KiB = 1024
SIZE = 4 * KiB
BUDGET = 100 * SIZE  # 100 blobs; the window holds 10


def key(i: int | str) -> bytes:
    return chunk_id(str(i).encode())


def blob(i: int) -> bytes:
    return random.Random(i).randbytes(SIZE)


def disk_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)


def planned_cache(tmp_path, n: int) -> DiskCache:
    """A cache holding blobs 0..n-1, all planned by the plan "job" in that order."""
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    cache.plan([key(i) for i in range(n)], "job")
    for i in range(n):
        cache.put(key(i), blob(i))
    return cache


def warm_hot_set(cache: DiskCache, ids) -> None:
    for _ in range(3):
        for i in ids:
            if cache.get(key(i)) is None:
                cache.put(key(i), blob(i))


def test_planned_blobs_put_ahead_are_kept_until_read(tmp_path) -> None:
    """A prefetcher puts 50 blobs before they are read: without a plan scan resistance drops most
    of them (the window is 10 blobs, main holds a live hot set); with one all are kept."""
    kept = {}
    for planned in (False, True):
        cache = DiskCache(str(tmp_path / f"c{planned}"), BUDGET)
        warm_hot_set(cache, range(90))
        ahead = range(1000, 1050)
        if planned:
            assert cache.plan([key(i) for i in ahead], "job-a") == 50
        for i in ahead:
            cache.put(key(i), blob(i))
        kept[planned] = sum(cache.get(key(i)) is not None for i in ahead)
        assert cache.used <= BUDGET and cache.used == disk_bytes(cache.root)
    assert kept[False] <= 15, kept
    assert kept[True] == 50, kept


def test_the_blob_read_last_is_evicted_first(tmp_path) -> None:
    """150 planned blobs put into room for 100: the cache keeps the 100 read soonest (Belady)."""
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    order = list(range(150))
    random.Random(5).shuffle(order)
    cache.plan([key(i) for i in order], "job")
    for i in range(150):  # put in another order than the plan's
        cache.put(key(i), blob(i))
        assert cache.used <= BUDGET
    cached = {i for i in range(150) if key(i) in cache}
    assert cached == set(order[:100])
    assert cache.stats()["cache_planned_bytes"] == 100 * SIZE
    hits = sum(cache.get(key(i)) is not None for i in order)
    assert hits == 100
    assert cache.used == disk_bytes(cache.root)


def test_a_read_consumes_its_place_and_releases_the_blob(tmp_path) -> None:
    cache = planned_cache(tmp_path, 20)
    assert cache.stats()["cache_planned_bytes"] == 20 * SIZE
    for i in range(10):
        assert cache.get(key(i)) is not None
    # The first ten were read: they are ordinary cached blobs now; the other ten stay planned.
    assert cache.stats()["cache_planned_bytes"] == 10 * SIZE
    # A flood of unplanned blobs evicts the read ones before any still planned.
    for i in range(5000, 5300):
        cache.put(key(i), blob(i))
    assert all(key(i) in cache for i in range(10, 20))
    assert sum(key(i) in cache for i in range(10)) <= 2


def test_a_read_served_from_memory_consumes_its_place_as_a_get_does(tmp_path) -> None:
    """The spoke keeps verified chunks in memory in front of the cache and then only touches it."""
    cache = planned_cache(tmp_path, 20)
    hits = cache.hits
    for i in range(10):
        cache.touch(key(i))
    assert cache.stats()["cache_planned_bytes"] == 10 * SIZE
    assert cache.hits == hits + 10
    cache.touch(key("never cached"))  # no file, no hit, nothing breaks
    assert cache.hits == hits + 10


def test_skipped_places_are_released_but_a_stray_read_far_ahead_is_not_a_skip(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(plans, "PLAN_SKIP", 5)
    monkeypatch.setattr(plans, "PLAN_LAG", 0)
    cache = planned_cache(tmp_path, 30)
    cache.get(key(3))  # 0, 1, 2 were passed over
    assert cache.stats()["cache_planned_bytes"] == 26 * SIZE
    cache.get(key(25))  # far ahead: only its own place goes
    assert cache.stats()["cache_planned_bytes"] == 25 * SIZE
    cache.get(key(4))
    assert cache.stats()["cache_planned_bytes"] == 24 * SIZE


def test_the_last_places_before_a_read_stay_planned_for_readers_of_several_files(tmp_path, monkeypatch) -> None:
    """Two workers read file A (places 0-9) and file B (10-19) at once: B's first read must
    not release what A has still to read; once the reads are far enough ahead, A's unread
    places are released."""
    monkeypatch.setattr(plans, "PLAN_SKIP", 16)
    monkeypatch.setattr(plans, "PLAN_LAG", 20)
    cache = planned_cache(tmp_path, 40)
    cache.get(key(0))
    cache.get(key(10))  # worker 2 starts file B
    assert cache.stats()["cache_planned_bytes"] == 38 * SIZE  # A's places 1-9 are still planned
    cache.get(key(1))
    for i in range(11, 20):
        cache.get(key(i))
    assert cache.stats()["cache_planned_bytes"] == 28 * SIZE
    cache.get(key(30))  # more than the lag past places 2-9, which were never read: passed over
    assert cache.stats()["cache_planned_bytes"] == 19 * SIZE


def test_an_id_planned_twice_stays_planned_until_its_second_read(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    cache.plan([key("a"), key("b"), key("a")], "job")
    cache.put(key("a"), blob(1))
    cache.put(key("b"), blob(2))
    cache.get(key("a"))
    cache.get(key("b"))
    assert cache.stats()["cache_planned_bytes"] == SIZE  # "a" is read again later
    cache.get(key("a"))
    assert cache.stats()["cache_planned_bytes"] == 0


def test_dropping_or_replacing_a_plan_makes_its_blobs_ordinary(tmp_path) -> None:
    cache = planned_cache(tmp_path, 40)
    cache.plan([key(i) for i in range(30, 40)], "job")  # a new epoch replaces the old order
    assert cache.stats()["cache_planned_bytes"] == 10 * SIZE
    cache.drop_plan("job")
    assert cache.stats()["cache_planned_bytes"] == 0
    cache.plan([key(i) for i in range(5)], "job")
    cache.plan([], "job")  # an empty plan drops it too
    assert cache.stats()["cache_planned_bytes"] == 0 and cache.stats()["cache_plan_ids"] == 0
    for i in range(5000, 5300):  # unplanned again: they go like any other blob
        cache.put(key(i), blob(i))
    assert sum(key(i) in cache for i in range(40)) <= 5


def test_two_plans_keep_what_either_reads_soon(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    cache.plan([key(i) for i in range(60)], "a")
    cache.plan([key(i) for i in range(200, 260)], "b")
    for i in [*range(60), *range(200, 260)]:
        cache.put(key(i), blob(i))
    # 120 planned blobs in room for 100: each plan loses its farthest ones, the soonest stay.
    assert all(key(i) in cache for i in range(40)) and all(key(i) in cache for i in range(200, 240))
    assert cache.used <= BUDGET


def test_plan_memory_is_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(plans, "PLAN_MAX_IDS", 100)
    monkeypatch.setattr(plans, "PLAN_MAX", 3)
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    cache.plan([key(i) for i in range(150)], "big")
    assert cache.stats()["cache_plan_ids"] == 100  # its first 100, the soonest
    for name in ("a", "b", "c", "d"):
        cache.plan([key(f"{name}{i}") for i in range(30)], name)
        assert cache.stats()["cache_plan_ids"] <= 100
    assert cache._plans.names() == ["b", "c", "d"]  # the oldest plans went first


def test_budget_holds_with_plans_under_concurrent_readers(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    cache.plan([key(i) for i in range(0, 300, 2)], "even")

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            i = rng.randrange(300)
            if cache.get(key(i)) is None:
                cache.put(key(i), blob(i))
            if rng.random() < 0.02:
                cache.plan([key(j) for j in range(i, 300)], f"w{seed}")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(worker, range(6)))  # (a worker's exception fails the test)
    assert cache.used <= BUDGET
    on_disk = {bytes.fromhex(n) for _, _, names in os.walk(cache.root) for n in names}
    assert on_disk == set(cache.keys())
    assert cache.used == disk_bytes(cache.root)


@pytest.mark.parametrize("bad", [[b""], ["not bytes"], [None]])
def test_a_bad_plan_is_refused_and_changes_nothing(tmp_path, bad) -> None:
    cache = DiskCache(str(tmp_path / "c"), BUDGET)
    cache.plan([key(1)], "job")
    with pytest.raises(ValueError):
        cache.plan(bad, "job")
    assert cache.stats()["cache_plan_ids"] == 1
