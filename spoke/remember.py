"""Answers from the hub kept for a while, and kept longer while the hub is away."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fabric.errors import NotFound, Unavailable


class Remembered:
    """``get(key, fetch)``: a fresh answer (younger than ``ttl``), else ``fetch()``;
    when the hub cannot be reached, the last answer however old. A NotFound from
    the hub forgets the key."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, fetch: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._items.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        try:
            value = fetch()
        except Unavailable:
            if hit is not None:
                return hit[1]
            raise
        except NotFound:
            self.forget(key)
            raise
        with self._lock:
            self._items[key] = (now, value)
        return value

    def forget(self, key: Any) -> None:
        with self._lock:
            self._items.pop(key, None)
