"""Chunks read from the cache files of the spoke a mount runs beside (``--spoke-cache``).

A spoke keeps each cached chunk as a frame file, ``CACHE/chunks/XX/<id>`` (see
:class:`fabric.cache.disk.DiskCache`). A mount on the same machine reads those files itself
instead of asking the spoke to read and send them over HTTP: about half the CPU of a warm
read goes into that hop (bench/RESULTS.md, "Warm restore through a spoke"). DESIGN.md §7
allows it.

Only reads: the spoke still owns its cache (it writes, evicts and checks the files), and
still serves the mount's metadata and every chunk these files lack. A file gone meanwhile
(evicted), unreadable (permissions) or damaged is a miss: the chunk comes over HTTP, and
the spoke finds the damage itself when it next reads the file. The spoke hears of the
reads through ``on_read`` (``fuse/local_reads.py``). Every chunk is checked
against its id (:func:`fabric.format.frames.decode`), so a directory that is not the spoke's
cannot make the mount serve wrong bytes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from fabric.cache.spoke_layout import chunk_dir, holds_chunk_cache
from fabric.errors import BadRequest, Corruption
from fabric.format import frames
from fabric.format.chunking import MAX_CHUNK
from fabric.util.direct_io import DirectReader

log = logging.getLogger("fabric.fuse")

#: A failing read of the spoke's files is logged at most this often (seconds).
LOG_INTERVAL = 60.0


class SpokeFiles:
    def __init__(self, cache_dir: str, on_read: Callable[[bytes], None] | None = None) -> None:
        """``cache_dir``: the spoke's ``--cache`` directory (BadRequest unless it holds a chunk
        cache); ``on_read(id)`` hears of each chunk read from it."""
        self.root = chunk_dir(cache_dir)
        if not holds_chunk_cache(cache_dir):
            raise BadRequest(f"--spoke-cache {cache_dir!r} is not a spoke's cache directory (it has no chunks/ directory)")
        self._reader = DirectReader(MAX_CHUNK + frames.HEADER_LEN)
        self._logged = float("-inf")
        self._on_read = on_read

    def read(self, cid: bytes) -> bytes | None:
        """Chunk ``cid`` from the spoke's files, checked against its id; None when they lack it."""
        h = cid.hex()
        try:
            frame = self._reader.read(os.path.join(self.root, h[:2], h), 0, self._reader.limit)
            data = frames.decode(frame, cid)
        except FileNotFoundError:
            return None
        except (OSError, Corruption) as exc:
            self._warn(f"chunk {h} not read from the spoke's cache files ({exc}); asking the spoke")
            return None
        if self._on_read is not None:
            self._on_read(cid)
        return data

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._logged >= LOG_INTERVAL:
            self._logged = now
            log.warning(message)
