"""Import of many small files (issue 18): small files read whole with one call, in batches in the
importing thread, give exactly what reading them as streams gave; a failure mid-batch leaves the
store consistent. (tests/test_crash.py kills imports of such files.)
"""

from __future__ import annotations

import io
import os
import random

import pytest

from fabric.client import filereader
from fabric.client.transfer import LocalItem, export_tree, import_directory
from fabric.engine.engine import Engine
from fabric.format import chunking
from fabric.format.ingest import Ingester, PackSession
from fabric.format.model import FILE
from fabric.util.progress import Progress
from tests.helpers.fstree import assert_same_tree, random_files, snapshot, write_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = 1_600_000_000_123_456_789


class _Sink(PackSession):
    """A sink that stores nothing: every chunk is new; full packs are dropped."""

    def __init__(self) -> None:
        super().__init__(lambda ids: list(ids), lambda builder: None, 1 << 20)


@pytest.mark.parametrize("size", [0, 1, 100, chunking.MIN_CHUNK, chunking.MIN_CHUNK + 1, 70_000, 300_000, 1 << 20])
@pytest.mark.parametrize("kind", ["random", "text"])
def test_feed_bytes_gives_what_a_stream_gives(size: int, kind: str) -> None:
    rng = random.Random(size)
    data = rng.randbytes(size) if kind == "random" else b"".join(b"line %d\n" % i for i in range(size))[:size]
    whole = Ingester(_Sink()).feed_bytes(data)
    streamed = Ingester(_Sink()).feed(io.BytesIO(data))
    assert whole == streamed
    assert sum(n for _, n in whole[0]) == size


def _mixed_tree(root: str) -> None:
    random_files(root, 600, seed=5, sizes=(0, 3000), fanout=7, compressible=0.5)
    rng = random.Random(6)
    write_file(f"{root}/big/a.bin", rng.randbytes(3 * filereader.SMALL_FILE + 17), 0o640, T0)
    write_file(f"{root}/big/b.txt", b"a text line\n" * 200_000, 0o600, T0 + 1)
    write_file(f"{root}/exec.sh", b"#!/bin/sh\n", 0o755, T0 + 2)
    write_file(f"{root}/empty", b"", 0o444, T0 + 3)
    write_file(f"{root}/dup1", b"same content\n", 0o644, T0 + 4)
    write_file(f"{root}/dup2", b"same content\n", 0o644, T0 + 5)
    os.link(f"{root}/exec.sh", f"{root}/exec-link.sh")
    os.symlink("exec.sh", f"{root}/link")
    os.makedirs(f"{root}/empty-dir")


def test_batched_import_round_trips(sqlite_engine: Engine, tmp_path, monkeypatch) -> None:
    """The same tree, modes, mtimes and links; the same entries as files read as streams."""
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _mixed_tree(src)
    expected = snapshot(src)
    sqlite_engine.create_repo("one")
    r = import_directory(sqlite_engine, src, "one", "main", "first")
    assert r.commit is not None and r.files == len(expected)
    export_tree(sqlite_engine, "one", "main", out)
    assert_same_tree(expected, snapshot(out))
    assert os.stat(f"{out}/exec.sh").st_ino == os.stat(f"{out}/exec-link.sh").st_ino
    # Read as streams (no file is "small"), a second repository gets the very same entries
    # (but for the hard-link group's id, which each import draws anew).
    monkeypatch.setattr(filereader, "SMALL_FILE", -1)
    sqlite_engine.create_repo("two")
    other = import_directory(sqlite_engine, src, "two", "main", "first")
    assert other.new_chunks == 0  # every chunk was stored by the first import
    assert _entries(sqlite_engine, "one") == _entries(sqlite_engine, "two")


def _entries(engine: Engine, repo: str) -> dict:
    commit = engine.resolve_commit(repo, "main")
    return {p: e.with_(link="") for p, e in engine.walk(repo, commit, "")}


@pytest.mark.parametrize("actual", [0, 500, 1000, 5000, 3 * filereader.SMALL_FILE])
def test_file_that_changed_size_since_the_walk(tmp_path, actual: int) -> None:
    """A file read whole is read to its end, whatever size the walk saw."""
    data = random.Random(actual).randbytes(actual)
    path = str(tmp_path / "f")
    write_file(path, data, 0o644, T0)
    seen = LocalItem("f", path, FILE, size=1000, mode=0o644, mtime_ns=T0)  # the walk saw 1000 bytes
    [(name, entry)] = list(filereader.ingest_files([seen], _Sink(), Progress()))
    expected = Ingester(_Sink()).feed(io.BytesIO(data))
    assert (name, entry.size, list(entry.chunks), entry.md5) == ("f", actual, expected[0], expected[1])


def test_failure_mid_batch_leaves_the_store_consistent(sqlite_engine: Engine, tmp_path, monkeypatch) -> None:
    src = str(tmp_path / "src")
    random_files(src, 1500, seed=9, sizes=(10, 2000), fanout=3)
    sqlite_engine.create_repo("demo")
    head = sqlite_engine.head("demo", "main")
    walk = filereader.ingest_files
    monkeypatch.setattr(filereader, "BATCH_FILES", 512)  # three batches of the 1500 files

    def vanishing(files, *args):
        # A file removed after the walk, in the middle of the second batch.
        os.unlink(sorted(f.abspath for f in files)[filereader.BATCH_FILES + 7])
        return walk(files, *args)

    monkeypatch.setattr("fabric.client.transfer.ingest_files", vanishing)
    with pytest.raises(FileNotFoundError):
        import_directory(sqlite_engine, src, "demo", "main", "broken")
    assert sqlite_engine.head("demo", "main") == head
    report = sqlite_engine.fsck()
    assert report["ok"], report
    monkeypatch.setattr("fabric.client.transfer.ingest_files", walk)
    again = import_directory(sqlite_engine, src, "demo", "main", "again")
    assert again.added == 1499
    assert sqlite_engine.fsck()["ok"]


@pytest.mark.parametrize("size", [100, 3 * filereader.SMALL_FILE])
def test_a_file_swapped_for_a_link_after_the_walk_is_refused_not_followed(tmp_path, size: int) -> None:
    """The walk saw a regular file; a symlink put in its place before it is read (to a file
    outside the tree) is never read through."""
    outside = tmp_path / "secret"
    outside.write_bytes(b"s" * size)
    path = tmp_path / "f"
    path.symlink_to(outside)
    seen = LocalItem("f", str(path), FILE, size=size, mode=0o644, mtime_ns=T0)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        list(filereader.ingest_files([seen], _Sink(), Progress()))
