"""Reads around the page cache (``O_DIRECT``): a mount's ``--cache-dir``.

A chunk read back from a mount's cache directory is handed to the kernel for the page
cache of the mounted file; read through the cache directory's page cache too, it would be
cached twice, and on a virtual machine filling that second cache costs about as much CPU
as the rest of the read path (bench/RESULTS.md, issue 21). ``O_DIRECT`` asks for an
aligned buffer, offset and length: a read is widened to whole blocks, into a page-aligned
buffer of the calling thread's, and the caller gets a view of the bytes it asked for. File
systems without ``O_DIRECT`` (tmpfs) are read the ordinary way.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading

ALIGN = 4096


class DirectReader:
    """Reads ranges of files of at most ``limit`` bytes each, with ``O_DIRECT`` where the file
    system allows it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.direct = hasattr(os, "O_DIRECT")
        self._local = threading.local()

    def read(self, path: str, offset: int, length: int) -> memoryview:
        """Bytes ``[offset, offset + length)`` of ``path`` (fewer at its end): a view valid
        until this thread's next read. OSError as ``open`` raises it (FileNotFoundError when
        the file is gone); ValueError for a range longer than the limit."""
        if length > self.limit or offset < 0 or length < 0:
            raise ValueError(f"cannot read {length} bytes at {offset}: at most {self.limit} at a time")
        if self.direct:
            try:
                return self._read_direct(path, offset, length)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False  # the file system refuses O_DIRECT: read it buffered from now on
        fd = os.open(path, os.O_RDONLY)
        try:
            return memoryview(os.pread(fd, length, offset))
        finally:
            os.close(fd)

    def _buffer(self) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:  # page-aligned, as O_DIRECT needs; room for a range widened at both ends
            buf = self._local.buf = memoryview(mmap.mmap(-1, self.limit + 2 * ALIGN))
        return buf

    def _read_direct(self, path: str, offset: int, length: int) -> memoryview:
        start = offset - offset % ALIGN
        end = -(-(offset + length) // ALIGN) * ALIGN
        buf = self._buffer()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.preadv(fd, [buf[: end - start]], start)
        finally:
            os.close(fd)
        skip = offset - start
        return buf[skip : max(skip, min(n, skip + length))]
