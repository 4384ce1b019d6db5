"""What a cache remembers of blobs it evicted: when each was last read.

A blob stored again then comes with its *reuse distance*, the bytes read between its last
read before eviction and now. A cache compares it with how long its own least recently read
blob has gone unread (LIRS's comparison of one block's reuse distance with another's
recency): a blob that comes back sooner than that displaces it, one that comes back later
does not. That keeps part of a cyclic scan of any length, where a fixed age limit drops
everything once the cycle is longer than the limit.
"""

from __future__ import annotations

from collections import OrderedDict

#: How many evictions a cache remembers: those of 4 x its budget in 64 KiB chunks (a loop of
#: up to about 4 x the cache keeps part of itself), within these bounds. An entry takes about
#: 150 bytes (78 MiB at the most), and entries are only made by evictions.
GHOSTS_MIN = 4096
GHOSTS_MAX = 1 << 19
GHOST_BUDGETS = 4
TYPICAL_BLOB = 64 * 1024


def ghosts_for(budget: int) -> int:
    """How many evicted blobs a cache of ``budget`` bytes remembers."""
    return min(max(GHOST_BUDGETS * budget // TYPICAL_BLOB, GHOSTS_MIN), GHOSTS_MAX)


class Ghosts:
    """Evicted blobs' last reads, by the first 8 bytes of their ids (a clash only misjudges
    one reuse distance). Not thread-safe: the cache calls it under its own lock."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._last: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def evicted(self, key: bytes, last_read: int) -> None:
        """``key`` left the cache; it was last read at clock ``last_read``."""
        ghost = int.from_bytes(key[:8], "little")
        self._last.pop(ghost, None)  # remembered anew, at the end
        self._last[ghost] = last_read
        if len(self._last) > self._limit:
            self._last.popitem(last=False)

    def reuse_distance(self, key: bytes, clock: int) -> int:
        """Bytes read since ``key`` was last read before its eviction, at clock ``clock``
        (0: not remembered); the cache forgets it here, as the blob is back."""
        last = self._last.pop(int.from_bytes(key[:8], "little"), None)
        return 0 if last is None else max(clock - last, 1)
