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


def test_a_shared_connection_on_a_full_database_is_storage_full(tmp_path) -> None:
    db = sqlite.SharedConnection(str(tmp_path / "db.sqlite"), "normal", "CREATE TABLE IF NOT EXISTS t (v BLOB);")
    db.execute("PRAGMA max_page_count = 20")
    with pytest.raises(StorageFull, match="full"):
        for _ in range(100):
            db.execute("INSERT INTO t VALUES (?)", (os.urandom(4 * KiB),))


def test_a_spoke_whose_state_disk_is_full_still_answers_and_keeps_what_fits(tmp_path) -> None:
    """Soak seed 7 (30 min): a commit through spoke-a succeeded at the hub, then answered 500,
    because recording the branch's new head in the spoke's state.db found the disk full. That
    state is a cache of the hub's answers: its writes are skipped (logged), never the request's
    failure. A token verdict the hub withdrew is the exception: forgetting it is never skipped."""
    from spoke.state import SpokeState

    state = SpokeState(str(tmp_path))
    state.save_ref("r", "branch", "main", "c0")
    state.save_token("h", {"name": "t"})
    state._db.execute("PRAGMA max_page_count = 1")  # nothing more fits
    for i in range(50):
        state.save_ref("r", "branch", f"b{i}", "c" * 64)
        state.add_commit("r", f"{i:064x}")
        state.save_staging("r", f"b{i}", "c" * 64, i, {"p": os.urandom(4 * KiB)}, replace=False)
    assert state.skipped_writes > 0
    assert ("r", "branch", "main", "c0") in state.refs()  # what was recorded before is intact
    state._db.execute("PRAGMA max_page_count = 100000")
    state.save_ref("r", "branch", "later", "c1")
    assert ("r", "branch", "later", "c1") in state.refs()
    state.save_token("h", None)
    assert state.tokens() == {}
