"""A thin SQL layer that speaks SQLite and PostgreSQL with one dialect of SQL.

Statements are written with ``?`` placeholders and portable SQL
(``INSERT ... ON CONFLICT``, ``RETURNING``); the few type differences live in
:data:`DDL_TYPES`. A transaction is a ``with`` block around :meth:`Database.tx`.

Connections come from a bounded :class:`~fabric.catalog.pool.Pool` (both
dialects): one is taken for each statement or transaction and given back right
after, so the number of connections never exceeds the pool's size however many
threads serve requests. A SQLite catalog commits with ``synchronous=FULL`` by
default: a transaction acknowledged to a client survives power loss.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fabric.catalog.pool import DEFAULT_SIZE, DEFAULT_TIMEOUT, Pool
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
    """A catalog database: ``sqlite:///path`` (or a plain path) or ``postgresql://...``.

    ``pool_size`` bounds the open connections, ``pool_timeout`` is how long a
    caller waits for a free one before :class:`~fabric.errors.Unavailable`.
    ``sync`` is a SQLite catalog's durability (see :mod:`fabric.util.sqlite`):
    ``"full"`` (the default) or ``"normal"`` (faster commits; the last ones may
    be lost on power loss).
    """

    def __init__(
        self,
        url: str,
        pool_size: int = DEFAULT_SIZE,
        pool_timeout: float = DEFAULT_TIMEOUT,
        sync: sqlite.Durability = "full",
    ) -> None:
        self.url = url
        if url.startswith(("postgresql://", "postgres://")):
            self.dialect = "postgres"
        elif url.startswith("sqlite:///") or "://" not in url:
            self.dialect = "sqlite"
            self._path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else url
        else:
            raise BadRequest(f"unsupported catalog URL {redact(url)!r}: use sqlite:///PATH or postgresql://...")
        if sync not in ("full", "normal"):
            raise BadRequest(f"unknown catalog sync mode {sync!r}: use full or normal")
        if pool_size < 1:
            raise BadRequest(f"the catalog's connection pool needs at least 1 connection, not {pool_size}")
        self.sync = sync
        healthy = _sqlite_healthy if self.dialect == "sqlite" else _postgres_healthy
        self._pool = Pool(self._connect, healthy, pool_size, pool_timeout, name=f"catalog at {redact(url)}")

    # -- connections ---------------------------------------------------------
    def _connect(self) -> Any:
        if self.dialect == "sqlite":
            return sqlite.connect(self._path, durability=self.sync)
        import psycopg

        try:
            return psycopg.connect(self.url, autocommit=True)
        except psycopg.OperationalError as exc:
            raise Unavailable(f"cannot connect to the catalog at {redact(self.url)}: {exc}") from exc

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A pooled connection for one statement or transaction; a lost PostgreSQL
        connection becomes :class:`~fabric.errors.Unavailable` (and is discarded)."""
        with self._pool.connection() as conn:
            if self.dialect == "sqlite":
                yield conn
                return
            import psycopg

            try:
                yield conn
            except psycopg.OperationalError as exc:
                if conn.broken or conn.closed:
                    raise Unavailable(f"lost the connection to the catalog at {redact(self.url)}: {exc}") from exc
                raise

    def pool_stats(self) -> dict[str, int]:
        """``{"open", "idle", "size"}`` of the connection pool."""
        return self._pool.stats()

    def close(self) -> None:
        """Close the pool's connections (those in use when they come back); later calls open new ones."""
        self._pool.close()

    # -- transactions --------------------------------------------------------
    @contextmanager
    def tx(self, write: bool = True) -> Iterator[Cursor]:
        """A transaction; commits on normal exit, rolls back on an exception.

        SQLite write transactions start with ``BEGIN IMMEDIATE`` so two writers
        queue on the database lock instead of failing on lock upgrade (see
        :func:`fabric.util.sqlite.transaction`).
        """
        with self._conn() as conn:
            if self.dialect == "sqlite":
                with sqlite.transaction(conn, write) as cur:
                    yield Cursor(cur, self.dialect)
            else:
                with conn.transaction():
                    with conn.cursor() as cur:
                        yield Cursor(cur, self.dialect)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run one read statement outside an explicit transaction."""
        with self._conn() as conn:
            cur = conn.cursor()
            try:
                cur.execute(sql.replace("?", "%s") if self.dialect == "postgres" else sql, params)
                return cur.fetchall()
            finally:
                cur.close()

    def ddl(self, statements: str) -> None:
        types = DDL_TYPES[self.dialect]
        with self.tx() as cur:
            for stmt in statements.format(**types).split(";"):
                if stmt.strip():
                    cur.execute(stmt)


def _sqlite_healthy(conn: Any) -> bool:
    return not conn.in_transaction


def _postgres_healthy(conn: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return not (conn.closed or conn.broken) and conn.info.transaction_status == TransactionStatus.IDLE


def redact(url: str) -> str:
    """A database URL with any password replaced, safe to log or print."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def placeholders(n: int) -> str:
    return ",".join("?" * n)


def batched(items: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
