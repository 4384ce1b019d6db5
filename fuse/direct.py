"""Whole small files read around the page cache (``O_DIRECT``): the chunk files of a
mount's ``--cache-dir``.

A chunk read back from the cache directory is handed to the kernel for the page cache
of the mounted file; read through the cache directory's page cache too, it would be
cached twice, and on a virtual machine filling that second cache costs about as much CPU
as the rest of the read path (bench/RESULTS.md, issue 21). File systems without
``O_DIRECT`` (tmpfs) are read the ordinary way.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading

from fabric.format.chunking import MAX_CHUNK

ALIGN = 4096
#: Larger than any chunk file, so a read that fills it means the file is not a chunk.
BUFFER = MAX_CHUNK + ALIGN


class DirectReader:
    """Reads files of at most :data:`MAX_CHUNK` bytes whole, with ``O_DIRECT`` where allowed,
    into a page-aligned buffer of the calling thread's."""

    def __init__(self) -> None:
        self.direct = hasattr(os, "O_DIRECT")
        self._local = threading.local()

    def read(self, path: str, size: int | None = None) -> memoryview:
        """The bytes of ``path`` (at most about ``size`` of them, when the caller knows what
        size it should have): a view valid until this thread's next read (OSError as ``open``
        raises it: FileNotFoundError when gone)."""
        if self.direct:
            try:
                return self._read_direct(path, BUFFER if size is None else min(-(-size // ALIGN) * ALIGN, BUFFER))
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False  # the file system refuses O_DIRECT: read it buffered from now on
        with open(path, "rb", buffering=0) as f:
            return memoryview(f.read())

    def _read_direct(self, path: str, length: int) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(mmap.mmap(-1, BUFFER))  # page-aligned, as O_DIRECT needs
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.preadv(fd, [buf[:length]], 0)  # asking for more than the file costs pinned and zeroed pages
        finally:
            os.close(fd)
        if n >= BUFFER:  # only when no size was given: the caller's check catches a file longer than its size
            raise OSError(errno.EFBIG, f"{path} is larger than a chunk")
        return buf[:n]
