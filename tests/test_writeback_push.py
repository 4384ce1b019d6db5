"""The write-back's push of chunks sent on early: several packs on the link at once, and
each pack's chunks unpinned as soon as the hub has it (not at the end of the round).

A unit test of :class:`spoke.writeback.WriteBack` with a real cache and queue; the hub is a
stand-in that holds each upload until the test lets it go, so what is in flight at a given
moment can be seen. The whole path against a real hub is covered by test_spoke_outage.py,
test_checkpoint_spoke_kill.py and bench/bench_checkpoint.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from fabric.cache.disk import DiskCache
from fabric.errors import Unavailable
from fabric.format import frames, packs
from fabric.format.model import Entry
from spoke import writeback
from spoke.traffic import Traffic
from spoke.writeback import PUSH_DEPTH, WriteBack
from tests.spokeserver import wait_for

pytestmark = pytest.mark.timeout(60)

CHUNK = 64 * 1024
PER_PACK = 4


class HeldHub:
    """Takes packs like the hub's client, each upload held until :meth:`release`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.peak = self.questions = 0
        self.landed: list[list[bytes]] = []
        self.gate = threading.Semaphore(0)

    def missing_chunks(self, ids: Sequence[bytes], repo: str | None = None) -> list[bytes]:
        with self.lock:
            self.questions += 1
        return list(ids)

    def receive_pack(self, data: bytes, durability: str | None = None, repo: str | None = None) -> tuple[int, int]:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.gate.acquire(timeout=30)
        ids = [c.id for c in packs.parse_index(data)]
        with self.lock:
            self.running -= 1
            self.landed.append(ids)
        return len(ids), len(ids)

    def release(self, n: int) -> None:
        for _ in range(n):
            self.gate.release()


@pytest.fixture
def pushing(tmp_path, monkeypatch) -> Iterator[tuple[WriteBack, DiskCache, HeldHub, list[bytes]]]:
    monkeypatch.setattr(packs, "TARGET_SIZE", 2 * PER_PACK * (CHUNK + frames.HEADER_LEN))  # PER_PACK chunks a pack
    cache = DiskCache(str(tmp_path / "chunks"), 64 << 20)
    blobs = {os.urandom(32): frames.encode(os.urandom(CHUNK)) for _ in range(10 * PER_PACK)}
    cache.put_pinned(blobs.items())
    hub = HeldHub()
    wb = WriteBack(str(tmp_path / "writeback.db"))
    wb.start(cache, hub, Traffic(), lambda *_: None)  # type: ignore[arg-type]
    try:
        yield wb, cache, hub, list(blobs)
    finally:
        hub.release(100)
        wb.stop()
        cache.close()


def pinned(cache: DiskCache) -> int:
    return cache.stats()["cache_pinned_bytes"]


def test_packs_go_up_several_at_once_and_each_is_unpinned_when_it_lands(pushing) -> None:
    wb, cache, hub, ids = pushing
    frame_bytes = pinned(cache) // len(ids)
    wb.send_early("r", ids)
    wait_for(lambda: hub.running == PUSH_DEPTH)  # PUSH_DEPTH uploads in flight
    time.sleep(0.2)
    assert hub.running == PUSH_DEPTH, "no more packs than PUSH_DEPTH are uploaded at once"
    assert pinned(cache) == len(ids) * frame_bytes, "nothing is unpinned before the hub has it"

    hub.release(1)
    wait_for(lambda: len(hub.landed) == 1)  # the first pack to land
    first = set(hub.landed[0])
    wait_for(lambda: pinned(cache) == (len(ids) - PER_PACK) * frame_bytes)  # the landed pack's chunks to be unpinned
    with cache._lock:  # which ones: exactly the landed pack's
        assert first.isdisjoint(cache._pinned)
        assert len(cache._pinned) == len(ids) - PER_PACK
    wait_for(lambda: hub.running == PUSH_DEPTH)  # the next pack to take the free place

    hub.release(100)
    wait_for(lambda: pinned(cache) == 0)  # every chunk unpinned
    assert sorted(c for pack in hub.landed for c in pack) == sorted(ids), "each chunk sent exactly once"
    assert hub.peak == PUSH_DEPTH
    assert wb.pinned_chunks() == set(), "no early chunk is left to send after a restart"


