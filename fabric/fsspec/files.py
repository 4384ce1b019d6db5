"""Open files of ``fabric://``: reads by whole chunks with readahead, writes staged on close."""

from __future__ import annotations

import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from fsspec.spec import AbstractBufferedFile

from fabric.cache.lru import BytesLRU
from fabric.format.model import Entry
from fabric.fsspec import chunks
from fabric.fsspec.errors import fs_errors
from fabric.fsspec.locations import Location

if TYPE_CHECKING:
    from fabric.fsspec.filesystem import FabricFileSystem

#: Bytes a read asks for beyond what was read (fsspec's readahead cache) and per write buffer.
DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
#: Decoded chunks an open file keeps, so reads that share a chunk fetch it once.
CHUNK_CACHE_BYTES = 8 * 1024 * 1024
#: A file being written stays in memory up to this size, then goes to a temporary file.
SPOOL_BYTES = 16 * 1024 * 1024


class FabricReadFile(AbstractBufferedFile):
    """One version of a file (the chunk list it had at open), read at any offset.

    Each read fetches the whole chunks that cover the range fsspec's cache asks for (the
    range read plus ``block_size`` of readahead by default) in one ``frames`` request, and
    keeps the last few decoded chunks."""

    DEFAULT_BLOCK_SIZE = DEFAULT_BLOCK_SIZE

    def __init__(self, fs: FabricFileSystem, path: str, loc: Location, entry: Entry, info: dict[str, Any], **kwargs: Any) -> None:
        self._loc = loc
        self._map = chunks.ChunkMap(entry)
        self._chunks = BytesLRU(CHUNK_CACHE_BYTES)
        super().__init__(fs, path, mode="rb", size=entry.size, **kwargs)
        self.details = info

    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        with fs_errors(self.path):
            got = chunks.fetch(self.fs.plane, self._loc.repo, self._map.ids_for(start, end), self._chunks)
        return self._map.assemble(start, end, got)


class FabricWriteFile(AbstractBufferedFile):
    """A file written to a branch: kept locally (memory, then a temporary file) and stored
    with one ``put_object`` on close, then committed if the file system has ``commit=``.
    Leaving a ``with`` block by an exception stores nothing."""

    DEFAULT_BLOCK_SIZE = DEFAULT_BLOCK_SIZE

    def __init__(self, fs: FabricFileSystem, path: str, loc: Location, mode: str, **kwargs: Any) -> None:
        self._loc = loc
        self._spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        super().__init__(fs, path, mode=mode, **kwargs)

    def _upload_chunk(self, final: bool = False) -> bool:
        self.buffer.seek(0)
        shutil.copyfileobj(self.buffer, self._spool)
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self) -> None:
        """Store what was written (called on close, or by fsspec's transaction at its end)."""
        self._spool.seek(0)
        try:
            self.fs._store(self._loc, self._spool)
        finally:
            self._spool.close()

    def discard(self) -> None:
        self._spool.close()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()
            self.closed = True
