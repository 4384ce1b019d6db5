"""The spoke's FetchScheduler over a real hub (HTTP on loopback) and a real DiskCache.

The hub's ``/chunks/frames`` is called through :class:`Recorder`, which passes
every call to the real client and notes which ids each request carried.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from fabric.cache.disk import DiskCache
from fabric.client.http import HttpPlane
from fabric.errors import Corruption, FabricError, NotFound
from fabric.format import frames
from fabric.format.chunking import chunk_id
from spoke.fetch import BACKGROUND, DEMAND_PRIORITY, FetchScheduler
from spoke.traffic import CountingTransport, Traffic
from tests.hubserver import Hub, unique_name
from tests.spokeserver import commit_chunks, random_bytes, text_bytes

MiB = 1 << 20

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dataset(hub: Hub) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Chunks at the hub: id -> raw bytes, and the ids in file order (~150 chunks)."""
    plane = hub.plane()
    repo = unique_name("fetch")
    plane.create_repo(repo)
    files = {"r.bin": random_bytes(6 * MiB, 61), "t.txt": text_bytes(4 * MiB, 62)}
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    commit = plane.commit(repo, "main", "fetch").id
    raw: dict[bytes, bytes] = {}
    order: list[bytes] = []
    for path, ids in commit_chunks(plane, repo, commit).items():
        pos = 0
        entry = plane.stat_chunks(repo, commit, path)
        for cid, n in entry.chunks:
            raw[cid] = files[path][pos : pos + n]
            pos += n
        order.extend(ids)
    order = list(dict.fromkeys(order))
    assert len(order) >= 100
    return raw, order


