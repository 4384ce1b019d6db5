"""Sibling readahead: a reader going through a directory's files one after another (``cp -r``,
``tar``, a training loop over sorted names) finds the next files' chunks already fetched.

GNU ``cp -r`` reads a directory's entries sorted by inode number, which in a mount is a
hash of the path: neither name order nor listing order. Counted at the mount: the frames
requests it sent, which without readahead are one (or more) per file.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from fabric.client.transfer import import_directory
from fuse.mount import read_stats
from fuse.read_path import SIBLINGS_BYTES
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import unique_name

KIB = 1024
#: Directory "a" is larger than the readahead window (16 MiB), "b" a small one.
FILES, SIZE = 64, 640 * KIB
FEW, SMALL = 24, 96 * KIB


@pytest.fixture(scope="module")
def directory_commit(hub, tmp_path_factory):
    src = tmp_path_factory.mktemp("siblings") / "tree"
    rnd = random.Random(14)
    data = {}
    for d, count, size in (("a", FILES, SIZE), ("b", FEW, SMALL)):
        os.makedirs(src / d)
        for i in range(count):
            data[f"{d}/f{i:03d}.bin"] = content = rnd.randbytes(size)
            (src / d / f"f{i:03d}.bin").write_bytes(content)
    repo = unique_name("siblings")
    plane = hub.plane()
    plane.create_repo(repo)
    commit = import_directory(plane, str(src), repo, "main", "many files").commit.id
    return hub, repo, commit, data


def _frame_requests(mp: str, at_least_bytes: int) -> int:
    """The mount's frames requests, once its stats (written every second) show the bytes read."""
    deadline = time.monotonic() + 15
    while True:
        try:
            stats = read_stats(mp)
        except FileNotFoundError:  # not written yet
            stats = {"fetched_bytes": 0}
        if stats["fetched_bytes"] >= at_least_bytes:
            return stats["frame_requests"]
        assert time.monotonic() < deadline, f"the mount's stats never showed {at_least_bytes} bytes fetched"
        time.sleep(0.2)


def _read_in_order(mp: str, d: str, order: str, data: dict[str, bytes]) -> None:
    entries = list(os.scandir(os.path.join(mp, d)))
    key = (lambda e: e.inode()) if order == "inode" else (lambda e: e.name)
    for e in sorted(entries, key=key):
        with open(e.path, "rb") as f:
            assert f.read() == data[f"{d}/{e.name}"]


@needs_fuse
@pytest.mark.parametrize("order", ["inode", "name"])
def test_files_read_in_inode_or_name_order_are_fetched_ahead(directory_commit, tmp_path, order):
    hub, repo, commit, data = directory_commit
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "m") as mp:
        inodes = sorted(e.inode() for e in os.scandir(os.path.join(mp, "a")))
        names_by_inode = [e.name for e in sorted(os.scandir(os.path.join(mp, "a")), key=lambda e: e.inode())]
        assert names_by_inode != sorted(names_by_inode) and len(set(inodes)) == FILES  # the orders differ
        _read_in_order(mp, "a", order, data)
        requests = _frame_requests(mp, FILES * SIZE)
    # One request per file without readahead; with it, the first three files and then
    # batches of 4 MiB for the other 61 (38 MiB).
    assert requests <= FILES // 4, f"{requests} frames requests for {FILES} files read in {order} order"


@needs_fuse
def test_a_scan_in_one_order_is_not_taken_for_the_other(directory_commit, tmp_path):
    """Random opens fetch nothing ahead; a later inode-order scan still gets readahead."""
    hub, repo, commit, data = directory_commit
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "m") as mp:
        names = sorted(os.listdir(os.path.join(mp, "b")))
        random.Random(3).shuffle(names)
        for name in names[:12]:
            with open(os.path.join(mp, "b", name), "rb") as f:
                assert f.read() == data[f"b/{name}"]
        random_requests = _frame_requests(mp, 12 * SMALL)
        time.sleep(1.5)  # anything fetched ahead would show by the next stats
        assert read_stats(mp)["fetched_bytes"] <= 14 * SMALL, "random opens were taken for a scan and fetched ahead"
        _read_in_order(mp, "a", "inode", data)
        scan_requests = _frame_requests(mp, 12 * SMALL + FILES * SIZE) - random_requests
    assert scan_requests <= FILES // 4


@needs_fuse
def test_the_window_grows_while_the_reader_catches_up_with_it(directory_commit, tmp_path):
    """Over a link with a round trip of 60 ms, a reader going through "a" (40 MiB) opens files
    whose chunks are still on their way: the window doubles (the mount's stats show it); random
    opens do not grow it."""
    hub, repo, commit, data = directory_commit
    with WanProxy("127.0.0.1", int(hub.url.rsplit(":", 1)[1]), delay_ms_up=30, delay_ms_down=30, rate_mbit=400) as link:
        with mounted(link.url_for(), hub.token, f"{repo}@{commit}", tmp_path / "m") as mp:
            names = sorted(os.listdir(os.path.join(mp, "b")))
            random.Random(5).shuffle(names)
            for name in names[:12]:
                with open(os.path.join(mp, "b", name), "rb") as f:
                    assert f.read() == data[f"b/{name}"]
            _frame_requests(mp, 12 * SMALL)
            assert read_stats(mp)["siblings_window_bytes"] == SIBLINGS_BYTES
            _read_in_order(mp, "a", "name", data)
            _frame_requests(mp, 12 * SMALL + FILES * SIZE)
            assert read_stats(mp)["siblings_window_bytes"] > SIBLINGS_BYTES
