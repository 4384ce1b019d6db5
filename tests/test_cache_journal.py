"""The pin journal: a pinned batch is durable through one synced slot file, a crash that
loses the blobs' own files is repaired from it, slots are reused, and the journal stays
inside the cache's budget."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from fabric.cache import journal
from fabric.cache.disk import CacheFull, DiskCache
from fabric.format.chunking import chunk_id

from .test_cache import disk_bytes

KiB = 1024
MiB = 1024 * KiB
# 8 MiB of journal: 16 slots of 512 KiB.
BUDGET = 64 * MiB


def blobs(seed: int, count: int, size: int = 64 * KiB) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = rng.randbytes(size)
        out.append((chunk_id(data), data))
    return out


def open_cache(root, budget: int = BUDGET, pinned: set[bytes] = frozenset()) -> DiskCache:
    return DiskCache(str(root), budget, lambda key, data: chunk_id(data) == key, set(pinned))


def slot_files(root) -> list[str]:
    d = os.path.join(str(root), "journal")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def blob_path(cache: DiskCache, key: bytes) -> str:
    return cache.file(key)


def test_layout_is_an_eighth_of_the_budget_and_none_for_a_small_cache() -> None:
    assert journal.layout(BUDGET) == (16, 512 * KiB)
    assert journal.layout(10 << 30) == (16, 16 * MiB)  # at most 256 MiB
    assert journal.layout(16 * MiB) == (4, 512 * KiB)
    assert journal.layout(4 * MiB)[0] == 0  # too small for two slots: the cache syncs its file system


def test_pinned_blobs_whose_files_a_crash_lost_are_restored_from_the_journal(tmp_path) -> None:
    root = tmp_path / "c"
    cache = open_cache(root)
    first, second = blobs(1, 6), blobs(2, 6)
    cache.put_pinned(first)
    cache.put_pinned(second)
    assert cache.stats()["cache_pinned_bytes"] == 12 * 64 * KiB
    assert len(slot_files(root)) == 2  # a batch per slot
    cache.close()
    # A machine that loses power loses unsynced writes: files gone, empty or torn.
    lost = [first[0], first[1], second[0], second[5]]
    os.unlink(blob_path(cache, lost[0][0]))
    os.truncate(blob_path(cache, lost[1][0]), 0)
    os.truncate(blob_path(cache, lost[2][0]), 1000)
    os.unlink(blob_path(cache, lost[3][0]))
    # The write-back had already sent second[5] to the hub: it is no longer pinned.
    still_pinned = {k for k, _ in first + second} - {second[5][0]}
    again = open_cache(root, pinned=still_pinned)
    for k, data in first + second[:5]:
        assert again.get(k) == data
    assert again.get(second[5][0]) is None  # not pinned: a cache miss, fetched again from the hub
    assert again.stats()["cache_pinned_bytes"] == 11 * 64 * KiB
    assert again.used == disk_bytes(str(root))


def test_a_torn_slot_is_skipped_and_the_others_still_restore(tmp_path) -> None:
    root = tmp_path / "c"
    cache = open_cache(root)
    torn, kept = blobs(3, 4), blobs(4, 4)
    cache.put_pinned(torn)
    cache.put_pinned(kept)
    cache.close()
    slot = os.path.join(str(root), "journal", slot_files(root)[0])
    with open(slot, "r+b") as f:  # the slot of the first batch, torn inside its payload
        f.seek(200 * KiB)
        f.write(b"\xff" * 10)
    for k, _ in torn + kept:
        os.unlink(blob_path(cache, k))
    again = open_cache(root, pinned={k for k, _ in torn + kept})
    assert [again.get(k) for k, _ in kept] == [d for _, d in kept]
    assert not any(os.path.exists(blob_path(again, k)) for k, _ in torn)  # nothing written from the torn slot
    assert [again.get(k) for k, _ in torn] == [None] * 4
    assert again.stats()["cache_corruptions"] == 0


def test_a_slot_is_reused_once_its_blobs_are_unpinned(tmp_path) -> None:
    cache = open_cache(tmp_path / "c")
    for round_ in range(40):
        batch = blobs(100 + round_, 4)
        cache.put_pinned(batch)
        for k, _ in batch:
            cache.unpin(k)  # at the hub
    assert len(slot_files(tmp_path / "c")) == 1
    assert cache._journal.syncs == 0  # never a sync of the file system


def test_with_every_blob_still_pinned_a_sync_frees_the_slots_and_writers_go_on(tmp_path) -> None:
    """The hub is away: nothing is unpinned. Half the slots in use start a sync of the file
    system in the background; writers that find no slot free wait for one; none fails."""
    root = tmp_path / "c"
    cache = open_cache(root)
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        try:
            for i in range(12):
                cache.put_pinned(blobs(seed * 100 + i, 5))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,), daemon=True) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert cache.stats()["cache_pinned_bytes"] == 4 * 12 * 5 * 64 * KiB
    assert cache._journal.syncs >= 1
    assert len(slot_files(root)) <= 16
    deadline = time.monotonic() + 10
    while cache._journal.in_use() > 8 and time.monotonic() < deadline:
        time.sleep(0.05)  # the last background sync frees what was written before it
    assert cache._journal.in_use() <= 8
    assert cache.used == disk_bytes(str(root)) <= BUDGET


def test_the_journal_counts_against_the_budget_and_pins_leave_it_room(tmp_path) -> None:
    cache = open_cache(tmp_path / "c")
    room = BUDGET - cache._journal.max_bytes
    batch = blobs(5, room // (256 * KiB), 256 * KiB)
    cache.put_pinned(batch[: len(batch) // 2])
    cache.put_pinned(batch[len(batch) // 2 :])
    with pytest.raises(CacheFull, match="pins may take"):
        cache.put_pinned(blobs(6, 1, 256 * KiB))
    assert cache.used == disk_bytes(str(tmp_path / "c")) <= BUDGET


@pytest.mark.parametrize(("budget", "slots"), [(16 * MiB, ["slot-00", "slot-01", "slot-02", "slot-03"]), (4 * MiB, [])])
def test_a_journal_laid_out_for_another_budget_restores_then_gives_way(tmp_path, budget: int, slots: list[str]) -> None:
    root = tmp_path / "c"
    cache = open_cache(root, budget=256 * MiB)  # 16 slots of 2 MiB
    batches = [blobs(10 + i, 8) for i in range(6)]
    for batch in batches:
        cache.put_pinned(batch)
    assert len(slot_files(root)) == 6
    cache.close()
    everything = [pair for batch in batches for pair in batch]
    for k, _ in everything:
        os.unlink(blob_path(cache, k))
    again = open_cache(root, budget=budget, pinned={k for k, _ in everything})  # fewer slots, or none
    assert all(again.get(k) == data for k, data in everything)
    assert slot_files(root) == slots
    assert again.used == disk_bytes(str(root))
