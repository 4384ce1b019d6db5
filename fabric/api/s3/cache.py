"""A small time-limited cache for the gateway's lookups (bucket bindings, credentials, branches)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class TTLCache:
    """A tiny thread-safe cache of recent answers (bucket bindings, credentials)."""

    def __init__(self, ttl: float, limit: int = 10000) -> None:
        self.ttl = ttl
        self.limit = limit
        self._items: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._items.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = compute()
        with self._lock:
            if len(self._items) >= self.limit:
                self._items.clear()
            self._items[key] = (now + self.ttl, value)
        return value

    def drop(self, key: Any = None) -> None:
        with self._lock:
            if key is None:
                self._items.clear()
            else:
                self._items.pop(key, None)
