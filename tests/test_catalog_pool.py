"""The catalog's connections (issue 11, points 5 and 7): a bounded pool, FULL durability.

Request threads come and go; the catalog must not keep a connection (and its
file descriptors, or a PostgreSQL backend) per thread forever. Every test
runs on SQLite and on a real PostgreSQL (``-m postgres``).
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
import pytest

from fabric.catalog import Database
from fabric.engine.engine import Engine
from fabric.errors import BadRequest, Unavailable
from fabric.format.model import Entry

THREADS = 50


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def catalog_connections(db_url: str) -> int:
    """Connections open on the catalog, as the database (or the kernel) sees them."""
    if db_url.startswith("sqlite:///"):
        path = os.path.realpath(db_url[len("sqlite:///") :])
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}") == path
            except OSError:
                continue
        return count
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]


def run_threads(target, count: int) -> None:
    """``count`` short-lived threads running ``target(i)`` at once; re-raises the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(i: int) -> None:
        try:
            start.wait()
            target(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_short_lived_threads_leave_at_most_the_pool_of_connections(engine: Engine, db_url: str) -> None:
    engine.create_repo("pool")
    size = engine.catalog.db.pool_stats()["size"]

    def work(i: int) -> None:  # what a request thread does: reads, a ref change, a staged write
        name = f"t{i}-{time.monotonic_ns()}"
        engine.create_branch("pool", name, "main")
        engine.list_branches("pool")
        engine.stage("pool", name, {"f.txt": Entry(size=0, mtime_ns=i)})
        assert "f.txt" in {c.path for c in engine.uncommitted("pool", name)}

    run_threads(work, THREADS)  # the first wave fills the pool
    assert catalog_connections(db_url) <= size
    fds = open_fds()
    for _ in range(2):
        run_threads(work, THREADS)
    assert catalog_connections(db_url) <= size
    assert open_fds() <= fds, "file descriptors grew with the number of threads served"
    assert engine.catalog.db.pool_stats()["open"] <= size


def test_a_caller_waits_for_a_free_connection_then_gets_unavailable(db_url: str) -> None:
    db = Database(db_url, pool_size=2, pool_timeout=0.3)
    release = threading.Event()
    holding = threading.Barrier(3, timeout=30)

    def hold(_: int) -> None:
        with db.tx(write=False) as cur:
            cur.execute("SELECT 1")
            holding.wait()
            release.wait(10)

    holders = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
    for t in holders:
        t.start()
    holding.wait()
    started = time.monotonic()
    with pytest.raises(Unavailable) as err:
        db.query("SELECT 1")
    waited = time.monotonic() - started
    assert 0.25 <= waited < 5, waited
    assert "busy" in err.value.message and "2 connections" in err.value.message, err.value.message

    release.set()
    for t in holders:
        t.join()
    assert db.query("SELECT 1") == [(1,)]
    assert db.pool_stats()["open"] == 2
    db.close()


def test_waiting_caller_gets_the_connection_when_it_frees_up(db_url: str) -> None:
    db = Database(db_url, pool_size=1, pool_timeout=10)
    inside = threading.Event()

    def hold() -> None:
        with db.tx(write=False) as cur:
            cur.execute("SELECT 1")
            inside.set()
            time.sleep(0.3)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(5)
    assert db.query("SELECT 2") == [(2,)]
    t.join()
    assert db.pool_stats() == {"open": 1, "idle": 1, "size": 1}
    db.close()


def test_a_thread_reuses_its_connection_inside_a_transaction(db_url: str) -> None:
    """A query inside a transaction sees the transaction's writes and does not wait on the pool."""
    db = Database(db_url, pool_size=1, pool_timeout=0.5)
    db.ddl("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)")
    with db.tx() as cur:
        cur.execute("INSERT INTO t (k) VALUES (?)", ("a",))
        assert db.query("SELECT k FROM t") == [("a",)]
    assert db.pool_stats()["open"] == 1
    db.close()


@pytest.mark.postgres
def test_a_broken_connection_is_discarded_not_reused(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, pool_timeout=5)
    ((pid,),) = db.query("SELECT pg_backend_pid()")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(Unavailable) as err:
        db.query("SELECT 1")
    assert "lost the connection" in err.value.message
    assert db.pool_stats()["open"] == 0
    ((fresh,),) = db.query("SELECT pg_backend_pid()")
    assert fresh != pid
    db.close()


def test_bad_pool_settings_are_refused(db_url: str) -> None:
    with pytest.raises(BadRequest, match="at least 1"):
        Database(db_url, pool_size=0)
    with pytest.raises(BadRequest, match="sync"):
        Database(db_url, sync="sometimes")  # type: ignore[arg-type]


# -- point 7: a SQLite catalog acknowledges only what survives power loss ----------


def _synchronous(db: Database) -> int:
    with db.tx(write=False) as cur:
        return cur.execute("PRAGMA synchronous").fetchone()[0]


def test_sqlite_catalog_is_full_sync_by_default(tmp_path) -> None:
    engine = Engine.open(str(tmp_path / "hub"))
    db = engine.catalog.db
    size = db.pool_stats()["size"]
    seen: list[int] = []
    together = threading.Barrier(size)

    def read(_: int) -> None:  # every connection of the pool at once, not just the first
        with db.tx(write=False) as cur:
            seen.append(cur.execute("PRAGMA synchronous").fetchone()[0])
            together.wait(10)

    try:
        run_threads(read, size)
        assert seen == [2] * size  # FULL
        assert db.pool_stats()["open"] == size
    finally:
        engine.close()


def test_sqlite_catalog_sync_normal_is_an_explicit_opt_out(tmp_path) -> None:
    engine = Engine.open(str(tmp_path / "hub"), catalog_sync="normal")
    try:
        assert _synchronous(engine.catalog.db) == 1  # NORMAL
    finally:
        engine.close()
