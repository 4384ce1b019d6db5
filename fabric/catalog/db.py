"""A thin SQL layer that speaks SQLite and PostgreSQL with one dialect of SQL.

Statements are written with ``?`` placeholders and portable SQL
(``INSERT ... ON CONFLICT``, ``RETURNING``); the few type differences live in
:data:`DDL_TYPES`. Connections are per thread; a transaction is a ``with``
block around :meth:`Database.tx`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fabric.errors import BadRequest, Unavailable
from fabric.util import sqlite

DDL_TYPES = {
    "sqlite": {"blob": "BLOB", "text_c": "TEXT", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL"},
    # PostgreSQL's REAL is a 4-byte float: Unix times would be off by up to a minute.
    "postgres": {"blob": "BYTEA", "text_c": 'TEXT COLLATE "C"', "serial": "BIGSERIAL PRIMARY KEY", "real": "DOUBLE PRECISION"},
}


class Cursor:
    """What a transaction block receives: execute/fetch with ``?`` placeholders."""

    def __init__(self, raw: Any, dialect: str) -> None:
        self._raw = raw
        self._pg = dialect == "postgres"

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pg else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        self._raw.execute(self._sql(sql), params)
        return self

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._raw.executemany(self._sql(sql), rows)

    def fetchone(self) -> tuple | None:
        return self._raw.fetchone()

    def fetchall(self) -> list[tuple]:
        return self._raw.fetchall()

    @property
    def rowcount(self) -> int:
        return self._raw.rowcount


class Database:
    """A catalog database: ``sqlite:///path`` (or a plain path) or ``postgresql://...``."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith(("postgresql://", "postgres://")):
            self.dialect = "postgres"
        elif url.startswith("sqlite:///") or "://" not in url:
            self.dialect = "sqlite"
            self._path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else url
        else:
            raise BadRequest(f"unsupported catalog URL {redact(url)!r}: use sqlite:///PATH or postgresql://...")
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    # -- connections ---------------------------------------------------------
    def _connect(self) -> Any:
        if self.dialect == "sqlite":
            return sqlite.connect(self._path, durability="normal")
        import psycopg

        try:
            return psycopg.connect(self.url, autocommit=True)
        except psycopg.OperationalError as exc:
            raise Unavailable(f"cannot connect to the catalog at {redact(self.url)}: {exc}") from exc

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
            self._all.clear()
        self._local = threading.local()

    # -- transactions --------------------------------------------------------
    @contextmanager
    def tx(self, write: bool = True) -> Iterator[Cursor]:
        """A transaction; commits on normal exit, rolls back on an exception.

        SQLite write transactions start with ``BEGIN IMMEDIATE`` so two writers
        queue on the database lock instead of failing on lock upgrade (see
        :func:`fabric.util.sqlite.transaction`).
        """
        conn = self._conn()
        if self.dialect == "sqlite":
            with sqlite.transaction(conn, write) as cur:
                yield Cursor(cur, self.dialect)
        else:
            with conn.transaction():
                with conn.cursor() as cur:
                    yield Cursor(cur, self.dialect)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run one read statement outside an explicit transaction."""
        conn = self._conn()
        cur = conn.cursor()
        cur.execute(sql.replace("?", "%s") if self.dialect == "postgres" else sql, params)
        rows = cur.fetchall()
        cur.close()
        return rows

    def ddl(self, statements: str) -> None:
        types = DDL_TYPES[self.dialect]
        with self.tx() as cur:
            for stmt in statements.format(**types).split(";"):
                if stmt.strip():
                    cur.execute(stmt)


def redact(url: str) -> str:
    """A database URL with any password replaced, safe to log or print."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def placeholders(n: int) -> str:
    return ",".join("?" * n)


def batched(items: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