class Recorder:
    """Calls the hub's ``frames`` for real and records each request's ids (optionally holding the first)."""

    def __init__(
        self,
        plane: HttpPlane,
        hold_first: threading.Event | None = None,
        damage: set[bytes] = frozenset(),
    ) -> None:
        self.plane = plane
        self.calls: list[list[bytes]] = []
        self.lock = threading.Lock()
        self.hold_first = hold_first
        self.damage = set(damage)

    def __call__(self, ids: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        with self.lock:
            self.calls.append(list(ids))
            first = len(self.calls) == 1
        if first and self.hold_first is not None:
            self.hold_first.wait(10)
        for cid, frame in self.plane.frames(ids):
            if cid in self.damage:
                self.damage.discard(cid)
                frame = frame[:-1] + bytes([frame[-1] ^ 1])  # damaged on the wire, once
            yield cid, frame

    def ids(self) -> list[bytes]:
        return [c for call in self.calls for c in call]


@pytest.fixture
def traffic() -> Traffic:
    return Traffic()


@pytest.fixture
def upstream(hub: Hub, traffic: Traffic) -> Iterator[HttpPlane]:
    plane = HttpPlane(
        hub.url, hub.token, transport=CountingTransport(traffic, httpx.HTTPTransport())
    )
    yield plane
    plane.close()


def scheduler(
    tmp_path, fetch, traffic: Traffic, workers: int = 4, budget: int = 256 * MiB, memory: int = 64 * MiB
) -> FetchScheduler:
    return FetchScheduler(
        fetch,
        DiskCache(str(tmp_path / "chunks"), budget, lambda _id, frame: frames.verify_checksum(frame)),
        traffic,
        workers,
        memory=memory,
    )


def test_reads_return_verified_bytes_in_order_and_cache_them(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic)
    try:
        ids = order[:80]
        assert f.read(ids) == [raw[c] for c in ids]
        assert all(c in f.cache for c in ids)
        assert f.miss_bytes == sum(len(raw[c]) for c in ids) and f.hit_bytes == 0
        n = len(rec.calls)
        assert f.read(ids[::-1]) == [raw[c] for c in ids[::-1]]
        assert len(rec.calls) == n, "a second read went to the hub"
        assert f.hit_bytes == f.miss_bytes
        # Duplicated ids in one read: fetched once, returned at each position.
        assert f.read([order[90], order[90], order[91]]) == [
            raw[order[90]],
            raw[order[90]],
            raw[order[91]],
        ]
        assert rec.ids().count(order[90]) == 1
    finally:
        f.stop()


def test_misses_are_coalesced_into_batch_requests(
    tmp_path, dataset, upstream, traffic
) -> None:
    _, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic, workers=4)
    try:
        f.read(order)
        assert sorted(rec.ids()) == sorted(order), (
            "each missing chunk requested exactly once"
        )
        assert len(rec.calls) <= -(-len(order) // f.batch_ids) + 4, [len(c) for c in rec.calls]
        assert max(len(c) for c in rec.calls) <= f.batch_ids
        print(
            f"\n{len(order)} chunks in {len(rec.calls)} requests: {[len(c) for c in rec.calls]}"
        )
    finally:
        f.stop()


def test_concurrent_readers_of_the_same_chunks_share_one_fetch(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic, workers=4)
    ids = order[:64]
    results: list[list[bytes]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def reader() -> None:
        try:
            start.wait()
            results.append(f.read(ids))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=reader) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert len(results) == 8 and all(r == [raw[c] for c in ids] for r in results)
        fetched = rec.ids()
        assert sorted(fetched) == sorted(ids), (
            f"{len(fetched)} ids fetched for {len(ids)} chunks read by 8 readers"
        )
    finally:
        f.stop()


def test_demand_reads_overtake_queued_background_fetches(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    gate = threading.Event()
    rec = Recorder(upstream, hold_first=gate)
    f = scheduler(tmp_path, rec, traffic, workers=1)
    try:
        background, demand = order[:-10], order[-10:]
        f.prefetch(background, BACKGROUND)
        time.sleep(
            0.2
        )  # the one worker has taken the first background batch and is held
        out: list[list[bytes]] = []
        t = threading.Thread(target=lambda: out.append(f.read(demand, DEMAND_PRIORITY)))
        t.start()
        time.sleep(0.2)
        gate.set()
        t.join(30)
        assert out and out[0] == [raw[c] for c in demand]
        # The demand ids went in the very next request after the one in flight (topped up with
        # background ids), ahead of the background ids queued before them.
        assert set(demand) <= set(rec.calls[1]), [len(c) for c in rec.calls]
        deadline = time.monotonic() + 30
        while not all(c in f.cache for c in background):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        snap = traffic.snapshot()
        # The request that carried the demand ids is counted as demand traffic.
        assert snap.get("upstream_bytes_received_demand", 0) >= sum(len(frames.encode(raw[c])) for c in demand)
        assert snap.get("upstream_bytes_received_prefetch", 0) > 0
    finally:
        f.stop()


def _flip_cached_file(cache: DiskCache, cid: bytes) -> None:
    path = cache._path(cid)
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))


def test_warm_reads_come_from_memory_without_reading_or_hashing_the_disk_copy(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic)
    try:
        ids = order[:10]
        assert f.read(ids) == [raw[c] for c in ids]
        for cid in ids:
            _flip_cached_file(f.cache, cid)  # a disk copy read again would now fail its checksum
        hits = f.cache.hits
        assert f.read(ids) == [raw[c] for c in ids]
        assert f.cache.corruptions == 0 and f.refetched == 0, "a warm read went to the disk copy"
        assert f.cache.hits == hits + len(ids), "memory hits count as the cache's hits"
    finally:
        f.stop()


def test_a_damaged_disk_copy_outside_memory_is_fetched_again(tmp_path, dataset, upstream, traffic) -> None:
    raw, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic, memory=0)  # nothing kept in memory: every hit reads the disk
    try:
        cid = order[3]
        assert f.read([cid]) == [raw[cid]]
        _flip_cached_file(f.cache, cid)
        calls = len(rec.calls)
        assert f.read([cid]) == [raw[cid]]
        assert f.cache.corruptions == 1 and f.refetched == 1
        assert len(rec.calls) == calls + 1, "the damaged copy was fetched again from the hub"
    finally:
        f.stop()


