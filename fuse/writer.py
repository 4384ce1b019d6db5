"""Local state of files being written through a ``--rw`` mount.

Writes go to a temporary file on the mount's local disk (``--write-dir``);
nothing crosses the network per ``write()``. A :class:`WFile` is created when
a file is created or opened for writing and lives until its content is
staged on the branch and its last handle is closed. While it lives, every
read and stat of its path inside the mount is served from it
(read-your-writes).

Syncing (on ``close``, ``fsync``, ``release``, and before a rename) chunks
the temporary file with :func:`fabric.format.ingest.ingest_stream` into the data
plane's :meth:`~fabric.plane.dataplane.DataPlane.chunk_sink`, which sends only the
chunks the server lacks, closes the sink (every chunk stored), and returns
the file entry that the filesystem stages with
:meth:`~fabric.plane.dataplane.DataPlane.stage`.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

from fabric.format.ingest import ingest_stream
from fabric.format.model import FILE, Entry
from fuse.reader import FileReader

#: The MD5 of no bytes: the ETag of an empty file.
EMPTY_MD5 = hashlib.md5(b"").hexdigest()
COPY_BLOCK = 4 * 1024 * 1024


class _FdStream:
    """A read-only stream over a file descriptor from offset 0 (positioned reads, no shared offset)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.pos = 0
        self.size = size

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data


class WFile:
    """One file being written: its local content, attributes, and whether the server has them."""

    def __init__(
        self,
        path: str,
        base: Entry | None,
        write_dir: str,
        mode: int,
        uid: int,
        gid: int,
        now_ns: int | None = None,
    ) -> None:
        now = now_ns or time.time_ns()
        self.path: str | None = path
        self.base = base  # the staged/committed version the content starts from (None: a new file)
        self.write_dir = write_dir
        self.fd: int | None = None  # local copy of the content, once materialized
        self.size = base.size if base else 0
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.mtime_ns = base.mtime_ns if base else now
        self.ctime_ns = now
        self.atime_ns = now
        self.meta = dict(base.meta) if base else {}
        self.opens = 0
        self.generation = 1  # bumped by every change
        self.synced_generation = 0 if base is None else 1  # a new file is not on the server yet
        self.content_generation = 1  # generation of the last content change
        self.synced_content = 0 if base is None else 1
        self.unlinked = False
        self.syncing = 0  # the generation being staged right now (0: none)
        self.lock = threading.RLock()
        self.last_error: BaseException | None = None
        if base is None:
            self._new_fd()

    # -- state -------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return self.synced_generation != self.generation

    @property
    def on_server(self) -> bool:
        """Has some version of this path been staged (so an unlink must stage a delete)?"""
        return self.base is not None

    def touch(self, content: bool = True) -> None:
        now = time.time_ns()
        self.generation += 1
        if content:
            self.mtime_ns = now
            self.content_generation = self.generation
        self.ctime_ns = now

    # -- content -----------------------------------------------------------------
    def _new_fd(self) -> None:
        fd = os.open(self.write_dir, os.O_RDWR | os.O_TMPFILE, 0o600) if hasattr(os, "O_TMPFILE") else -1
        if fd < 0:  # pragma: no cover - filesystems without O_TMPFILE
            import tempfile

            fd, name = tempfile.mkstemp(dir=self.write_dir)
            os.unlink(name)
        self.fd = fd

    def materialize(self, fetch_reader: FileReader | None) -> None:
        """Copy the base content into the local file (before the first change to it)."""
        if self.fd is not None:
            return
        self._new_fd()
        if self.base is None or self.base.size == 0 or fetch_reader is None:
            return
        pos = 0
        while pos < self.base.size:
            data = fetch_reader.read(pos, COPY_BLOCK)
            if not data:
                break
            os.pwrite(self.fd, data, pos)
            pos += len(data)

    def read(self, offset: int, size: int) -> bytes:
        assert self.fd is not None
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        return os.pread(self.fd, end - offset, offset)

    def write(self, data: bytes, offset: int) -> int:
        assert self.fd is not None
        n = os.pwrite(self.fd, data, offset)
        self.size = max(self.size, offset + n)
        self.touch()
        return n

    def truncate(self, length: int) -> None:
        assert self.fd is not None
        os.ftruncate(self.fd, length)
        self.size = length
        self.touch()

    def allocate(self, offset: int, length: int) -> None:
        assert self.fd is not None
        os.posix_fallocate(self.fd, offset, length)
        if offset + length > self.size:
            self.size = offset + length
            self.touch()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # -- turning it into an entry ------------------------------------------------
    def attrs_entry(self) -> Entry:
        """The base entry with this file's current attributes (content unchanged)."""
        assert self.base is not None
        return self.base.with_(mode=self.mode, uid=self.uid, gid=self.gid, mtime_ns=self.mtime_ns, meta=dict(self.meta))

    def build_entry(self, sink) -> Entry:
        """Chunk the local content into ``sink`` (not closed here) and return the file entry."""
        if self.fd is None:
            return self.attrs_entry()
        if self.size == 0:
            chunks: list[tuple[bytes, int]] = []
            md5 = EMPTY_MD5
        else:
            chunks, md5 = ingest_stream(_FdStream(self.fd, self.size), sink)  # type: ignore[arg-type]
        return Entry(
            FILE,
            self.size,
            self.mode,
            self.mtime_ns,
            uid=self.uid,
            gid=self.gid,
            md5=md5,
            chunks=tuple(chunks),
            meta=dict(self.meta),
        )

    def stat_entry(self) -> Entry:
        """An entry describing the current state, for getattr (no chunk list)."""
        return Entry(FILE, self.size, self.mode, self.mtime_ns, uid=self.uid, gid=self.gid, meta=self.meta)
