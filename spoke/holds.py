"""Pins held for a while: chunks uploaded for writes whose entries have not come yet."""

from __future__ import annotations

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
        """Hold ``ids`` for ``seconds`` (default: this holder's, at most it) from now. Batches
        must end in the order they are added (holds taken over from before a restart, whose
        remains are shorter, come first)."""
        ends = time.monotonic() + (self.seconds if seconds is None else min(seconds, self.seconds))
        with self._lock:
            self._batches.append((ends, list(ids)))

    def expired(self) -> list[bytes]:
        now = time.monotonic()
        out: list[bytes] = []
        with self._lock:
            while self._batches and self._batches[0][0] <= now:
                out += self._batches.popleft()[1]
        return out
