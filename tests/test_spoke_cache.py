"""The spoke's cache seen from outside: budget under concurrent readers, cyclic scans, corruption.

Real hub and spoke processes; the cache directory is inspected (and damaged) on disk.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from fabric.format import frames
from tests.hubserver import Hub, unique_name
from tests.spokeserver import (
    Spoke,
    commit_chunks,
    random_bytes,
    start_spoke,
    text_bytes,
)

MiB = 1 << 20

pytestmark = pytest.mark.timeout(300)


def upload(hub: Hub, repo: str, files: dict[str, bytes]) -> str:
    plane = hub.plane()
    plane.create_repo(repo)
    with ThreadPoolExecutor(4) as ex:
        list(
            ex.map(
                lambda kv: plane.put_object(repo, "main", kv[0], io.BytesIO(kv[1])),
                files.items(),
            )
        )
    return plane.commit(repo, "main", "data").id


def du_sb(path: str) -> int:
    """``du -sb``; a file removed while du walks makes it exit 1 but still print the total."""
    done = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    assert done.returncode in (0, 1) and done.stdout, done.stderr
    return int(done.stdout.split()[0])


def test_cache_budget_is_never_exceeded_under_concurrent_readers(
    hub: Hub, tmp_path
) -> None:
    budget = 16 * MiB
    files = {
        f"f{i:03d}.bin": random_bytes(MiB, 3000 + i) for i in range(48)
    }  # 3x the budget
    repo = unique_name("budget")
    commit = upload(hub, repo, files)
    with start_spoke(
        hub.url, tmp_path / "cache", str(budget), token=hub.token
    ) as spoke:
        stop = threading.Event()
        samples: list[
            tuple[int, int, int]
        ] = []  # (cache_bytes, cache files' bytes, du -sb of the cache dir)

        def sampler() -> None:
            n = 0
            while not stop.is_set():
                accounted = spoke.stats()["cache_bytes"]
                files_bytes = spoke.cache_disk_bytes()
                du = du_sb(spoke.cache) if n % 3 == 0 else 0
                samples.append((accounted, files_bytes, du))
                n += 1

        def reader(seed: int) -> None:
            plane = spoke.plane()
            order = sorted(files)
            random.Random(seed).shuffle(order)
            for path in order:
                assert b"".join(plane.read_stream(repo, commit, path)) == files[path]

        t = threading.Thread(target=sampler)
        t.start()
        try:
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(reader, range(8)))
        finally:
            stop.set()
            t.join()
        s = spoke.stats()
        print(
            f"\nbudget {budget}: {len(samples)} samples, max cache_bytes {max(x[0] for x in samples)}, "
            f"max cache files {max(x[1] for x in samples)}, max du -sb {max(x[2] for x in samples)}, "
            f"evictions {s['cache_evictions']}"
        )
        assert len(samples) >= 10
        assert s["cache_budget_bytes"] == budget
        assert s["cache_evictions"] > 0
        for accounted, files_bytes, du in samples:
            assert accounted <= budget
            assert files_bytes <= budget
            assert du <= budget, (
                "du -sb of the whole cache directory (directories and write-back queue included)"
            )
        assert s["cache_bytes"] == spoke.cache_disk_bytes(), (
            "every cached byte is a file the cache knows, and no more"
        )


@pytest.mark.slow
def test_cyclic_scan_of_a_dataset_larger_than_the_cache_keeps_hitting(
    hub: Hub, tmp_path
) -> None:
    cache_size = 32 * MiB
    files = {
        f"e{i:03d}.bin": random_bytes(MiB, 4000 + i) for i in range(48)
    }  # 1.5x the cache
    dataset = sum(len(d) for d in files.values())
    repo = unique_name("cyclic")
    commit = upload(hub, repo, files)
    with start_spoke(
        hub.url, tmp_path / "cache", str(cache_size), token=hub.token
    ) as spoke:
        plane = spoke.plane()
        ratios = []
        for _ in range(4):
            s0 = spoke.stats()
            for path in sorted(files):
                assert b"".join(plane.read_stream(repo, commit, path)) == files[path]
            s1 = spoke.stats()
            hit = s1["cache_hit_bytes"] - s0["cache_hit_bytes"]
            miss = s1["cache_miss_bytes"] - s0["cache_miss_bytes"]
            ratios.append(hit / (hit + miss))
        target = 0.8 * cache_size / dataset
        print(
            f"\ncyclic scan, dataset 1.5x the cache: hit ratio per epoch {[round(r, 3) for r in ratios]} (needed {target:.3f})"
        )
        assert ratios[0] == 0
        for r in ratios[1:]:
            assert r >= target


# -- corruption --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corrupt_spoke(
    hub: Hub, tmp_path_factory
) -> Iterator[tuple[Spoke, str, str, dict[str, bytes], dict[str, list[bytes]]]]:
    files = {"a.bin": random_bytes(2 * MiB, 71), "b.txt": text_bytes(2 * MiB, 72)}
    repo = unique_name("corrupt")
    commit = upload(hub, repo, files)
    chunks = commit_chunks(hub.plane(), repo, commit)
    # Nothing kept in memory: every read goes to the disk copies these tests damage (with
    # memory on, a damaged copy is met on the first read after a restart, see below).
    with start_spoke(
        hub.url, tmp_path_factory.mktemp("corrupt") / "cache", "256MiB", token=hub.token, args=["--memory-cache", "0"]
    ) as spoke:
        yield spoke, repo, commit, files, chunks


@pytest.fixture
def corrupt_setup(corrupt_spoke):
    """The module's spoke with every file read (so every chunk is cached, good or repaired) before a test."""
    spoke, repo, commit, files, _ = corrupt_spoke
    plane = spoke.plane()
    for path, data in files.items():
        assert b"".join(plane.read_stream(repo, commit, path)) == data
    return corrupt_spoke


