"""Top-up hints (issue 18): a reader skipping forward through a directory, as ``rsync -a`` of a
new version onto the old one does, finds the files that changed topped up at the spoke.

``spoke.topup.top_up_ids`` is checked on its own; the rest runs real hub and spoke processes
on loopback, and a real mount of the spoke, and asserts what the spoke counts
(``GET /api/v1/stats``), never timings.
"""

from __future__ import annotations

import io
import os
import time

import pytest

from fabric.client.http import HttpPlane
from fabric.errors import NotFound
from fabric.format.chunking import chunk_id
from fabric.format.model import FILE, HOLE_ID, Entry
from spoke.topup import top_up_ids
from tests.hubserver import Hub, unique_name
from tests.spokeserver import random_bytes, start_spoke, wait_for

KiB = 1 << 10
pytestmark = pytest.mark.timeout(180)


def _entry(*chunks: tuple[bytes, int]) -> Entry:
    return Entry(FILE, sum(n for _, n in chunks), 0o644, 0, chunks=tuple(chunks))


def _id(name: str) -> bytes:
    return chunk_id(name.encode())


def test_only_what_is_lacking_of_files_held_in_part_is_fetched_within_the_limit() -> None:
    a, b, c, d, e, f = (_id(x) for x in "abcdef")
    held = {a, b, d}.__contains__
    files = [
        _entry((a, 10), (HOLE_ID, 99), (c, 20), (c, 20)),  # held in part: c once, the hole never
        _entry((b, 10), (d, 10)),  # held whole
        _entry((e, 30)),  # held not at all: left to the reader
        _entry((d, 10), (c, 20), (f, 40)),  # c already taken; f comes next
    ]
    assert top_up_ids(files, lambda es: [x.chunks for x in es], held, 1000) == ([c, f], 60)
    assert top_up_ids(files, lambda es: [x.chunks for x in es], held, 59) == ([c], 20)


def edited(data: bytes, seed: int) -> bytes:
    """``data`` with 4 KiB in its middle overwritten (a chunk or two change, the rest stay)."""
    mid = len(data) // 2
    return data[:mid] + random_bytes(4 * KiB, seed) + data[mid + 4 * KiB :]


def two_versions(hub: Hub, stem: str) -> tuple[str, dict[str, bytes], dict[str, bytes], str, str]:
    """A repository with commit v1 (files ``d/f00..f11`` and ``e/f00..f11``) and v2 (every third
    file edited, ``d/new`` added): ``(repo, v1 files, v2 files, v1 commit, v2 commit)``."""
    repo = unique_name(stem)
    plane = hub.plane()
    plane.create_repo(repo)
    v1 = {f"{d}/f{i:02d}": random_bytes(256 * KiB, 9000 + 20 * k + i) for k, d in enumerate("de") for i in range(12)}
    for path, data in v1.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    c1 = plane.commit(repo, "main", "v1").id
    v2 = {p: edited(data, 9100 + i) if i % 3 == 1 else data for i, (p, data) in enumerate(sorted(v1.items()))}
    v2["d/new"] = random_bytes(256 * KiB, 9200)
    for path in sorted(v2):
        if v2[path] != v1.get(path):
            plane.put_object(repo, "main", path, io.BytesIO(v2[path]))
    c2 = plane.commit(repo, "main", "v2").id
    return repo, v1, v2, c1, c2


def test_a_top_up_fetches_the_changed_chunks_of_files_held_in_part_and_nothing_else(hub: Hub, tmp_path) -> None:
    repo, v1, v2, c1, c2 = two_versions(hub, "topup")
    changed = [p for p in sorted(v2) if v2[p] != v1.get(p) and p in v1]
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as spoke:
        reader = HttpPlane(spoke.url, hub.token)
        for path in sorted(v1)[:9]:  # the spoke served v1 of these; f09..f11 never
            assert reader.read(repo, c1, path) == v1[path]
        with pytest.raises(NotFound, match="d/nope"):  # refused whole: d/f01 (held in part) is not fetched
            HttpPlane(spoke.url, hub.token).hint(repo, c2, ["d/f01", "d/nope"], "bad", top_up=True)
        answer = HttpPlane(spoke.url, hub.token).hint(repo, c2, sorted(v2), "sync", top_up=True)
        assert answer["paths"] == len(v2) and answer["window_bytes"] > 0
        read_before = [p for p in changed if p < "d/f09"]
        new_bytes = new_chunk_bytes(reader, repo, c1, c2, read_before)
        assert 0 < new_bytes < len(read_before) * 256 * KiB

        def prefetched() -> int:
            return spoke.stats()["jobs"].get("sync", {}).get("prefetch", {}).get("hint", {}).get("prefetched_bytes", 0)

        wait_for(lambda: prefetched() >= new_bytes, timeout=30)
        time.sleep(0.5)
        assert prefetched() == new_bytes  # not f09..f11 (never held), not d/new (held not at all)
        assert "bad" not in spoke.stats()["jobs"]

        syncing = HttpPlane(spoke.url, hub.token, job="rsync")
        for path in read_before:
            assert syncing.read(repo, c2, path) == v2[path]
        assert spoke.stats()["jobs"]["rsync"]["hit_ratio"] == 1.0


