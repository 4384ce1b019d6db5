"""``fabric://`` with ``copies=DIR`` (issue 16, restore on the machine that saved a checkpoint):
a file written through it leaves a plain copy of its version in DIR, and an open for reading of
that version reads the copy from the local disk, checked as a passthrough mount checks its
copies (fabric/client/copies.py, fabric/cache/files.py)."""

from __future__ import annotations

import io
import multiprocessing
import os
import time

import pytest

from fabric.cache.files import CHECKED_XATTR, FILES, INCOMING
from fabric.client.copies import seeder
from fabric.fsspec.files import FabricReadFile
from tests.hubserver import Hub, metric_value
from tests.test_corruption import flip
from tests.test_fsspec import new_fs

MIB = 1024 * 1024


def _copies(root: str) -> list[str]:
    """The copies placed under ``root`` (not those on their way)."""
    top = os.path.join(root, FILES)
    if not os.path.isdir(top):
        return []
    return sorted(os.path.join(top, d, n) for d in os.listdir(top) if d != INCOMING for n in os.listdir(os.path.join(top, d)))


def _until_copies(root: str, count: int) -> list[str]:
    deadline = time.monotonic() + 20
    while len(found := _copies(root)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_a_file_written_leaves_a_copy_that_reads_of_its_version_take(hub: Hub, tmp_path) -> None:
    repo, copies = hub.new_repo("copies"), str(tmp_path / "copies")
    big, small = os.urandom(9 * MIB + 5), os.urandom(300_000)
    writer = new_fs(hub.url, hub.token, copies=copies, commit="save")
    with writer.open(f"{repo}/ckpt/shard.bin", "wb") as f:
        for i in range(0, len(big), MIB):
            f.write(big[i : i + MIB])
    writer.pipe_file(f"{repo}/ckpt/meta.json", small)  # (under 1 MiB: never copied)
    [copy] = _until_copies(copies, 1)
    assert os.path.getsize(copy) == len(big) and os.listdir(os.path.join(copies, FILES, INCOMING)) == []

    reader = new_fs(hub.url, hub.token, copies=copies)
    with reader.open(f"{repo}/ckpt/shard.bin", "rb") as f:
        assert isinstance(f, io.BufferedReader)  # the local copy, not chunks from the server
        f.seek(4 * MIB - 3)
        assert f.read(10) == big[4 * MIB - 3 : 4 * MIB + 7]
        f.seek(0)
        assert f.read() == big
    with reader.open(f"{repo}/ckpt/meta.json", "rb") as f:
        assert isinstance(f, FabricReadFile) and f.read() == small
    with new_fs(hub.url, hub.token).open(f"{repo}/ckpt/shard.bin", "rb") as f:
        assert isinstance(f, FabricReadFile)  # without copies=: from the server
    shard, meta = f"{repo}/ckpt/shard.bin", f"{repo}/ckpt/meta.json"
    sent = metric_value(hub.metrics(), "fabric_http_bytes_total", direction="out")
    assert reader.cat_file(shard, 5, 5 + MIB) == big[5 : 5 + MIB]
    assert reader.cat([shard, meta]) == {shard: big, meta: small}
    assert reader.cat_ranges([shard, meta], [MIB, 7], [MIB + 10, 100]) == [big[MIB : MIB + 10], small[7:100]]
    assert metric_value(hub.metrics(), "fabric_http_bytes_total", direction="out") - sent < 2 * MIB  # the shard's 10 MiB came from its copy

    # A copy whose last check is more than a day old is read whole first: damage is found.
    flip(copy, 5 * MIB, 0xFF)
    os.setxattr(copy, CHECKED_XATTR, f"{time.time() - 25 * 3600:.0f} {os.path.basename(copy).partition('-')[2]}".encode())
    with reader.open(f"{repo}/ckpt/shard.bin", "rb") as f:
        assert isinstance(f, FabricReadFile) and f.read() == big
    assert not os.path.exists(copy)


def test_a_write_given_up_leaves_nothing_and_a_new_version_is_a_new_copy(hub: Hub, tmp_path) -> None:
    repo, copies = hub.new_repo("copies2"), str(tmp_path / "copies")
    fs = new_fs(hub.url, hub.token, copies=copies, commit="save")
    with pytest.raises(RuntimeError), fs.open(f"{repo}/a.bin", "wb") as f:
        f.write(os.urandom(6 * MIB))
        raise RuntimeError("the save fails")
    assert not fs.exists(f"{repo}/a.bin")
    first, second = os.urandom(2 * MIB), os.urandom(2 * MIB)
    fs.pipe_file(f"{repo}/a.bin", first)
    fs.pipe_file(f"{repo}/a.bin", second)  # the same path, another version
    assert len(_until_copies(copies, 2)) == 2
    assert os.listdir(os.path.join(copies, FILES, INCOMING)) == []
    assert fs.cat_file(f"{repo}/a.bin") == second
    with fs.open(f"{repo}/a.bin", "rb") as f:
        assert isinstance(f, io.BufferedReader) and f.read() == second


def _write_in_a_forked_child(url: str, token: str, path: str, data: bytes, copies: str) -> None:
    fs = new_fs(url, token, copies=copies, commit="save")
    fs.pipe_file(path, data)
    seeder(copies, 0).close()  # (a DataLoader worker ends with os._exit: wait for the placing here)


def test_a_forked_process_places_its_own_copies(hub: Hub, tmp_path) -> None:
    repo, copies = hub.new_repo("copies3"), str(tmp_path / "copies")
    new_fs(hub.url, hub.token, copies=copies, commit="save").pipe_file(f"{repo}/parent.bin", os.urandom(2 * MIB))
    assert len(_until_copies(copies, 1)) == 1  # (the parent's seeder, and its thread, exist before the fork)
    child = multiprocessing.get_context("fork").Process(
        target=_write_in_a_forked_child, args=(hub.url, hub.token, f"{repo}/child.bin", os.urandom(3 * MIB), copies))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert sorted(os.path.getsize(p) for p in _copies(copies)) == [2 * MIB, 3 * MIB]
