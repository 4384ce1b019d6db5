"""fabric.util.sqlite: durability pragmas, WAL, transactions, retries on a locked database, threads."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from fabric.util import sqlite
from fabric.util.sqlite import SharedConnection

#: ``PRAGMA synchronous`` reads back as a number.
SYNCHRONOUS = {"normal": 1, "full": 2}
SCHEMA = "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER); CREATE INDEX IF NOT EXISTS t_v ON t (v)"


def _db(tmp_path: Path) -> str:
    return str(tmp_path / "test.db")


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_connect_sets_the_durability_asked_for_wal_and_a_busy_timeout(tmp_path: Path, durability: sqlite.Durability) -> None:
    conn = sqlite.connect(_db(tmp_path), durability)
    try:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNCHRONOUS[durability]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == int(sqlite.BUSY_TIMEOUT * 1000)
        assert conn.isolation_level is None  # autocommit: transactions are explicit
    finally:
        conn.close()
    other = sqlite3.connect(_db(tmp_path))  # WAL is a property of the database file, not only of the connection
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_shared_connection_sets_the_durability_asked_for(tmp_path: Path, durability: sqlite.Durability) -> None:
    db = SharedConnection(_db(tmp_path), durability)
    try:
        assert db.execute("PRAGMA synchronous") == [(SYNCHRONOUS[durability],)]
        assert db.execute("PRAGMA journal_mode") == [("wal",)]
    finally:
        db.close()


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        sqlite.connect(_db(tmp_path), "off")  # type: ignore[arg-type]
    assert not (tmp_path / "test.db").exists()


def test_connect_creates_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.db"
    sqlite.connect(str(path), "normal").close()
    assert path.is_file()


def test_connection_is_usable_from_another_thread(tmp_path: Path) -> None:
    conn = sqlite.connect(_db(tmp_path), "normal")
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(conn.execute("SELECT 41 + 1").fetchone()[0]))
    t.start()
    t.join()
    conn.close()
    assert result == [42]


# -- transactions ----------------------------------------------------------------


def _table(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite.connect(_db(tmp_path), "full")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
    return conn


def test_transaction_commits_on_normal_exit(tmp_path: Path) -> None:
    conn = _table(tmp_path)
    with sqlite.transaction(conn) as cur:
        cur.execute("INSERT INTO t VALUES ('a', 1)")
        cur.execute("INSERT INTO t VALUES ('b', 2)")
        assert conn.in_transaction
    assert not conn.in_transaction
    conn.close()
    reopened = sqlite3.connect(_db(tmp_path))
    assert reopened.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [("a", 1), ("b", 2)]
    reopened.close()


class Stop(BaseException):
    """Not an Exception: the rollback must not depend on the kind of error."""


@pytest.mark.parametrize("error", [ValueError, Stop])
def test_transaction_rolls_back_on_error(tmp_path: Path, error: type[BaseException]) -> None:
    conn = _table(tmp_path)
    conn.execute("INSERT INTO t VALUES ('kept', 0)")
    with pytest.raises(error):
        with sqlite.transaction(conn) as cur:
            cur.execute("INSERT INTO t VALUES ('a', 1)")
            cur.execute("UPDATE t SET v = 99 WHERE k = 'kept'")
            raise error()
    assert not conn.in_transaction
    assert conn.execute("SELECT k, v FROM t").fetchall() == [("kept", 0)]
    with sqlite.transaction(conn) as cur:  # the connection is usable again
        cur.execute("INSERT INTO t VALUES ('b', 2)")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    conn.close()


def test_write_transaction_takes_the_write_lock_at_begin_and_a_read_one_does_not(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0)
    first, second = _table(tmp_path), sqlite.connect(_db(tmp_path), "full")
    with sqlite.transaction(first, write=False) as cur:
        cur.execute("SELECT count(*) FROM t")
        second.execute("BEGIN IMMEDIATE")  # a reader does not keep a writer out
        second.execute("ROLLBACK")
    with sqlite.transaction(first, write=True):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            second.execute("BEGIN IMMEDIATE")  # BEGIN IMMEDIATE already holds the write lock
    first.close()
    second.close()


def test_begin_refused_as_locked_is_retried_until_the_lock_is_free(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0)  # no waiting in SQLite: every BEGIN is refused at once
    monkeypatch.setattr(sqlite, "BEGIN_RETRY_DELAY", 0.01)
    holder, waiter = _table(tmp_path), sqlite.connect(_db(tmp_path), "full")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES ('holder', 1)")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    with sqlite.transaction(waiter) as cur:
        cur.execute("INSERT INTO t VALUES ('waiter', 2)")
    assert time.monotonic() - started >= 0.25
    release.join()
    assert waiter.execute("SELECT k FROM t ORDER BY k").fetchall() == [("holder",), ("waiter",)]
    holder.close()
    waiter.close()


def test_begin_gives_up_after_its_attempts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0)
    monkeypatch.setattr(sqlite, "BEGIN_ATTEMPTS", 3)
    monkeypatch.setattr(sqlite, "BEGIN_RETRY_DELAY", 0.01)
    holder, waiter = _table(tmp_path), sqlite.connect(_db(tmp_path), "full")
    holder.execute("BEGIN IMMEDIATE")
    body_ran = False
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        with sqlite.transaction(waiter):
            body_ran = True
    assert not body_ran and not waiter.in_transaction
    holder.execute("ROLLBACK")
    holder.close()
    waiter.close()


def test_threads_with_their_own_connections_never_lose_an_update(tmp_path: Path) -> None:
    setup = _table(tmp_path)
    setup.execute("INSERT INTO t VALUES ('n', 0)")
    setup.close()
    threads, rounds, errors = 4, 50, []

    def work() -> None:
        conn = sqlite.connect(_db(tmp_path), "normal")
        try:
            for _ in range(rounds):
                with sqlite.transaction(conn) as cur:
                    (n,) = cur.execute("SELECT v FROM t WHERE k = 'n'").fetchone()
                    cur.execute("UPDATE t SET v = ? WHERE k = 'n'", (n + 1,))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            conn.close()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    check = sqlite3.connect(_db(tmp_path))
    assert check.execute("SELECT v FROM t WHERE k = 'n'").fetchone() == (threads * rounds,)
    check.close()


# -- one connection shared by threads -------------------------------------------


def test_shared_connection_runs_its_schema_and_statements(tmp_path: Path) -> None:
    db = SharedConnection(_db(tmp_path), "normal", schema=SCHEMA)
    assert db.execute("INSERT INTO t VALUES (?, ?)", ("a", 1)) == []
    assert db.execute("SELECT k, v FROM t WHERE v = ?", (1,)) == [("a", 1)]
    db.close()
    again = SharedConnection(_db(tmp_path), "normal", schema=SCHEMA)
    assert again.execute("SELECT k, v FROM t") == [("a", 1)]  # committed, and the schema is idempotent
    again.close()
    with pytest.raises(sqlite3.ProgrammingError):
        again.execute("SELECT 1")  # closed


def test_shared_connection_transaction_rolls_back_and_releases_its_lock(tmp_path: Path) -> None:
    db = SharedConnection(_db(tmp_path), "full", schema=SCHEMA)
    with db.transaction() as cur:
        cur.execute("INSERT INTO t VALUES ('a', 1)")
    with pytest.raises(sqlite3.IntegrityError):
        with db.transaction() as cur:
            cur.execute("INSERT INTO t VALUES ('b', 2)")
            cur.execute("INSERT INTO t VALUES ('a', 3)")  # duplicate key
    # Not deadlocked, and nothing of the failed transaction is left.
    assert db.execute("SELECT k, v FROM t ORDER BY k") == [("a", 1)]
    db.close()


def test_shared_connection_serializes_threads(tmp_path: Path) -> None:
    db = SharedConnection(_db(tmp_path), "normal", schema=SCHEMA)
    db.execute("INSERT INTO t VALUES ('n', 0)")
    threads, rounds, errors = 8, 50, []

    def work(i: int) -> None:
        try:
            for r in range(rounds):
                db.execute("INSERT INTO t VALUES (?, ?)", (f"{i}-{r}", r))
                with db.transaction() as cur:  # a read-modify-write that no other thread may interleave with
                    (n,) = cur.execute("SELECT v FROM t WHERE k = 'n'").fetchone()
                    cur.execute("UPDATE t SET v = ? WHERE k = 'n'", (n + 1,))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert db.execute("SELECT v FROM t WHERE k = 'n'") == [(threads * rounds,)]
    assert db.execute("SELECT count(*) FROM t") == [(threads * rounds + 1,)]
    db.close()


def test_connections_opened_at_once_on_a_new_database_all_succeed(tmp_path) -> None:
    """Switching a new database to WAL is refused at once as "locked" while another
    connection does it: connect() retries instead of failing."""
    errors: list[BaseException] = []

    def open_one(path: str, start: threading.Barrier) -> None:
        start.wait()
        try:
            sqlite.connect(path, "normal").close()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    for round_ in range(20):
        start = threading.Barrier(8, timeout=30)
        path = str(tmp_path / f"new{round_}.db")
        threads = [threading.Thread(target=open_one, args=(path, start)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
