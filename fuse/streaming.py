"""Chunking a file while it is written, so that fsync costs only its tail.

A file written from its start, in order (a checkpoint shard, a log, a tar being
extracted), is chunked, hashed, compressed and sent to the server by a
background worker while the application is still writing: each time
:data:`STEP` new bytes are on the local disk, a worker reads them back (from the
page cache), cuts them with the same content-defined chunker as a whole-file
ingest, and hands the finished chunks to a :class:`~fabric.format.ingest.ChunkSink`
of the mount's plane, which uploads packs of the chunks the server lacks. At
fsync or close :meth:`ContentStream.finish` chunks what the worker has not
reached yet plus the unfinished last chunk, closes the sink (every chunk stored)
and returns the chunk list and MD5, which are exactly those a whole-file
ingest of the same bytes gives (the same boundaries: the unfinished tail of each
step is cut again with the next one).

Anything else breaks the stream and the file is chunked whole at its next sync,
as before: a write below what the worker has claimed (an overwrite), a write
past the end (a hole), a truncate below the claimed bytes or past the end,
fallocate, or any failure of the worker or the sink. The chunks already sent
for a broken stream are garbage the server's gc reclaims.

Memory is bounded per mount, not per file: :class:`StreamPool` runs at most
``workers`` steps at once (each holds one read window, :data:`READ_WINDOW`,
plus one unfinished chunk) and admits at most ``max_streams`` files (default 8,
one per rank of a node), each with at most one partial pack in its sink (16 MiB
for an HTTP plane): about 150 MiB in all. A file beyond that is synced whole.

Locking: a stream's ``mu`` orders a write's check, its ``pwrite`` and the new
end against the worker's claim of the bytes it will read, so the worker never
reads bytes a write is changing. The chunk list, MD5 and carried tail belong to
whichever single thread consumes (the worker, or ``finish`` once the worker is
idle).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fabric.format import chunking
from fabric.format.ingest import ChunkSink, StreamChunker

log = logging.getLogger("fabric.mount")

#: New bytes that start a background step (and the least a step chunks).
STEP = 4 * 1024 * 1024
#: At most this many bytes are read back and cut at a time.
READ_WINDOW = chunking.READ_WINDOW

Chunks = list[tuple[bytes, int]]


class StreamPool:
    """The background workers of one mount and the cap on files streamed at once."""

    def __init__(self, workers: int = 2, max_streams: int = 8) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="fabric-stream")
        self._slots = threading.BoundedSemaphore(max_streams)
        self._lock = threading.Lock()
        self.streamed_bytes = 0  # bytes chunked in the background, before any sync asked
        self.finished = 0  # syncs served from a stream
        self.broken = 0  # streams given up (the file was synced whole)

    def open(self, fd: int, new_sink: Callable[[], ChunkSink]) -> ContentStream | None:
        """A stream for an empty file open on ``fd``, or None when ``max_streams`` are open."""
        if not self._slots.acquire(blocking=False):
            return None
        return ContentStream(fd, new_sink, self)

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"streamed_bytes": self.streamed_bytes, "finished": self.finished, "broken": self.broken}

    def submit(self, fn: Callable[[], None]) -> None:
        self._executor.submit(fn)

    def release(self) -> None:
        self._slots.release()

    def shutdown(self) -> None:
        """Let the steps queued run out (each ends a stream's ``_running``), then stop the workers."""
        self._executor.shutdown(wait=True)


class ContentStream:
    """One file being chunked while it is written (see the module docstring)."""

    def __init__(self, fd: int, new_sink: Callable[[], ChunkSink], pool: StreamPool) -> None:
        self.fd = fd
        self._pool = pool
        self.mu = threading.Lock()
        self._idle = threading.Condition(self.mu)
        self.end = 0  # the file's size, as its writes and truncates made it
        self.claimed = 0  # bytes handed to the chunker
        self.broken = False
        self._running = False  # a worker step is queued or running
        self._paused = False  # finish() is consuming: no new steps
        self._chunker = StreamChunker(new_sink)  # used by one consuming thread at a time

    # -- the writer's side (called with the file's lock held) ---------------------------
    def write(self, data: bytes | memoryview, offset: int) -> int:
        """``pwrite`` ``data`` at ``offset``; breaks the stream unless it lands at or past the
        claimed bytes and leaves no hole."""
        with self.mu:
            if offset < self.claimed or offset > self.end:
                self._break_locked()
            n = os.pwrite(self.fd, data, offset)
            self.end = max(self.end, offset + n)
        self._kick()
        return n

    def truncate(self, length: int) -> None:
        with self.mu:
            if length < self.claimed or length > self.end:
                self._break_locked()
            os.ftruncate(self.fd, length)
            self.end = length

    def give_up(self) -> None:
        """Break the stream (the file is about to change in a way it cannot follow)."""
        with self.mu:
            self._break_locked()

    def close(self) -> None:
        """End the stream with its file: returns once no step reads the file's descriptor
        (a step running stops after its window), so the caller may close it."""
        with self.mu:
            self._break_locked(count=False)
            self._wait_idle_locked()

    def finish(self) -> tuple[Chunks, str] | None:
        """The chunk list and MD5 of the whole file, every chunk stored at the server; None when
        the stream is broken (the caller chunks the file whole). The stream goes on afterwards:
        later appends extend it."""
        with self.mu:
            self._paused = True
            self._wait_idle_locked()
            if self.broken:
                self._paused = False
                return None
            start, stop = self.claimed, self.end
            self.claimed = stop
        try:
            self._consume(start, stop)
            chunks, md5 = self._chunker.finish()
        except Exception as exc:  # the caller falls back to chunking the file whole
            log.warning("streamed chunking failed, the file is chunked whole: %s", exc)
            self.give_up()
            return None
        finally:
            with self.mu:
                self._paused = False
        self._pool.count(finished=1)
        return chunks, md5

    # -- the worker ---------------------------------------------------------------------
    def _kick(self) -> None:
        with self.mu:
            if self._running or self._paused or self.broken or self.end - self.claimed < STEP:
                return
            self._running = True
        try:
            self._pool.submit(self._run)
        except RuntimeError:  # the pool is shut down (the mount is going away): sync whole
            with self.mu:
                self._running = False
                self._break_locked()
                self._idle.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self.mu:
                    if self.broken or self._paused or self.end - self.claimed < STEP:
                        return
                    start = self.claimed
                    stop = self.claimed = min(self.end, start + READ_WINDOW)
                self._consume(start, stop)
                self._pool.count(streamed_bytes=stop - start)
        except Exception as exc:
            log.warning("streamed chunking failed, the file will be chunked whole: %s", exc)
            self.give_up()
        finally:
            with self.mu:
                self._running = False
                self._idle.notify_all()

    def _consume(self, start: int, stop: int) -> None:
        """Read ``[start, stop)`` back from the local file and feed it to the chunker."""
        while start < stop:
            n = min(READ_WINDOW, stop - start)
            block = os.pread(self.fd, n, start)
            if len(block) != n:
                raise OSError(f"short read of the local file: {len(block)} of {n} bytes at {start}")
            self._chunker.feed(block)
            start += n

    def _break_locked(self, count: bool = True) -> None:
        """Give the stream up (once): its slot in the pool is free again."""
        if not self.broken:
            self.broken = True
            self._pool.release()
            if count:
                self._pool.count(broken=1)

    def _wait_idle_locked(self) -> None:
        while self._running:
            self._idle.wait()
