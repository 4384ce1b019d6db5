"""Reading the files of an import into a chunk sink: many small files cheaply, large ones in parallel.

The cost of a small file is not its bytes but its system calls and the
Python work around them, which holds the GIL. Threads that make many short
system calls each take and give back the GIL on every one of them, and on a
few cores they spend more time handing it over than working (a convoy: 710,000
futex calls for 100,000 files of 1 KiB in three threads). So files up to
:data:`SMALL_FILE` are read whole with one ``read`` call each (open, read,
close: no ``fstat``, no buffered reader) by the importing thread alone, in
batches that share one question to the sink about which chunks it lacks;
files above it are streamed through a pool of :data:`WORKERS` threads
meanwhile, where hashing and compressing large buffers runs without the GIL.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypeVar

from fabric.format.ingest import ChunkSink, Ingester, file_entry
from fabric.format.model import Entry
from fabric.util.progress import Progress

WORKERS = min(8, (os.cpu_count() or 2) + 1)
#: Files up to this size are read whole, in one call, by one thread.
SMALL_FILE = 1024 * 1024
#: A task of the pool reads at most this many bytes or files; small files share one
#: question to the sink per task (per :data:`~fabric.format.chunking.READ_WINDOW` of data).
BATCH_BYTES = 8 * 1024 * 1024
BATCH_FILES = 4096

T = TypeVar("T")


class FileToRead(Protocol):
    @property
    def path(self) -> str: ...  # its path in the repository
    @property
    def abspath(self) -> str: ...
    @property
    def size(self) -> int: ...  # as the walk saw it
    @property
    def mode(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...


def ingest_files(files: Sequence[FileToRead], sink: ChunkSink, progress: Progress) -> Iterator[tuple[str, Entry]]:
    """Chunk each file into ``sink``; yield ``(path, entry)`` per file, in no fixed order.

    Small files are read in the calling thread, large ones by a pool meanwhile.
    Every chunk of a yielded entry has been offered to the sink (call the sink's
    ``close`` before committing). The first error (a file that vanished, a read
    that failed) is raised and the files not started yet are not read."""
    small = sorted((f for f in files if f.size <= SMALL_FILE), key=lambda f: f.path)
    large = sorted((f for f in files if f.size > SMALL_FILE), key=lambda f: f.path)

    def read_large(batch: list[FileToRead]) -> list[tuple[str, Entry]]:
        ingester = Ingester(sink)
        out = []
        for f in batch:
            with open(_open_regular(f.abspath), "rb", buffering=0) as stream:
                chunks, md5 = ingester.feed(_Counting(stream, progress))
            out.append((f.path, file_entry(chunks, md5, f.mode, f.mtime_ns)))
        ingester.flush()
        return out

    with ThreadPoolExecutor(WORKERS) as pool:
        futures: deque[Future[list[tuple[str, Entry]]]] = deque(
            pool.submit(read_large, b) for b in batches(large, lambda f: f.size)
        )
        try:
            for batch in batches(small, lambda f: f.size):
                yield from _read_small(batch, sink, progress)
            while futures:
                yield from futures[0].result()
                futures.popleft()  # its entries are the caller's now
        finally:
            for future in futures:
                future.cancel()


def _read_small(batch: list[FileToRead], sink: ChunkSink, progress: Progress) -> list[tuple[str, Entry]]:
    """Read, chunk and store a batch of small files in this thread (one question to the sink)."""
    ingester = Ingester(sink)
    out = []
    for f in batch:
        chunks, md5 = _feed_small(f, ingester, progress)
        out.append((f.path, file_entry(chunks, md5, f.mode, f.mtime_ns)))
    ingester.flush()
    return out


def _feed_small(f: FileToRead, ingester: Ingester, progress: Progress) -> tuple[list[tuple[bytes, int]], str]:
    """Chunk a file the walk saw ``f.size`` bytes long: one ``read`` of ``size + 1`` bytes gets
    all of it, unless it changed size since; then it is streamed from its start."""
    fd = _open_regular(f.abspath)
    try:
        data = os.read(fd, f.size + 1)
        if len(data) == f.size:
            progress.advance(len(data))
            return ingester.feed_bytes(data)
        os.lseek(fd, 0, os.SEEK_SET)
        with open(fd, "rb", buffering=0, closefd=False) as stream:
            return ingester.feed(_Counting(stream, progress))
    finally:
        os.close(fd)


def _open_regular(path: str) -> int:
    """A descriptor of the file the walk found: a symlink swapped in since is refused (ELOOP),
    never followed out of the imported tree."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)


def batches(items: Sequence[T], size_of: Callable[[T], int]) -> Iterator[list[T]]:
    """``items`` in runs of at most :data:`BATCH_BYTES` (or one larger item) and :data:`BATCH_FILES`."""
    batch: list[T] = []
    size = 0
    for item in items:
        if batch and (size + size_of(item) > BATCH_BYTES or len(batch) >= BATCH_FILES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += size_of(item)
    if batch:
        yield batch


class _Counting:
    """A file wrapper that reports bytes read to a progress bar."""

    def __init__(self, f, progress: Progress) -> None:
        self._f = f
        self._progress = progress

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._progress.advance(len(data))
        return data
