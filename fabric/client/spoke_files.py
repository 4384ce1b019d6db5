"""Chunks read from the cache files of the spoke a client runs beside (``fabric mount
--spoke-cache``, ``fabric://`` with ``spoke_cache=``).

A spoke keeps each cached chunk as a frame file, ``CACHE/chunks/XX/<id>`` (see
:class:`fabric.cache.disk.DiskCache`). A client on the same machine reads those files itself
instead of asking the spoke to read and send them over HTTP: about half the CPU of a warm
read goes into that hop (bench/RESULTS.md, "Warm restore through a spoke"). DESIGN.md §7
allows it.

Only reads: the spoke still owns its cache (it writes, evicts and checks the files), and
still serves the client's metadata and every chunk these files lack. A file gone meanwhile
(evicted), unreadable (permissions) or damaged is a miss: the chunk comes over HTTP, and
the spoke finds the damage itself when it next reads the file. The spoke hears of the
reads through ``on_read`` (:mod:`fabric.client.local_reads`). Every chunk is checked
against its id (:func:`fabric.format.frames.decode`), so a directory that is not the spoke's
cannot make the client serve wrong bytes.

A batch's files are read through the page cache, all asked of the disk at once. A mount
read them around it (``O_DIRECT``), one after another, until a spoke's cold files read that
way came at 0.66-0.81x the speed of these batches (bench/RESULTS.md, "A loader on the
spoke's machine reads the spoke's files"): the spoke's own reads share these pages, so they
are no second copy of what the spoke would cache anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable

from fabric.cache.spoke_layout import chunk_dir, holds_chunk_cache
from fabric.errors import BadRequest, Corruption
from fabric.format import frames
from fabric.format.chunking import MAX_CHUNK

log = logging.getLogger("fabric.client")

#: A failing read of the spoke's files is logged at most this often (seconds).
LOG_INTERVAL = 60.0
#: Files :meth:`SpokeFiles.read_many` holds open at once.
OPEN_AT_ONCE = 256
#: The most bytes a frame file holds.
FRAME_MAX = MAX_CHUNK + frames.HEADER_LEN


class SpokeFiles:
    def __init__(self, cache_dir: str, on_read: Callable[[bytes], None] | None = None) -> None:
        """``cache_dir``: the spoke's ``--cache`` directory (BadRequest unless it holds a chunk
        cache); ``on_read(id)`` hears of each chunk read from it."""
        self.root = chunk_dir(cache_dir)
        if not holds_chunk_cache(cache_dir):
            raise BadRequest(f"{cache_dir!r} is not a spoke's cache directory (it has no chunks/ directory)")
        self._logged = float("-inf")
        self._on_read = on_read

    def _path(self, cid: bytes) -> str:
        h = cid.hex()
        return os.path.join(self.root, h[:2], h)

    def read_many(self, cids: Iterable[bytes]) -> dict[bytes, bytes]:
        """The chunks of ``cids`` the spoke's files hold, each checked against its id. The
        files of :data:`OPEN_AT_ONCE` ids at a time are opened and the kernel is asked to read
        them all (``POSIX_FADV_WILLNEED``) before the first is read, so the disk reads of a
        batch of cold files overlap instead of following each other."""
        ids = list(dict.fromkeys(cids))
        out: dict[bytes, bytes] = {}
        for at in range(0, len(ids), OPEN_AT_ONCE):
            opened: list[tuple[bytes, int]] = []
            try:
                for cid in ids[at : at + OPEN_AT_ONCE]:
                    fd = self._open_ahead(cid)
                    if fd is not None:
                        opened.append((cid, fd))
                for cid, fd in opened:
                    data = self._read(cid, fd)
                    if data is not None:
                        out[cid] = data
            finally:
                for _, fd in opened:
                    os.close(fd)
        return out

    def _open_ahead(self, cid: bytes) -> int | None:
        """A descriptor of ``cid``'s file, the kernel told to read it; None when there is none."""
        try:
            fd = os.open(self._path(cid), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn(f"chunk {cid.hex()} not read from the spoke's cache files ({exc}); asking the spoke")
            return None
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return fd

    def _read(self, cid: bytes, fd: int) -> bytes | None:
        """The chunk in the frame file open as ``fd``, checked against its id (and the read
        reported); None when the file is unreadable or damaged."""
        try:
            data = frames.decode(os.pread(fd, FRAME_MAX, 0), cid)
        except (OSError, Corruption) as exc:
            self._warn(f"chunk {cid.hex()} not read from the spoke's cache files ({exc}); asking the spoke")
            return None
        if self._on_read is not None:
            self._on_read(cid)
        return data

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._logged >= LOG_INTERVAL:
            self._logged = now
            log.warning(message)
