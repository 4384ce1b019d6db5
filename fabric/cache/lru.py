"""A thread-safe in-memory LRU of byte strings, bounded in bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict


class BytesLRU:
    """Least recently used out first; never holds more than ``budget`` bytes.

    Values larger than ``max_item`` (default: the whole budget) are not kept.
    """

    def __init__(self, budget: int, max_item: int | None = None) -> None:
        self.budget = budget
        self.max_item = budget if max_item is None else max_item
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return data

    def put(self, key: bytes, data: bytes) -> None:
        if len(data) > self.max_item:
            return
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return
            self._items[key] = data
            self.size += len(data)
            while self.size > self.budget:
                _, old = self._items.popitem(last=False)
                self.size -= len(old)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._items