def test_a_hub_takes_a_top_up_and_fetches_nothing(hub: Hub) -> None:
    repo, _, v2, _, c2 = two_versions(hub, "topuphub")
    answer = hub.plane().hint(repo, c2, sorted(v2), "sync", top_up=True)
    assert answer["window_bytes"] == 0 and answer["paths"] == len(v2)
    http = HttpPlane(hub.url, hub.token)
    assert http.hint(repo, c2, sorted(v2), "sync", top_up=True)["window_bytes"] == 0


def new_chunk_bytes(plane: HttpPlane, repo: str, old: str, new: str, paths: list[str]) -> int:
    """The bytes of the chunks of ``paths`` at ``new`` that the same paths at ``old`` lack, of
    the files that keep some chunk (a top-up's rule: a file held not at all is left alone)."""
    had = {cid for p in paths for cid, _ in plane.stat_chunks(repo, old, p).chunks}
    fresh: dict[bytes, int] = {}
    for p in paths:
        chunks = plane.stat_chunks(repo, new, p).chunks
        if any(cid in had for cid, _ in chunks):
            fresh.update((cid, n) for cid, n in chunks if cid not in had)
    return sum(fresh.values())


def test_a_reader_skipping_through_a_mount_of_the_spoke_finds_the_changed_files_topped_up(hub: Hub, tmp_path) -> None:
    """What rsync does: walk the tree, then open only the edited files, in name order. From
    the second one on, the mount names the files ahead, in this directory and the next, in a
    top-up hint and the spoke fetches the new chunks of the edited files it holds in part; a
    new file (held not at all) is left to its open."""
    from tests.fuse_helpers import mounted

    repo, v1, v2, c1, c2 = two_versions(hub, "topupmount")
    edits = [p for p in sorted(v2) if p in v1 and v2[p] != v1[p]]  # d/f01, d/f04, ..., e/f10
    plane = hub.plane()
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as spoke:
        with mounted(spoke.url, hub.token, f"{repo}@{c1}", tmp_path / "m1") as m1:
            for path, data in v1.items():  # the spoke serves the old version whole
                assert open(os.path.join(m1, path), "rb").read() == data
        with mounted(spoke.url, hub.token, f"{repo}@{c2}", tmp_path / "m2") as m2:
            assert sum(len(names) for _, _, names in os.walk(m2)) == len(v2)  # rsync's walk lists every directory
            for path in edits[:2]:
                assert open(os.path.join(m2, path), "rb").read() == v2[path]

            def scan() -> dict:
                jobs = spoke.stats()["jobs"]
                found = [s for job, s in jobs.items() if job.startswith("mount-scan:")]
                return found[0]["prefetch"]["hint"] if found else {}

            ahead = new_chunk_bytes(plane, repo, c1, c2, edits[2:])
            assert new_chunk_bytes(plane, repo, c1, c2, [p for p in edits[2:] if p.startswith("e/")]) > 0
            wait_for(lambda: scan().get("prefetched_bytes", 0) >= ahead, timeout=30)
            time.sleep(0.5)
            assert scan()["prefetched_bytes"] == ahead  # not d/new, nor anything unchanged
            for path in edits[2:] + ["d/new"]:
                assert open(os.path.join(m2, path), "rb").read() == v2[path]
            assert scan()["used_bytes"] == ahead


def test_the_forward_count_grows_with_each_open_further_on_and_restarts_going_back() -> None:
    """The sibling order's count of forward opens: a scan with gaps counts up, going back
    starts again (a random reader seldom reaches two in a row for long)."""
    from fuse.namespace import SiblingOrder

    order = SiblingOrder([f"f{i:02d}" for i in range(20)])
    assert not order.opened("f01") and order.forward == 1
    assert not order.opened("f04") and order.forward == 2
    assert not order.opened("f00") and order.forward == 0
    assert not order.opened("f03") and order.forward == 1
    assert order.opened("f04") and order.forward == 2  # continued: the sibling readahead's case