def chunk_file(spoke: Spoke, cid: bytes) -> str:
    h = cid.hex()
    return os.path.join(spoke.cache, "chunks", h[:2], h)


def flip(path: str, at: float = 0.5) -> None:
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        pos = int(size * at)
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_flipped_byte_in_a_cached_chunk_is_detected_refetched_and_counted(
    corrupt_setup,
) -> None:
    spoke, repo, commit, files, chunks = corrupt_setup
    victims = [chunks["a.bin"][1], chunks["a.bin"][-1], chunks["b.txt"][2]]
    for cid in victims:
        assert os.path.exists(chunk_file(spoke, cid))
        flip(chunk_file(spoke, cid))
    s0 = spoke.stats()
    plane = spoke.plane()
    for path, data in files.items():
        got = b"".join(plane.read_stream(repo, commit, path))
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), (
            "corrupt bytes were served"
        )
    s1 = spoke.stats()
    print(
        f"\nflipped bytes: corruptions +{s1['cache_corruptions'] - s0['cache_corruptions']}, refetched +{s1['cache_refetched'] - s0['cache_refetched']}"
    )
    assert s1["cache_corruptions"] - s0["cache_corruptions"] == len(victims)
    assert s1["cache_refetched"] - s0["cache_refetched"] == len(victims)
    assert s1["upstream_bytes_received_demand"] > s0.get(
        "upstream_bytes_received_demand", 0
    )
    # The refetched frames are good again: the next read hits the cache for everything.
    for path, data in files.items():
        assert b"".join(plane.read_stream(repo, commit, path)) == data
    s2 = spoke.stats()
    assert s2["cache_corruptions"] == s1["cache_corruptions"]
    assert s2["cache_miss_bytes"] == s1["cache_miss_bytes"]


def test_a_valid_frame_of_another_chunk_is_caught_by_the_id_check(
    corrupt_setup,
) -> None:
    """A frame whose checksum is fine but whose content is another chunk's: caught by the id, never served."""
    spoke, repo, commit, files, chunks = corrupt_setup
    a, b = chunks["b.txt"][1], chunks["b.txt"][3]
    with open(chunk_file(spoke, b), "rb") as f:
        other = f.read()
    with open(chunk_file(spoke, a), "wb") as f:
        f.write(other)
    s0 = spoke.stats()
    plane = spoke.plane()
    assert b"".join(plane.read_stream(repo, commit, "b.txt")) == files["b.txt"]
    s1 = spoke.stats()
    assert s1["cache_corruptions"] - s0["cache_corruptions"] == 1
    assert s1["cache_refetched"] - s0["cache_refetched"] == 1


