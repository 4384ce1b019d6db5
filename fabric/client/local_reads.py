"""Reports of the chunks a client beside a spoke read from the spoke's cache files (``fabric
mount --spoke-cache``, ``fabric://`` with ``spoke_cache=``).

Such a read never reaches the spoke, which would otherwise see those chunks as unread: the
first evicted, their plans never consumed, its hit counts and the job's figures short. The
client tells it, as advice (``fabric/client/advice.py``, one background thread; no read
waits): the ids go in batches of :data:`BATCH`, or what gathered once the oldest is
:data:`FLUSH_AFTER` seconds old (checked at the next read), and the rest at :meth:`close`
(a mount's unmount). The spoke counts them as reads of its cache
(``spoke/local_reads_api.py``). A server without that route (a hub) is not told again.
"""

from __future__ import annotations

import threading
import time

from fabric.client.advice import Advice
from fabric.client.http import HttpPlane
from fabric.errors import NotFound

BATCH = 1024
FLUSH_AFTER = 1.0
#: Batches waiting to be sent, at most (more are dropped).
QUEUED = 16


class LocalReadReports(Advice[list[bytes]]):
    def __init__(self, plane: HttpPlane, repo: str) -> None:
        self._plane, self._repo = plane, repo
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._since = 0.0
        self._useless = False  # the server has no such route
        super().__init__(QUEUED, "fabric-local-reads")

    def read(self, cid: bytes) -> None:
        """Chunk ``cid`` was read from the spoke's files."""
        if self._useless:
            return
        now = time.monotonic()
        with self._lock:
            if not self._pending:
                self._since = now
            self._pending.append(cid)
            if len(self._pending) < BATCH and now - self._since < FLUSH_AFTER:
                return
            batch, self._pending = self._pending, []
        self.offer(batch)

    def close(self) -> None:
        """Send what gathered, then stop (waiting a few seconds at most)."""
        with self._lock:
            batch, self._pending = self._pending, []
        if batch and not self._useless:
            self.offer(batch)
        super().close()

    def send(self, ids: list[bytes]) -> None:
        if self._useless:
            return
        try:
            self._plane.report_local_reads(self._repo, ids)
        except NotFound:
            self._useless = True
