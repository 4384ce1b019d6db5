"""Opening SQLite databases with an explicit durability, and their transactions.

Every SQLite database fabric keeps is opened by :func:`connect`: WAL journal,
autocommit mode (transactions are explicit, see :func:`transaction`), a busy
timeout, usable from any thread. What differs is how durable a committed
transaction is, which the caller must say:

``"full"`` (``PRAGMA synchronous=FULL``)
    A committed transaction survives power loss or an OS crash: the WAL is
    fsynced at every commit.
``"normal"`` (``PRAGMA synchronous=NORMAL``, in WAL mode)
    A committed transaction survives a crash of the process; on power loss or
    an OS crash the last transactions may be lost (the database stays
    consistent). The WAL is fsynced only at checkpoints, so commits are cheaper.

:class:`SharedConnection` is one connection shared by threads behind a lock,
for the small state databases whose every statement is short.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from fabric.errors import StorageFull

Durability = Literal["full", "normal"]

_SYNCHRONOUS: dict[str, str] = {"full": "FULL", "normal": "NORMAL"}

#: Seconds a statement waits for another connection's lock before failing.
BUSY_TIMEOUT = 60.0
#: How often, and how far apart, :func:`transaction` retries a ``BEGIN`` refused as locked.
BEGIN_ATTEMPTS = 200
BEGIN_RETRY_DELAY = 0.05


def connect(path: str, durability: Durability) -> sqlite3.Connection:
    """Open (creating it and its directory if needed) the SQLite database at ``path``.

    The connection is in autocommit mode (``isolation_level=None``): each
    statement commits on its own unless run inside :func:`transaction`. It may
    be used from any thread; serializing its use is the caller's job.
    """
    if durability not in _SYNCHRONOUS:
        raise ValueError(f"unknown SQLite durability {durability!r}: expected one of {sorted(_SYNCHRONOUS)}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
    _retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
    conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[durability]}")
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection, write: bool = True) -> Iterator[sqlite3.Cursor]:
    """A transaction on ``conn``; commits on normal exit, rolls back on an exception.

    A full disk (SQLite's ``SQLITE_FULL``) is :class:`~fabric.errors.StorageFull`, with
    nothing of the transaction kept. Write transactions start with ``BEGIN IMMEDIATE`` so two writers queue on
    the database lock instead of failing on lock upgrade. A ``BEGIN`` refused
    as locked is retried for a while (about ten seconds) before giving up.
    """
    cur = conn.cursor()
    _retry_locked(lambda: cur.execute("BEGIN IMMEDIATE" if write else "BEGIN"))
    try:
        yield cur
        cur.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            cur.execute("ROLLBACK")
        _raise_full(exc)
        raise


def _raise_full(exc: BaseException) -> None:
    """StorageFull for SQLite's ``SQLITE_FULL`` (a full disk, or a database at its size limit)."""
    if isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode == sqlite3.SQLITE_FULL:
        raise StorageFull(f"the disk holding a database is full: {exc}") from exc


def _retry_locked(statement: Callable[[], object]) -> None:
    """Run ``statement``, retrying it while SQLite refuses it at once as locked.

    ``BEGIN`` and the switch to WAL (which another connection opening the same
    new database may be making at that moment) fail with "database is locked"
    without waiting for the busy timeout."""
    for attempt in range(BEGIN_ATTEMPTS):
        try:
            statement()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == BEGIN_ATTEMPTS - 1:
                raise
            time.sleep(BEGIN_RETRY_DELAY)


class SharedConnection:
    """One connection to a SQLite database, shared by threads: each call holds a lock.

    ``schema`` (a script of ``CREATE ... IF NOT EXISTS`` statements) is run
    once the database is open.
    """

    def __init__(self, path: str, durability: Durability, schema: str = "") -> None:
        self._conn = connect(path, durability)
        if schema:
            self._conn.executescript(schema)
        self._lock = threading.Lock()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run one statement (committed on its own) and return its rows; StorageFull on a full disk."""
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                _raise_full(exc)
                raise

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """A write transaction (see :func:`transaction`), holding the lock throughout."""
        with self._lock, transaction(self._conn) as cur:
            yield cur

    def close(self) -> None:
        with self._lock:
            self._conn.close()