def test_fsck_on_the_spoke_finds_and_drops_corrupt_chunks(corrupt_setup) -> None:
    spoke, repo, commit, files, chunks = corrupt_setup
    victim = chunks["a.bin"][0]
    flip(chunk_file(spoke, victim))
    with spoke.client() as c:
        report = c.post("/api/v1/admin/fsck").json()
    assert report["ok"] is False
    assert any(victim.hex() in p for p in report["problems"])
    assert not os.path.exists(chunk_file(spoke, victim))
    assert b"".join(spoke.plane().read_stream(repo, commit, "a.bin")) == files["a.bin"]


def test_corrupt_metadata_in_the_cache_is_refetched_not_an_error(corrupt_setup) -> None:
    """Every cached metadata object (commit, ranges) damaged on disk; after a restart reads still work."""
    spoke, repo, commit, files, _ = corrupt_setup
    meta_files = [
        os.path.join(d, n)
        for d, _, names in os.walk(os.path.join(spoke.cache, "meta"))
        for n in names
    ]
    assert meta_files
    for path in meta_files:
        flip(path, at=0.7)
    spoke.restart(kill=True)  # nothing decoded is left in memory
    plane = spoke.plane()
    for path, data in files.items():
        assert b"".join(plane.read_stream(repo, commit, path)) == data
    assert spoke.stats()["cache_corruptions"] >= 1


def test_warm_reads_skip_the_disk_copy_and_a_damaged_one_is_caught_after_a_restart(hub: Hub, tmp_path) -> None:
    """With the default memory cache a warm read never rereads or rehashes the chunk file;
    what guards the disk copy is the checksum on every read of it: the first after a restart."""
    files = {"w.bin": random_bytes(2 * MiB, 4200)}
    repo = unique_name("warm")
    commit = upload(hub, repo, files)
    victims = commit_chunks(hub.plane(), repo, commit)["w.bin"][:3]
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as spoke:
        plane = spoke.plane()
        assert b"".join(plane.read_stream(repo, commit, "w.bin")) == files["w.bin"]
        for cid in victims:
            flip(chunk_file(spoke, cid))
        s0 = spoke.stats()
        assert b"".join(plane.read_stream(repo, commit, "w.bin")) == files["w.bin"]
        s1 = spoke.stats()
        assert s1["cache_corruptions"] == s0["cache_corruptions"], "a warm read went to the disk copy"
        assert s1["cache_hit_bytes"] - s0["cache_hit_bytes"] == len(files["w.bin"])
        spoke.restart(kill=True)
        plane = spoke.plane()
        assert b"".join(plane.read_stream(repo, commit, "w.bin")) == files["w.bin"]
        s2 = spoke.stats()
        assert s2["cache_corruptions"] == len(victims) and s2["cache_refetched"] == len(victims)


def test_frames_evicted_before_they_are_sent_are_still_served(hub: Hub, tmp_path) -> None:
    """Readers that fetch more at once than the cache's admission window holds (here 2 MiB
    caches, 0.2 MiB of window, 4 readers of 6 MiB files through ``/chunks/frames``) get every
    frame: one evicted between its fetch and its turn to be sent is served from the bytes the
    request holds, not refused."""
    files = {f"f{i}.bin": random_bytes(6 * MiB, 4100 + i) for i in range(4)}
    repo = unique_name("evicted")
    upload(hub, repo, files)
    with start_spoke(hub.url, tmp_path / "cache", str(2 * MiB), token=hub.token) as spoke:

        def read_by_frames(path: str) -> bytes:
            plane = spoke.plane()
            entry = plane.stat_chunks(repo, "main", path)
            ids = [cid for cid, _ in entry.chunks]
            got = dict(plane.frames(ids, repo=repo))
            return b"".join(frames.decode(got[cid], cid) for cid in ids)

        with ThreadPoolExecutor(4) as ex:
            for path, data in zip(files, ex.map(read_by_frames, files)):
                assert hashlib.sha256(data).digest() == hashlib.sha256(files[path]).digest(), path
        assert spoke.stats()["cache_bytes"] <= 2 * MiB
