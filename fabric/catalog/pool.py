"""A bounded pool of database connections, shared by every thread.

At most ``size`` connections are open at once, whatever the number of threads
asking for them. A caller takes a connection for one statement or one
transaction and gives it back at once (:meth:`Pool.connection`); a thread
that already holds one (a query inside a transaction) gets that same
connection again, so nested use neither deadlocks on the pool nor reads
outside its own transaction. A caller that finds every connection taken waits
up to ``timeout`` seconds, then gets :class:`~fabric.errors.Unavailable`. A
connection found broken when it comes back is closed, not returned.
:meth:`Pool.close` closes every connection (those in use as they come back);
the pool stays usable and opens new ones on demand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fabric.errors import Unavailable

#: Connections a catalog keeps at most, unless told otherwise.
DEFAULT_SIZE = 8
#: Seconds a caller waits for a free connection before giving up.
DEFAULT_TIMEOUT = 30.0


class Pool:
    """``connect()`` opens a connection; ``healthy(conn)`` says if one may be reused."""

    def __init__(
        self,
        connect: Callable[[], Any],
        healthy: Callable[[Any], bool],
        size: int = DEFAULT_SIZE,
        timeout: float = DEFAULT_TIMEOUT,
        name: str = "database",
    ) -> None:
        if size < 1:
            raise ValueError(f"a connection pool needs at least one connection, not {size}")
        if timeout <= 0:
            raise ValueError(f"the pool's wait timeout must be positive, not {timeout}")
        self.size = size
        self.timeout = timeout
        self._connect = connect
        self._healthy = healthy
        self._name = name
        self._idle: list[Any] = []
        self._open = 0
        #: Bumped by :meth:`close`; a connection opened before the bump is closed when it comes back.
        self._generation = 0
        self._born: dict[int, int] = {}
        self._cond = threading.Condition()
        self._held = threading.local()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for the duration of the block (the one this thread holds, if any)."""
        held = getattr(self._held, "conn", None)
        if held is not None:
            self._held.depth += 1
            try:
                yield held
            finally:
                self._held.depth -= 1
            return
        conn = self._acquire()
        self._held.conn, self._held.depth = conn, 1
        try:
            yield conn
        finally:
            self._held.conn = None
            self._release(conn)

    def _acquire(self) -> Any:
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._open < self.size:
                    self._open += 1  # reserved; opened outside the lock
                    generation = self._generation
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(
                        f"the {self._name} is busy: all {self.size} connections stayed in use for "
                        f"{self.timeout:g} s; retry later (or give the catalog a larger connection pool)"
                    )
                self._cond.wait(left)
        try:
            conn = self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._born[id(conn)] = generation
        return conn

    def _release(self, conn: Any) -> None:
        healthy = _safe(self._healthy, conn)
        with self._cond:
            keep = healthy and self._born.get(id(conn)) == self._generation
            if keep:
                self._idle.append(conn)
            else:
                self._born.pop(id(conn), None)
                self._open -= 1
            self._cond.notify()
        if not keep:
            _close(conn)

    def stats(self) -> dict[str, int]:
        """``{"open", "idle", "size"}``: connections open now, those of them free, the bound."""
        with self._cond:
            return {"open": self._open, "idle": len(self._idle), "size": self.size}

    def close(self) -> None:
        """Close every idle connection now, and each one in use when it comes back."""
        with self._cond:
            self._generation += 1
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            for conn in idle:
                self._born.pop(id(conn), None)
            self._cond.notify_all()
        for conn in idle:
            _close(conn)


def _safe(check: Callable[[Any], bool], conn: Any) -> bool:
    try:
        return check(conn)
    except Exception:  # noqa: BLE001 - a connection that cannot be checked is not reused
        return False


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection is best effort
        pass
