"""DiskCache under concurrent callers: pin batches racing at the budget, exact counters."""

from __future__ import annotations

import os
import threading

import pytest

from fabric.cache.disk import CacheFull, DiskCache
from fabric.format.chunking import chunk_id

KiB = 1024


def key(i: int | str) -> bytes:
    return chunk_id(str(i).encode())


def run_together(n: int, fn) -> list[BaseException | None]:
    """Run ``fn(i)`` in ``n`` threads released by one barrier; each thread's exception (or None)."""
    barrier = threading.Barrier(n)
    results: list[BaseException | None] = [None] * n

    def body(i: int) -> None:
        barrier.wait()
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("round_", range(5))
def test_racing_pin_batches_never_exceed_the_budget_nor_pin_partly(tmp_path, round_: int) -> None:
    budget = 1024 * KiB
    cache = DiskCache(str(tmp_path / "c"), budget)
    threads, blobs, size = 6, 64, 4 * KiB  # each batch is 256 KiB: four fit, six race for the room
    batches = [[(key(f"{round_}-{t}-{i}"), os.urandom(size)) for i in range(blobs)] for t in range(threads)]

    results = run_together(threads, lambda t: cache.put_pinned(batches[t]))

    for exc in results:
        assert exc is None or isinstance(exc, CacheFull), exc
    stats = cache.stats()
    assert stats["cache_pinned_bytes"] <= budget
    assert stats["cache_bytes"] <= budget
    pinned_batches = 0
    for t, exc in enumerate(results):
        present = [k in cache for k, _ in batches[t]]
        if exc is None:
            assert all(present), f"batch {t} succeeded but is not wholly pinned"
            assert all(cache.get(k) == data for k, data in batches[t])
            pinned_batches += 1
        else:
            assert not any(present), f"batch {t} was refused but left {sum(present)} of {blobs} blobs pinned"
    assert pinned_batches == 4  # the budget holds exactly four batches: the refusals were needed
    assert stats["cache_pinned_bytes"] == pinned_batches * blobs * size


def test_a_batch_that_fails_to_write_pins_nothing(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    good = [(key(f"g{i}"), os.urandom(1000)) for i in range(20)]
    bad_data = b"y" * 1000
    bad = chunk_id(bad_data)
    # A file where the blob's directory should be: this blob cannot be written.
    (tmp_path / "c" / bad.hex()[:2]).write_bytes(b"not a directory")
    cache.put(good[0][0], good[0][1])  # one of them was already cached (unpinned)
    with pytest.raises(OSError):
        cache.put_pinned([*good, (bad, bad_data)])
    assert cache.stats()["cache_pinned_bytes"] == 0
    assert bad not in cache
    assert all(k not in cache for k, _ in good[1:])
    assert cache.get(good[0][0]) == good[0][1]  # what was cached before stays cached, unpinned
    cache.put_pinned(good)  # and the room was given back
    assert cache.stats()["cache_pinned_bytes"] == 20 * 1000


def test_hits_and_misses_count_every_read_exactly(tmp_path) -> None:
    cache = DiskCache(str(tmp_path / "c"), 4 << 20)
    keys = [key(i) for i in range(64)]
    for k in keys:
        cache.put(k, os.urandom(2 * KiB))
    # Files removed behind the cache's back: reading them is a miss too.
    for k in keys[:16]:
        os.unlink(cache._path(k))
    threads, reads = 8, 400

    def reader(t: int) -> None:
        for i in range(reads):
            cache.get(keys[(t * 7 + i) % len(keys)] if i % 5 else key(f"absent-{t}-{i}"))

    assert run_together(threads, reader) == [None] * threads
    assert cache.hits + cache.misses == threads * reads
