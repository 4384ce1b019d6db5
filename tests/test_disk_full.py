"""A full disk is 'insufficient storage' (507, ENOSPC in a mount), never an internal error:
found by the chaos soak, where a spoke's full cache disk made S3 multipart uploads (their
records are in SQLite) and pinned writes answer 500."""

from __future__ import annotations

import os
import subprocess

import pytest

from fabric.api.s3.errors import from_fabric
from fabric.cache.disk import DiskCache
from fabric.errors import StorageFull
from fabric.format.chunking import chunk_id
from fabric.util import sqlite
from tests.ci_requirements import requires

KiB = 1024


def test_a_transaction_on_a_full_database_is_storage_full_and_keeps_nothing(tmp_path) -> None:
    conn = sqlite.connect(str(tmp_path / "db.sqlite"), "full")
    with sqlite.transaction(conn) as cur:
        cur.execute("CREATE TABLE t (v BLOB)")
    conn.execute("PRAGMA max_page_count = 20")  # a database that cannot grow past 20 pages
    with pytest.raises(StorageFull, match="full"), sqlite.transaction(conn) as cur:
        for _ in range(100):
            cur.execute("INSERT INTO t VALUES (?)", (os.urandom(4 * KiB),))
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with sqlite.transaction(conn) as cur:  # the connection is still usable
        cur.execute("INSERT INTO t VALUES (x'00')")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_storage_full_is_s3s_insufficient_storage() -> None:
    err = from_fabric(StorageFull("the disk holding a database is full"))
    assert (err.code, err.status) == ("InsufficientStorage", 507)


def _tmpfs_reason() -> str | None:
    return None if os.geteuid() == 0 else "mounting a small tmpfs needs root"


@requires(_tmpfs_reason)
def test_pinning_on_a_full_disk_is_storage_full_and_pins_nothing(tmp_path) -> None:
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(root)], check=True)
    try:
        cache = DiskCache(str(root / "cache"), 64 * 1024 * KiB)  # a budget far beyond the disk
        blobs = [(chunk_id(b"%d" % i), os.urandom(64 * KiB)) for i in range(8)]  # 512 KiB
        with pytest.raises(StorageFull, match="disk is full"):
            cache.put_pinned(blobs)
        assert cache.stats()["cache_pinned_bytes"] == 0
        assert cache.put_pinned(blobs[:1]) == 1  # room for one: pinned
        cache.close()
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
