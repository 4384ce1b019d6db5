"""How many bytes of request bodies a server process holds in memory at once.

Some routes must have a whole body before they can act (a pack is verified
whole; a msgpack document of changes is decoded whole). Each such body takes
its size from one :class:`BodyBudget` shared by the process before it is read,
and gives it back when the request is done with it. A request whose declared
size cannot be had within a short wait is refused with ``503`` and
``Retry-After`` (:class:`~fabric.errors.Unavailable`): the server is busy, not
the client wrong, and every client of ours retries a 503. A body without a
declared size takes its bytes as they arrive and is refused the same way, at
once, when the budget runs out (waiting half-read could deadlock two such
requests). A body larger than the whole budget could never be served: it is
refused with ``413`` (:class:`~fabric.errors.PayloadTooLarge`).

The budget is ``FABRIC_BODY_BUDGET`` bytes (default 1 GiB: two of the largest
bodies, 512 MiB of changes), read when the process first needs it.
"""

from __future__ import annotations

import os
import threading
import time

import anyio

from fabric.errors import BadRequest, Unavailable
from fabric.util.sizes import parse_size

#: Bytes of request bodies held at once by one process, unless ``FABRIC_BODY_BUDGET`` says.
DEFAULT_BUDGET = 1 << 30
#: Seconds a request waits for its declared size before it is refused (503).
WAIT = 2.0
#: The ``Retry-After`` (seconds) sent with that refusal.
RETRY_AFTER = 1


class BodyBudget:
    """A byte count shared by the requests of one process (thread-safe, loop-agnostic)."""

    def __init__(self, total: int, wait: float = WAIT) -> None:
        if total <= 0:
            raise BadRequest(f"the request body budget must be positive, not {total}")
        self.total = total
        self.wait = wait
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes if they are free now."""
        with self._lock:
            if self._used + n > self.total:
                return False
            self._used += n
            return True

    def take_now(self, n: int) -> None:
        """Take ``n`` bytes now or raise Unavailable (503, Retry-After)."""
        if not self.try_take(n):
            self._refuse(n)

    async def take(self, n: int) -> None:
        """Take ``n`` bytes, waiting up to ``wait`` seconds for them; then Unavailable."""
        deadline = time.monotonic() + self.wait
        delay = 0.005
        while not self.try_take(n):
            if time.monotonic() >= deadline:
                self._refuse(n)
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def give(self, n: int) -> None:
        with self._lock:
            self._used -= n

    def _refuse(self, n: int) -> None:
        raise Unavailable(
            f"the server is holding {self._used} of its {self.total} bytes for request bodies and cannot take "
            f"{n} more now; retry after {RETRY_AFTER}s",
            retry_after=RETRY_AFTER,
        )


_budget: BodyBudget | None = None
_budget_lock = threading.Lock()


def body_budget() -> BodyBudget:
    """The process's budget (``FABRIC_BODY_BUDGET`` bytes, e.g. ``512M``; default 1 GiB)."""
    global _budget
    with _budget_lock:
        if _budget is None:
            text = os.environ.get("FABRIC_BODY_BUDGET", "").strip()
            _budget = BodyBudget(parse_size(text) if text else DEFAULT_BUDGET)
        return _budget
