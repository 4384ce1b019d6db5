"""Chunk caches of a mount: a bounded in-memory LRU and an optional on-disk cache.

Chunks are immutable and named by their content (BLAKE3), so a cached chunk
never goes stale: both caches are keyed by chunk id and need no coherence.
The disk cache verifies what it reads back against the id, so a damaged
cache file is dropped and fetched again, never served.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

from fabric.chunking import chunk_id

log = logging.getLogger("fabric.fuse")


class DiskCache:
    """Chunks as files under ``root`` (``ab/abcdef...``), bounded by ``budget`` bytes.

    The index of what is cached (and the LRU order) is rebuilt from the
    directory at start, oldest access first. Writes go to a temporary name
    and are renamed into place, so a crash never leaves a partial chunk
    under its id.
    """

    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        self.size = 0
        self._index: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()
        os.makedirs(root, exist_ok=True)
        found = []
        for sub in os.scandir(root):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for f in os.scandir(sub.path):
                if f.name.endswith(".tmp"):
                    os.unlink(f.path)
                    continue
                try:
                    st = f.stat()
                    found.append((st.st_atime, bytes.fromhex(f.name), st.st_size))
                except (ValueError, OSError):
                    continue
        for _, cid, n in sorted(found):
            self._index[cid] = n
            self.size += n
        self._evict()

    def __contains__(self, cid: bytes) -> bool:
        return cid in self._index

    def _path(self, cid: bytes) -> str:
        h = cid.hex()
        return os.path.join(self.root, h[:2], h)

    def get(self, cid: bytes) -> bytes | None:
        with self._lock:
            if cid not in self._index:
                return None
            self._index.move_to_end(cid)
        try:
            with open(self._path(cid), "rb") as f:
                data = f.read()
        except OSError:
            data = None
        if data is None or chunk_id(data) != cid:
            log.warning("disk cache: dropping damaged chunk %s", cid.hex())
            self._drop(cid)
            return None
        return data

    def put(self, cid: bytes, data: bytes) -> None:
        with self._lock:
            if cid in self._index or len(data) > self.budget:
                return
        path = self._path(cid)
        tmp = f"{path}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("disk cache: cannot store chunk %s: %s", cid.hex(), exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        with self._lock:
            if cid not in self._index:
                self._index[cid] = len(data)
                self.size += len(data)
            self._evict()

    def _drop(self, cid: bytes) -> None:
        with self._lock:
            n = self._index.pop(cid, None)
            if n is not None:
                self.size -= n
        try:
            os.unlink(self._path(cid))
        except OSError:
            pass

    def _evict(self) -> None:
        # Called with the lock held (or from __init__).
        while self.size > self.budget and self._index:
            cid, n = self._index.popitem(last=False)
            self.size -= n
            try:
                os.unlink(self._path(cid))
            except OSError:
                pass
