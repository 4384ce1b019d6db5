"""Caches of immutable bytes: an in-memory LRU bounded in bytes (:mod:`.lru`) and
an on-disk cache with a byte budget, scan resistance and pinning (:mod:`.disk`).

They know nothing of what they hold beyond a name and its bytes.

May import: :mod:`fabric.util`, :mod:`fabric.errors`.
"""