def test_a_restart_before_a_pack_lands_sends_only_what_had_not_landed(pushing, tmp_path) -> None:
    wb, cache, hub, ids = pushing
    assert writeback.EARLY_BATCH >= len(ids)  # one round: what is seen below is a round in progress
    wb.send_early("r", ids)
    hub.release(2)
    wait_for(lambda: len(hub.landed) == 2)  # two packs to land
    landed = {c for pack in hub.landed for c in pack}
    wait_for(lambda: landed.isdisjoint(wb.pinned_chunks()))  # the landed packs to leave the early table
    # A restarted spoke reads the early table: it pins and sends again only what had not landed.
    again = WriteBack(str(tmp_path / "writeback.db"))
    try:
        assert again.pinned_chunks() == set(ids) - landed
    finally:
        again.stop()


@pytest.mark.parametrize("chained", [True, False])
def test_the_next_rounds_question_goes_while_the_last_rounds_packs_are_on_the_link(pushing, monkeypatch, chained) -> None:
    """Rounds of two packs, three packs in flight at most: the third place goes to the next round
    at once, not after the first round has landed (unless chaining is off)."""
    wb, cache, hub, ids = pushing
    monkeypatch.setattr(writeback, "EARLY_BATCH", 2 * PER_PACK)
    monkeypatch.setattr(writeback, "EARLY_CHAIN_SECONDS", 60.0 if chained else 0.0)
    wb.send_early("r", ids)
    if chained:
        wait_for(lambda: hub.running == PUSH_DEPTH)
        assert hub.questions >= 2 and not hub.landed, "the second round was asked before the first landed"
    else:
        wait_for(lambda: hub.running == 2)
        time.sleep(0.3)
        assert (hub.running, hub.questions, hub.landed) == (2, 1, []), "a round waits for the last one to land"
    hub.release(100)
    wait_for(lambda: pinned(cache) == 0)
    assert sorted(c for pack in hub.landed for c in pack) == sorted(ids), "each chunk sent exactly once"
    assert wb.pinned_chunks() == set()


class StagingHub(HeldHub):
    """Also stages entries; while ``away``, the early push's question fails (a hub restarting)."""

    def __init__(self) -> None:
        super().__init__()
        self.away = True
        self.staged: dict[str, Entry | None] = {}
        self.gate = threading.Semaphore(1000)

    def missing_chunks(self, ids: Sequence[bytes], repo: str | None = None) -> list[bytes]:
        if self.away:
            raise Unavailable("hub is restarting")
        return super().missing_chunks(ids, repo)

    def staging_snapshot(self, repo: str, branch: str, entries: object) -> tuple[str, int, None]:
        return "head", len(self.staged), None

    def stage(self, repo: str, branch: str, changes: dict[str, Entry | None]) -> int:
        self.staged.update(changes)
        return len(self.staged)


def test_a_landed_write_unpins_its_chunks_while_their_early_push_waits_on_its_backoff(tmp_path, monkeypatch) -> None:
    """The early push failed and backs off for a long time; the write that uses the chunks
    lands meanwhile: its chunks are at the hub, so they leave the early table and their pins
    go at once (they used to stay pinned, holding room writers wait for, until the early
    push's next try)."""
    monkeypatch.setattr(writeback, "BACKOFF_MIN", 600.0)
    monkeypatch.setattr(writeback, "BACKOFF_MAX", 600.0)
    cache = DiskCache(str(tmp_path / "chunks"), 64 << 20)
    blobs = {os.urandom(32): frames.encode(os.urandom(CHUNK)) for _ in range(3)}
    cache.put_pinned(blobs.items())
    hub = StagingHub()
    wb = WriteBack(str(tmp_path / "writeback.db"))
    wb.start(cache, hub, Traffic(), lambda *_: None)  # type: ignore[arg-type]
    try:
        ids = list(blobs)
        wb.send_early("r", ids)
        wait_for(lambda: wb.last_error is not None)  # the early push failed and backs off
        hub.away = False
        entry = Entry(size=3 * CHUNK, chunks=tuple((cid, CHUNK) for cid in ids))
        wb.enqueue("r", "main", {"f.bin": entry})
        wait_for(lambda: "f.bin" in hub.staged)
        wait_for(lambda: pinned(cache) == 0, timeout=5)
        assert wb.pinned_chunks() == set(), "a restarted spoke would pin them again"
        assert sorted(c for pack in hub.landed for c in pack) == sorted(ids)
    finally:
        wb.stop()
        cache.close()
