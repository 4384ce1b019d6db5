"""A mount beside its spoke reading the spoke's cache files (``--spoke-cache``, fabric/client/spoke_files.py):
a real hub, spoke and mounts; the mount's traffic to the spoke goes through a counting proxy."""

from __future__ import annotations

import hashlib
import os

import pytest

from fabric.client.transfer import import_directory
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import fabric, mounted, needs_fuse
from tests.hubserver import unique_name
from tests.spokeserver import start_spoke

pytestmark = [needs_fuse, pytest.mark.timeout(300)]

MiB = 1 << 20


def digests(root: str, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            out[name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def test_a_mount_reads_a_warm_spokes_chunks_from_its_files_and_asks_for_what_they_lack(hub, tmp_path) -> None:
    plane = hub.plane()
    repo = unique_name("spokefiles")
    plane.create_repo(repo)
    src = tmp_path / "src"
    src.mkdir()
    # The third file in a directory of its own: the warm mount's sibling readahead, which
    # fetches the next files of a directory read in order, must not bring it to the spoke.
    files = {name: os.urandom(6 * MiB + i * 4099) for i, name in enumerate(("f0.bin", "f1.bin", "later/f2.bin"))}
    (src / "later").mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    commit = import_directory(plane, str(src), repo, "main", "data").commit.id
    want = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    names = sorted(files)
    cache = tmp_path / "spoke-cache"
    with start_spoke(hub.url, cache, "512MiB", token=hub.token) as spoke:
        with WanProxy("127.0.0.1", int(spoke.url.rsplit(":", 1)[1])) as link:
            # The spoke reads the first two files once (warm); the third stays at the hub.
            with mounted(spoke.url, hub.token, f"{repo}@{commit}", tmp_path / "warm") as mnt:
                assert digests(mnt, names[:2]) == {n: want[n] for n in names[:2]}
            opts = ("--spoke-cache", str(cache), "--memory-cache", "8M")
            before = link.stats().bytes_down
            reported = spoke.stats()["cache_local_reads"]
            with mounted(link.url_for(), hub.token, f"{repo}@{commit}", tmp_path / "beside", *opts) as mnt:
                assert digests(mnt, names[:2]) == {n: want[n] for n in names[:2]}
                warm = link.stats().bytes_down - before
                assert warm < MiB, f"{warm} bytes came over HTTP for chunks the spoke's files hold"
                assert digests(mnt, names[2:]) == {names[2]: want[names[2]]}  # from the spoke, over HTTP
                assert link.stats().bytes_down - before - warm >= len(files[names[2]])
            # The spoke heard of the chunks read from its files (the rest by unmount).
            chunks = sum(len(plane.stat_chunks(repo, commit, n).chunks) for n in names[:2])
            assert spoke.stats()["cache_local_reads"] - reported >= chunks

            # A damaged file of the spoke's: the chunk comes over HTTP, right.
            frame = max((p for p in (cache / "chunks").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
            raw = bytearray(frame.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            frame.write_bytes(raw)
            before = link.stats().bytes_down
            with mounted(link.url_for(), hub.token, f"{repo}@{commit}", tmp_path / "damaged", *opts) as mnt:
                assert digests(mnt, names) == want
            assert link.stats().bytes_down - before >= len(raw) - 64  # at least that chunk, over HTTP
            assert "not read from the spoke's cache files" in (tmp_path / "damaged.mount.log").read_text()


def test_a_directory_that_is_not_a_spokes_cache_is_refused(hub, tmp_path) -> None:
    plane = hub.plane()
    repo = unique_name("spokefiles")
    plane.create_repo(repo)
    (tmp_path / "mnt").mkdir()
    proc = fabric("mount", hub.url, f"{repo}@main", str(tmp_path / "mnt"), "--spoke-cache", str(tmp_path), token=hub.token, check=False)
    assert proc.returncode != 0
    assert "is not a spoke's cache directory" in proc.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def test_reports_of_local_reads_are_checked_and_need_read_access(hub, tmp_path) -> None:
    plane = hub.plane()
    mine, other = unique_name("spokefiles"), unique_name("spokefiles")
    for repo in (mine, other):
        plane.create_repo(repo)
    reader = plane.create_token("reader-of-mine", roles={mine: "read"})["token"]
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as spoke, spoke.client(reader) as c:
        before = spoke.stats()["cache_local_reads"]
        ids = [os.urandom(32).hex() for _ in range(3)]
        assert c.post(f"/api/v1/repos/{mine}/cache/local-reads", json={"ids": ids}).status_code == 204
        assert c.post(f"/api/v1/repos/{other}/cache/local-reads", json={"ids": ids}).status_code == 403
        for bad in ({"ids": ["zz" * 32]}, {"ids": ["ab" * 31]}, {"ids": "ab"}, {"ids": ["ab" * 32] * 4097}):
            r = c.post(f"/api/v1/repos/{mine}/cache/local-reads", json=bad)
            assert r.status_code in (400, 413), (bad if len(str(bad)) < 100 else "4097 ids", r.status_code, r.text)
        assert spoke.stats()["cache_local_reads"] == before + 3  # only the good report counted


def test_a_server_without_the_route_is_not_told_again(hub) -> None:
    from fabric.client.http import HttpPlane
    from fabric.client.local_reads import LocalReadReports

    reports = LocalReadReports(HttpPlane(hub.url, hub.token), "any")
    reports.read(os.urandom(32))
    reports.close()  # sends what gathered: a hub answers 404
    assert reports._useless