def test_damaged_frame_from_the_wire_is_refused_and_not_cached(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    bad = order[5]
    rec = Recorder(upstream, damage={bad})
    f = scheduler(tmp_path, rec, traffic, workers=2)
    try:
        with pytest.raises(Corruption):
            f.read([bad])
        assert bad not in f.cache
        assert f.read([bad]) == [raw[bad]]  # the next fetch is clean
    finally:
        f.stop()


def test_unknown_chunk_fails_its_reader_and_the_workers_carry_on(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    f = scheduler(tmp_path, Recorder(upstream), traffic, workers=2)
    try:
        with pytest.raises(NotFound):
            f.read([chunk_id(b"no such chunk anywhere")])
        assert f.read(order[:3]) == [raw[c] for c in order[:3]]
    finally:
        f.stop()


def test_hub_unreachable_is_an_error_not_a_hang(tmp_path, dataset, traffic) -> None:
    from fabric.util.net import free_port

    _, order = dataset
    dead = HttpPlane(f"http://127.0.0.1:{free_port()}", "t", timeout=5)
    f = scheduler(tmp_path, dead.frames, traffic, workers=2)
    try:
        t0 = time.monotonic()
        with pytest.raises((FabricError, httpx.TransportError)):
            f.read(order[:2])
        assert time.monotonic() - t0 < 15
    finally:
        f.stop()
        dead.close()


def test_frames_for_serves_other_spokes_from_the_cache(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic)
    try:
        got = dict(f.frames_for(order[:20]))
        assert [frames.decode(got[c], c) for c in order[:20]] == [
            raw[c] for c in order[:20]
        ]
        n = len(rec.calls)
        dict(f.frames_for(order[:20]))
        assert len(rec.calls) == n
    finally:
        f.stop()


def test_a_working_set_read_through_requests_replaces_a_dead_one(tmp_path, dataset, upstream, traffic) -> None:
    """Frames a request had fetched used to count as read twice (fetched, then sent), which
    moved each past the cache's window into main at once: with main full of an old working
    set, every new chunk then evicted itself, and a new working set was never cached. Once
    the old set has gone unread for two budgets of reads, the new one takes its place."""
    raw, order = dataset
    rec = Recorder(upstream)
    f = scheduler(tmp_path, rec, traffic, budget=3 * MiB)
    try:
        old, new = order[:48], order[48:96]
        list(f.frames_for(old))
        for _ in range(4):
            asked = len(rec.ids())
            got = list(f.frames_for(new))
            assert [frames.decode(frame, c) for c, frame in got] == [raw[c] for c in new]
        fetched_last = len(rec.ids()) - asked
        cached = sum(c in f.cache for c in new)
        assert cached >= len(new) // 2, f"only {cached} of the {len(new)} chunks read four times are cached"
        assert fetched_last <= len(new) // 2, f"the fourth read of the new set fetched {fetched_last} of {len(new)} chunks again"
        assert sum(c in f.cache for c in old) < len(old) // 2
    finally:
        f.stop()


def test_frames_fetched_for_a_request_are_sent_without_reading_them_back_from_the_disk(
    tmp_path, dataset, upstream, traffic
) -> None:
    raw, order = dataset
    rec = Recorder(upstream)
    reads_back: list[bytes] = []

    def verify(cid: bytes, frame: bytes) -> bool:  # the cache's check of every copy it reads from its disk
        reads_back.append(cid)
        return frames.verify_checksum(frame)

    f = FetchScheduler(rec, DiskCache(str(tmp_path / "chunks"), 256 * MiB, verify), traffic, 4)
    try:
        ids = order[:40]
        got = list(f.frames_for(ids))
        assert [c for c, _ in got] == ids
        assert [frames.decode(frame, c) for c, frame in got] == [raw[c] for c in ids]
        assert reads_back == [], "a frame just fetched was read back from the disk cache"
        assert all(c in f.cache for c in ids), "what was fetched is cached for the next reader"
        assert (f.cache.hits, f.cache.misses) == (0, len(ids)), "each frame fetched counts as a miss of the cache"
        assert f.miss_bytes == sum(len(raw[c]) for c in ids) and f.hit_bytes == 0
        again = list(f.frames_for(ids))
        assert again == got and len(rec.ids()) == len(ids)
        assert sorted(reads_back) == sorted(ids), "a later request reads the cache's copies"
    finally:
        f.stop()
