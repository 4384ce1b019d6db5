"""Pins held for a while: chunks uploaded for writes whose entries have not come yet."""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Iterable


class Holds:
    """Batches of chunk ids, each held for ``seconds`` from when it was added; :meth:`expired`
    hands out (once) the ids of the batches whose time is up, for their pins to be released."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._batches: collections.deque[tuple[float, list[bytes]]] = collections.deque()  # (ends, ids), in time order

    def add(self, ids: Iterable[bytes], seconds: float | None = None) -> None:
        """Hold ``ids`` for ``seconds`` (default: this holder's) from now."""
        ends = time.monotonic() + (self.seconds if seconds is None else seconds)
        with self._lock:
            bisect.insort(self._batches, (ends, list(ids)), key=lambda batch: batch[0])

    def expired(self) -> list[bytes]:
        now = time.monotonic()
        out: list[bytes] = []
        with self._lock:
            while self._batches and self._batches[0][0] <= now:
                out += self._batches.popleft()[1]
        return out
