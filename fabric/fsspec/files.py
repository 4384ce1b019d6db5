"""Open files of ``fabric://``: reads by whole chunks with readahead, writes chunked and sent
while they are written and staged on close."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from fsspec.spec import AbstractBufferedFile

from fabric.cache.files import MIN_SIZE
from fabric.cache.lru import BytesLRU
from fabric.cache.seeds import CopySeeder
from fabric.client.copies import LocalCopy
from fabric.format.ingest import StreamChunker, file_entry
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
#: While a file is read sequentially, each request also takes up to this many bytes of the
#: chunks after the range asked for (kept with the file's decoded chunks): fewer requests.
MAX_READ_AHEAD = 16 * 1024 * 1024
#: Where the blocks of files being written are chunked, hashed, compressed and sent (each
#: file feeds one block at a time, in order, while the application fills the next): this
#: process's pool (a forked child, a DataLoader worker, starts its own: threads do not
#: survive a fork, and a pool whose thread is gone would never run what it is given).
_chunkers: tuple[int, ThreadPoolExecutor] | None = None
_chunkers_lock = threading.Lock()


def _chunker_pool() -> ThreadPoolExecutor:
    global _chunkers
    with _chunkers_lock:
        if _chunkers is None or _chunkers[0] != os.getpid():
            _chunkers = (os.getpid(), ThreadPoolExecutor(4, thread_name_prefix="fabric-fsspec-write"))
        return _chunkers[1]


class FabricReadFile(AbstractBufferedFile):
    """One version of a file (the chunk list it had at open), read at any offset.

    Each read fetches the whole chunks that cover the range fsspec's cache asks for (the
    range read plus ``block_size`` of readahead by default) in one ``frames`` request, and
    keeps the last few decoded chunks. While the ranges asked for follow each other, a
    request also takes the chunks after its range (as many bytes as the range, doubling from
    one range to the next up to :data:`MAX_READ_AHEAD`), so the next range is mostly at hand
    and a sequential reader makes half the requests or fewer, each larger. A range
    elsewhere (a seek) fetches only what it covers. Memory: the decoded chunks kept, at most
    ``CHUNK_CACHE_BYTES + 2 * MAX_READ_AHEAD``."""

    DEFAULT_BLOCK_SIZE = DEFAULT_BLOCK_SIZE

    def __init__(self, fs: FabricFileSystem, path: str, loc: Location, entry: Entry, info: dict[str, Any], **kwargs: Any) -> None:
        self._loc = loc
        self._map = chunks.ChunkMap(entry)
        self._chunks = BytesLRU(CHUNK_CACHE_BYTES + 2 * MAX_READ_AHEAD)
        self._follows = -1  # where the last range fetched ended: a range starting there reads on
        self._ahead = 0  # bytes fetched beyond the range asked for, while ranges follow each other
        super().__init__(fs, path, mode="rb", size=entry.size, **kwargs)
        self.details = info

    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        self._ahead = min(max(2 * self._ahead, end - start), MAX_READ_AHEAD) if start == self._follows else 0
        self._follows = end
        ids = self._map.ids_for(start, end)
        if self._ahead and not all(cid in self._chunks for cid in ids):
            ids += self._map.ids_for(end, min(self.size, end + self._ahead))
        with fs_errors(self.path):
            got = chunks.fetch(self.fs.plane, self._loc.repo, ids, self._chunks, self.fs.spoke_files(self._loc.repo))
        return self._map.assemble(start, end, got)


class FabricWriteFile(AbstractBufferedFile):
    """A file written to a branch. Each full block (``block_size``) is chunked and its new
    chunks sent to the server in the background while the application writes the next one
    (:class:`~fabric.format.ingest.StreamChunker`); on close the last chunk is sent and the
    file staged as one entry, then committed if the file system has ``commit=``. Memory:
    two blocks, one unfinished chunk and one partial pack. Leaving a ``with`` block by an
    exception stages nothing (chunks already sent are left to the server's gc).

    With ``seeds`` (the file system's ``copies``), the blocks are also written, in the same
    background step, to a local file, which becomes the version's copy once staged
    (:class:`~fabric.cache.seeds.CopySeeder`: a link, summed and flushed in the background)."""

    DEFAULT_BLOCK_SIZE = DEFAULT_BLOCK_SIZE

    def __init__(self, fs: FabricFileSystem, path: str, loc: Location, mode: str, seeds: CopySeeder | None = None,
                 **kwargs: Any) -> None:
        self._loc = loc
        self._chunker = StreamChunker(lambda: fs.plane.chunk_sink(loc.repo))
        self._feeding: Future | None = None
        self._seeds = seeds
        self._local: LocalCopy | None = None
        super().__init__(fs, path, mode=mode, **kwargs)

    def _fed(self) -> None:
        """Wait for the block being chunked (its failure is this write's)."""
        feeding, self._feeding = self._feeding, None
        if feeding is not None:
            with fs_errors(self.path):
                feeding.result()

    def _upload_chunk(self, final: bool = False) -> bool:
        block = self.buffer.getvalue()
        self._fed()
        if self._seeds is not None and self.offset == 0 and (not final or len(block) >= MIN_SIZE):
            self._local = LocalCopy(self._seeds)  # (a file large enough to be copied)
        if block:
            self._feeding = _chunker_pool().submit(self._feed, block)
        if final and self.autocommit:
            self.commit()
        return True

    def _feed(self, block: bytes) -> None:
        self._chunker.feed(block)
        if self._local is not None:
            self._local.write(block)

    def commit(self) -> None:
        """Stage what was written (called on close, or by fsspec's transaction at its end)."""
        try:
            self._fed()
            with fs_errors(self.path):
                chunks, md5 = self._chunker.finish()
            entry = file_entry(chunks, md5, mtime_ns=time.time_ns())
            self.fs._stage_file(self._loc, entry)
        except BaseException:
            if self._local is not None:
                self._local.drop()
            raise
        if self._local is not None:
            self._local.seed(entry)

    def discard(self) -> None:
        feeding, self._feeding = self._feeding, None
        if feeding is not None and not feeding.cancel():
            feeding.exception()  # wait for it; its outcome no longer matters
        if self._local is not None:
            self._local.drop()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()
            self.closed = True
