"""Where a spoke's ``--cache`` directory keeps its chunk cache: the spoke writes it, and the
mounts beside it (``fabric mount --spoke-cache``, which the CSI driver passes) read it."""

from __future__ import annotations

import os


def chunk_dir(cache_dir: str) -> str:
    """The :class:`~fabric.cache.disk.DiskCache` of chunk frames under a spoke's ``cache_dir``."""
    return os.path.join(cache_dir, "chunks")


def holds_chunk_cache(cache_dir: str) -> bool:
    """Whether ``cache_dir`` is a spoke's cache directory (one that has started)."""
    return os.path.isdir(chunk_dir(cache_dir))
