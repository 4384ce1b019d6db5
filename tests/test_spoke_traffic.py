"""Bytes and round trips between a spoke and its hub (real hub and spoke processes on loopback).

Every figure comes from the spoke's own accounting (``GET /api/v1/stats``:
``upstream_bytes_*``, ``upstream_requests``); expected sizes come from the
hub (the stored frames of the chunks involved).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fabric.format.model import FILE, Entry
from tests.hubserver import Hub, hub_env, unique_name
from tests.spokeserver import (
    ROOT,
    Spoke,
    commit_chunks,
    frame_bytes,
    random_bytes,
    start_spoke,
    text_bytes,
)

MiB = 1 << 20

pytestmark = pytest.mark.timeout(300)


def delta(after: dict, before: dict, key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def chunk_bytes(after: dict, before: dict) -> int:
    """Chunk bytes received (demand and prefetch) between two stats snapshots."""
    return delta(after, before, "upstream_bytes_received_demand") + delta(
        after, before, "upstream_bytes_received_prefetch"
    )


def read_all(spoke: Spoke, repo: str, ref: str, expected: dict[str, bytes]) -> None:
    """List ``repo@ref`` through the spoke and read every file; each must equal ``expected``."""
    plane = spoke.plane()
    seen = []
    after = ""
    while True:
        page = plane.list(repo, ref, after=after, limit=1000)
        for path, _ in page.entries:
            data = b"".join(plane.read_stream(repo, ref, path))
            assert (
                hashlib.sha256(data).digest() == hashlib.sha256(expected[path]).digest()
            ), path
            seen.append(path)
        if not page.next_after:
            break
        after = page.next_after
    assert sorted(seen) == sorted(expected)


# -- a dataset in two versions ---------------------------------------------------------
class Versions:
    repo: str
    v1: str
    v2: str
    files_v1: dict[str, bytes]
    files_v2: dict[str, bytes]
    frames_v1: int  # stored bytes of every chunk of v1
    frames_new_in_v2: int  # stored bytes of the chunks v2 has and v1 lacks


@pytest.fixture(scope="module")
def versions(hub: Hub) -> Versions:
    """v1: 40 x 1 MiB random + 20 x 1 MiB text; v2: 10 edited in the middle, 5 new, 3 renamed, 3 duplicated."""
    v = Versions()
    plane = hub.plane()
    v.repo = unique_name("traffic")
    plane.create_repo(v.repo)
    files = {f"random/r{i:02d}.bin": random_bytes(MiB, 100 + i) for i in range(40)}
    files.update({f"text/t{i:02d}.txt": text_bytes(MiB, 200 + i) for i in range(20)})
    for path, data in files.items():
        plane.put_object(v.repo, "main", path, io.BytesIO(data))
    v.v1 = plane.commit(v.repo, "main", "v1").id
    v.files_v1 = dict(files)

    v2 = dict(files)
    edited = [f"random/r{i:02d}.bin" for i in range(5)] + [
        f"text/t{i:02d}.txt" for i in range(5)
    ]
    for n, path in enumerate(edited):
        old = v2[path]
        mid = len(old) // 2
        patch = (
            random_bytes(4096, 300 + n)
            if path.startswith("random")
            else text_bytes(4096, 300 + n)
        )
        v2[path] = old[:mid] + patch + old[mid + 4096 :]
    for i in range(5):
        v2[f"new/n{i}.bin"] = (
            random_bytes(MiB, 400 + i) if i < 3 else text_bytes(MiB, 400 + i)
        )
    for old_path, new_path in (
        ("random/r10.bin", "moved/r10.bin"),
        ("random/r11.bin", "moved/r11.bin"),
        ("text/t10.txt", "moved/t10.txt"),
    ):
        v2[new_path] = v2.pop(old_path)
        plane.delete_object(v.repo, "main", old_path)
    for src in ("random/r20.bin", "random/r21.bin", "text/t11.txt"):
        v2["copies/" + src.split("/")[1]] = v2[src]
    for path, data in v2.items():
        if files.get(path) != data:
            plane.put_object(v.repo, "main", path, io.BytesIO(data))
    v.v2 = plane.commit(v.repo, "main", "v2").id
    v.files_v2 = v2

    chunks_v1 = {c for ids in commit_chunks(plane, v.repo, v.v1).values() for c in ids}
    chunks_v2 = {c for ids in commit_chunks(plane, v.repo, v.v2).values() for c in ids}
    v.frames_v1 = frame_bytes(plane, chunks_v1)
    v.frames_new_in_v2 = frame_bytes(plane, chunks_v2 - chunks_v1)
    assert 0 < v.frames_new_in_v2 < v.frames_v1 / 5
    return v


@pytest.fixture
def cold_spoke(cold_spoke_of_hub: Spoke) -> Spoke:
    return cold_spoke_of_hub


def test_cold_read_of_v1_moves_its_compressed_size_and_a_second_read_moves_no_chunks(
    cold_spoke: Spoke, versions: Versions
) -> None:
    s0 = cold_spoke.stats()
    read_all(cold_spoke, versions.repo, versions.v1, versions.files_v1)
    s1 = cold_spoke.stats()
    received = delta(s1, s0, "upstream_bytes_received")
    ratio = received / versions.frames_v1
    print(
        f"\nv1 cold read: {received} bytes received (chunks {chunk_bytes(s1, s0)}, "
        f"metadata {delta(s1, s0, 'upstream_bytes_received_metadata')}), v1 frames {versions.frames_v1}, ratio {ratio:.4f}"
    )
    assert ratio <= 1.05, (
        f"a cold read of v1 moved {ratio:.3f}x the compressed size of its chunks"
    )
    assert delta(s1, s0, "cache_miss_bytes") == sum(
        len(d) for d in versions.files_v1.values()
    )

    read_all(cold_spoke, versions.repo, versions.v1, versions.files_v1)
    s2 = cold_spoke.stats()
    print(
        f"v1 second read: {chunk_bytes(s2, s1)} chunk bytes, {delta(s2, s1, 'upstream_bytes_received')} bytes in all"
    )
    assert chunk_bytes(s2, s1) == 0
    assert delta(s2, s1, "cache_miss_bytes") == 0
    assert delta(s2, s1, "cache_hit_bytes") == sum(
        len(d) for d in versions.files_v1.values()
    )


def test_reading_v2_with_v1_cached_moves_only_the_new_chunks(
    cold_spoke: Spoke, versions: Versions
) -> None:
    read_all(cold_spoke, versions.repo, versions.v1, versions.files_v1)
    s0 = cold_spoke.stats()
    read_all(cold_spoke, versions.repo, versions.v2, versions.files_v2)
    s1 = cold_spoke.stats()
    received = delta(s1, s0, "upstream_bytes_received")
    ratio = received / versions.frames_new_in_v2
    print(
        f"\nv2 with v1 cached: {received} bytes received (chunks {chunk_bytes(s1, s0)}), "
        f"new chunks' frames {versions.frames_new_in_v2}, ratio {ratio:.4f}"
    )
    assert ratio <= 1.1, (
        f"reading v2 moved {ratio:.3f}x the compressed bytes of the chunks v1 lacked"
    )


@pytest.mark.slow
def test_listing_a_100k_file_directory_through_a_cold_spoke_takes_few_round_trips(
    hub: Hub, cold_spoke: Spoke
) -> None:
    plane = hub.plane()
    repo = unique_name("wide")
    plane.create_repo(repo)
    names = [f"big/f{i:06d}" for i in range(100_000)]
    commit = plane.commit_changes(
        repo, "main", {p: Entry(FILE, 0, 0o644, 0) for p in names}, "100k files"
    ).id

    s0 = cold_spoke.stats()
    listed: list[str] = []
    after = ""
    spoke = cold_spoke.plane()
    while True:
        page = spoke.list(repo, commit, prefix="big/", after=after, limit=10_000)
        listed.extend(p for p, _ in page.entries)
        if not page.next_after:
            break
        after = page.next_after
    s1 = cold_spoke.stats()
    trips = delta(s1, s0, "upstream_requests")
    print(
        f"\n100k listing: {trips} upstream requests, {delta(s1, s0, 'upstream_bytes_received')} bytes received"
    )
    assert listed == names
    assert trips < 50, (
        f"listing 100,000 files through a cold spoke took {trips} round trips to the hub"
    )


def test_cold_read_of_a_64_mib_file_is_fetched_in_coalesced_batches(
    hub: Hub, cold_spoke: Spoke
) -> None:
    plane = hub.plane()
    repo = unique_name("big")
    plane.create_repo(repo)
    data = random_bytes(64 * MiB, 7)
    plane.put_object(repo, "main", "huge.bin", io.BytesIO(data))
    commit = plane.commit(repo, "main", "64 MiB").id
    chunks = commit_chunks(plane, repo, commit)["huge.bin"]
    frames = frame_bytes(plane, chunks)

    s0 = cold_spoke.stats()
    got = b"".join(cold_spoke.plane().read_stream(repo, commit, "huge.bin"))
    s1 = cold_spoke.stats()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    trips = delta(s1, s0, "upstream_requests")
    received = delta(s1, s0, "upstream_bytes_received")
    print(
        f"\n64 MiB cold read: {len(chunks)} chunks, {trips} upstream requests, {received / frames:.4f}x its frames"
    )
    assert received <= 1.02 * frames
    # Coalesced: on average at least 48 chunks (~3 MiB) per request, never one request per chunk.
    assert trips <= len(chunks) / 48 + 4, (
        f"{trips} upstream requests for {len(chunks)} chunks"
    )


# -- writes through the spoke --------------------------------------------------------------
@pytest.fixture(scope="module")
def write_spoke(hub: Hub, tmp_path_factory) -> Iterator[Spoke]:
    with start_spoke(
        hub.url, tmp_path_factory.mktemp("wspoke") / "cache", "512MiB", token=hub.token
    ) as spoke:
        yield spoke


@pytest.mark.parametrize("durability", ["hub", "local"])
def test_writes_through_the_spoke_are_read_your_writes(
    hub: Hub, write_spoke: Spoke, durability: str
) -> None:
    repo = unique_name("ryw")
    hub.plane().create_repo(repo)
    spoke = write_spoke.plane()
    with write_spoke.client() as c:
        r = c.get(
            f"/api/v1/repos/{repo}/refs/main/list"
        )  # the spoke knows the branch before the writes
        assert r.status_code == 200
    for i in range(5):
        data = random_bytes(300_000 + i, 900 + i)
        spoke.put_object(
            repo, "main", f"w/{i}.bin", io.BytesIO(data), durability=durability
        )
        assert b"".join(spoke.read_stream(repo, "main", f"w/{i}.bin")) == data
        assert spoke.stat(repo, "main", f"w/{i}.bin").size == len(data)
        # Overwrite: the newest write wins at once.
        spoke.put_object(
            repo,
            "main",
            f"w/{i}.bin",
            io.BytesIO(b"second " + data[:10]),
            durability=durability,
        )
        assert (
            b"".join(spoke.read_stream(repo, "main", f"w/{i}.bin"))
            == b"second " + data[:10]
        )
    listed = [p for p, _ in spoke.list(repo, "main", prefix="w/").entries]
    assert listed == [f"w/{i}.bin" for i in range(5)]
    # And they reach the hub's staging area (at once for hub durability, after the flush for local).
    from tests.spokeserver import wait_for

    wait_for(lambda: write_spoke.stats()["writeback_pending"] == 0, timeout=30)
    hub_plane = hub.plane()
    assert sorted(c.path for c in hub_plane.uncommitted(repo, "main")) == listed
    assert (
        b"".join(hub_plane.read_stream(repo, "main", "w/3.bin"))
        == b"second " + random_bytes(300_003, 903)[:10]
    )


def test_only_missing_chunks_cross_to_the_hub(hub: Hub, write_spoke: Spoke) -> None:
    repo = unique_name("push")
    hub.plane().create_repo(repo)
    data = random_bytes(8 * MiB, 11)
    hub.plane().put_object(
        repo, "main", "at-hub.bin", io.BytesIO(data)
    )  # the hub has every chunk already
    spoke = write_spoke.plane()

    s0 = write_spoke.stats()
    spoke.put_object(repo, "main", "again.bin", io.BytesIO(data), durability="hub")
    s1 = write_spoke.stats()
    sent = delta(s1, s0, "upstream_bytes_sent_push")
    print(
        f"\nre-upload of 8 MiB the hub has: {sent} bytes pushed ({sent / len(data):.4f} of the file)"
    )
    assert sent < 0.02 * len(data), (
        f"{sent} bytes went to the hub for a file it already had"
    )

    fresh = random_bytes(8 * MiB, 12)
    spoke.put_object(repo, "main", "fresh.bin", io.BytesIO(fresh), durability="hub")
    s2 = write_spoke.stats()
    sent_fresh = delta(s2, s1, "upstream_bytes_sent_push")
    print(
        f"upload of 8 new MiB: {sent_fresh} bytes pushed ({sent_fresh / len(fresh):.4f})"
    )
    assert len(fresh) <= sent_fresh <= 1.03 * len(fresh)
    assert b"".join(hub.plane().read_stream(repo, "main", "again.bin")) == data
    assert b"".join(hub.plane().read_stream(repo, "main", "fresh.bin")) == fresh


def test_fabric_stats_json_on_a_spoke(hub: Hub, write_spoke: Spoke) -> None:
    """``fabric stats --server SPOKE --json`` reports the upstream and cache figures."""
    import json

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabric.cli.main",
            "--server",
            write_spoke.url,
            "--token",
            hub.token,
            "--json",
            "stats",
        ],
        capture_output=True,
        check=False,
        env=hub_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    stats = json.loads(proc.stdout)
    for key in (
        "upstream_bytes_received",
        "upstream_bytes_sent",
        "cache_bytes",
        "cache_hit_bytes",
        "cache_miss_bytes",
        "upstream_requests",
    ):
        assert isinstance(stats[key], int), key
