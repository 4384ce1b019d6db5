"""Turning bytes into chunks, on whichever side of the wire the bytes are.

A :class:`ChunkSink` is where new chunks go: a :class:`~fabric.engine.chunkstore.PackSession`
on the hub, or a remote session that asks the hub which chunks it lacks and
uploads packs of only those (see :mod:`fabric.client.http`).

A sparse file is fed as runs (:func:`ingest_runs`): its data regions are chunked
as usual, each on its own, and each hole becomes one ``(HOLE_ID, n)`` item of the
chunk list, hashed, sent and stored nowhere (readers serve it as zeros).
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, Protocol

from fabric.format import chunking, frames, packs
from fabric.format.model import FILE, HOLE_ID, Entry

#: Holes shorter than this are better chunked as data (zeros dedup to a few chunks).
HOLE_MIN = 64 * 1024

#: A region of a file: ``(stream, n)`` is ``n`` bytes of data read from ``stream``,
#: ``(None, n)`` a hole of ``n`` zero bytes.
Run = tuple[BinaryIO | None, int]


class ChunkSink(Protocol):
    new_chunks: int  # chunks taken
    new_bytes: int  # their raw bytes
    stored_bytes: int  # their bytes as frames (compressed)

    def filter_new(self, ids: Sequence[bytes]) -> set[bytes]:
        """Which of ``ids`` the destination lacks and this sink has not taken yet."""

    def add_many(self, pairs: Sequence[tuple[bytes, bytes | memoryview]]) -> None:
        """Take chunks ``(id, raw)`` that :meth:`filter_new` reported as new (a sink may
        compress them together)."""

    def close(self) -> None:
        """Flush; after it returns every chunk taken is stored at the destination."""


class Ingester:
    """Chunks streams into a sink, asking the sink about many chunks at once.

    Chunks of every stream fed are held until ``READ_WINDOW`` bytes are pending,
    then one :meth:`ChunkSink.filter_new` call covers them all, so a batch of
    small files costs one question, not one per file. Call :meth:`flush` before
    the chunk lists are used (committed).
    """

    def __init__(self, sink: ChunkSink) -> None:
        self.sink = sink
        self._window: list[tuple[bytes, memoryview]] = []
        self._pending = 0

    def feed(self, stream: BinaryIO) -> tuple[list[tuple[bytes, int]], str]:
        """Chunk one stream; return its chunk list and MD5."""
        md5 = hashlib.md5()
        chunks: list[tuple[bytes, int]] = []
        self._chunk(stream, chunks, md5)
        return chunks, md5.hexdigest()

    def feed_bytes(self, data: bytes) -> tuple[list[tuple[bytes, int]], str]:
        """Chunk content already in memory (a small file read whole); the same chunk list and
        MD5 as :meth:`feed` of a stream of ``data``."""
        # Content no longer than the minimum chunk is one chunk: the cutter is not asked.
        pieces = (memoryview(data),) if 0 < len(data) <= chunking.MIN_CHUNK else chunking.cut(data)
        chunks: list[tuple[bytes, int]] = []
        for piece in pieces:
            self._take(piece, chunks)
        return chunks, hashlib.md5(data).hexdigest()

    def feed_runs(self, runs: Sequence[Run]) -> tuple[list[tuple[bytes, int]], str]:
        """Chunk one file given as data runs and holes; return its chunk list and ETag.

        Each data run is chunked on its own (chunk boundaries fall at the edges of
        holes); each hole is one ``(HOLE_ID, n)`` item, its bytes never hashed. The
        ETag is the MD5 of the content when there is no hole, else :func:`sparse_etag`."""
        sparse = any(stream is None for stream, _ in runs)
        md5 = None if sparse else hashlib.md5()
        chunks: list[tuple[bytes, int]] = []
        for stream, n in runs:
            if stream is None:
                if n:
                    chunks.append((HOLE_ID, n))
            else:
                self._chunk(stream, chunks, md5)
        if md5 is not None:
            return chunks, md5.hexdigest()
        return chunks, sparse_etag(chunks, len(runs))

    def _chunk(self, stream: BinaryIO, chunks: list[tuple[bytes, int]], md5: hashlib._Hash | None) -> None:
        for piece in chunking.cut_stream(stream):
            if md5 is not None:
                md5.update(piece)
            self._take(piece, chunks)

    def _take(self, piece: memoryview, chunks: list[tuple[bytes, int]]) -> None:
        cid = chunking.chunk_id(piece)
        chunks.append((cid, len(piece)))
        self._window.append((cid, piece))
        self._pending += len(piece)
        if self._pending >= chunking.READ_WINDOW:
            self.flush()

    def flush(self) -> None:
        send_new(self.sink, self._window)
        self._window.clear()
        self._pending = 0


class StreamChunker:
    """Chunks content fed in order, block by block, sending each finished chunk to a sink as
    soon as it is cut, so that the end of a long write costs only its last chunk.

    The chunk list and MD5 are those of ingesting the whole content at once (the
    unfinished last chunk of each block is cut again with the next block). Memory: one
    block plus one unfinished chunk, and the sink's partial pack. :meth:`finish` may be
    called at any point and again later: content fed afterwards extends the same file.
    Not thread-safe: one thread feeds at a time.
    """

    def __init__(self, new_sink: Callable[[], ChunkSink]) -> None:
        self._new_sink = new_sink
        self._sink: ChunkSink | None = None
        self._carry = b""  # the unfinished last chunk
        self._chunks: list[tuple[bytes, int]] = []
        self._md5 = hashlib.md5()

    def feed(self, block: bytes | memoryview) -> None:
        """Cut ``block`` after what was fed before; send every chunk but the last, which may still grow."""
        if not len(block):
            return
        pieces = list(chunking.cut(self._carry + bytes(block) if self._carry else block))
        done = pieces[:-1]
        ids = [chunking.chunk_id(p) for p in done]
        for cid, piece in zip(ids, done):
            self._md5.update(piece)
            self._chunks.append((cid, len(piece)))
        self._send(list(zip(ids, done)))
        self._carry = bytes(pieces[-1])

    def finish(self) -> tuple[list[tuple[bytes, int]], str]:
        """The chunk list and MD5 of everything fed so far, every chunk stored at the sink's destination."""
        chunks = list(self._chunks)
        md5 = self._md5.copy()
        if self._carry:  # the last chunk ends where the content does, for now
            cid = chunking.chunk_id(self._carry)
            md5.update(self._carry)
            chunks.append((cid, len(self._carry)))
            self._send([(cid, self._carry)])
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.close()
        return chunks, md5.hexdigest()

    def _send(self, pairs: list[tuple[bytes, bytes | memoryview]]) -> None:
        if pairs:
            if self._sink is None:
                self._sink = self._new_sink()
            send_new(self._sink, pairs)


def send_new(sink: ChunkSink, pairs: Sequence[tuple[bytes, bytes | memoryview]]) -> None:
    """Add to ``sink`` the chunks of ``pairs`` its destination lacks (one question for all of them)."""
    if not pairs:
        return
    new = sink.filter_new([cid for cid, _ in pairs])
    fresh = []
    for cid, data in pairs:
        if cid in new:
            new.discard(cid)
            fresh.append((cid, data))
    sink.add_many(fresh)


def ingest_stream(stream: BinaryIO, sink: ChunkSink) -> tuple[list[tuple[bytes, int]], str]:
    """Chunk a stream into ``sink`` with bounded memory; return its chunk list and MD5."""
    ingester = Ingester(sink)
    result = ingester.feed(stream)
    ingester.flush()
    return result


def ingest_runs(runs: Sequence[Run], sink: ChunkSink) -> tuple[list[tuple[bytes, int]], str]:
    """Chunk a file given as runs (see :meth:`Ingester.feed_runs`) into ``sink``."""
    ingester = Ingester(sink)
    result = ingester.feed_runs(runs)
    ingester.flush()
    return result


def sparse_etag(chunks: Sequence[tuple[bytes, int]], runs: int) -> str:
    """The ETag of a file stored with holes: the MD5 of its chunk list, ``-`` and its number of runs.

    Like the ETag of an S3 object uploaded in parts, it is no MD5 of the content
    (which would cost hashing every zero of the holes), so clients do not check it
    as one; it changes whenever the content does (chunk ids are content hashes)."""
    md5 = hashlib.md5()
    for cid, n in chunks:
        md5.update(cid)
        md5.update(n.to_bytes(8, "big"))
    return f"{md5.hexdigest()}-{runs}"


def file_entry(
    chunks: Sequence[tuple[bytes, int]],
    md5: str,
    mode: int = 0o644,
    mtime_ns: int = 0,
    meta: Mapping[str, str] | None = None,
) -> Entry:
    """A file entry with its chunk list inline (the hub moves long lists into their own object)."""
    return Entry(FILE, sum(n for _, n in chunks), mode, mtime_ns, md5=md5, chunks=tuple(chunks), meta=dict(meta or {}))


class Boundaries:
    """Where the pieces of a stream end, by the bytes passed in all: at ``first``, then twice
    that and so on up to ``full``, then at each multiple of ``full`` (a slow start that keeps
    the boundaries of pieces of the full size). Not thread-safe."""

    def __init__(self, first: int, full: int) -> None:
        self._full = full
        self._next = min(first, full)
        self._passed = 0  # bytes of the pieces ended so far

    def reached(self, size: int) -> bool:
        """Whether the piece being filled, now ``size`` bytes, ends here (then the next begins)."""
        if self._passed + size < self._next:
            return False
        self._passed += size
        while self._next <= self._passed:
            self._next = min(2 * self._next, self._full) if self._next < self._full else self._next + self._full
        return True


class PackSession:
    """A :class:`ChunkSink` that frames new chunks into packs and hands each full pack on.

    ``missing`` answers which ids the destination lacks; ``deliver`` stores a
    full pack (the hub's pack store, or an upload to a server). Safe to use
    from many threads; chunks already taken by this session are skipped.
    After :meth:`close` returns every chunk added has been delivered.

    A batch of at least :data:`~fabric.format.frames.BATCH_MIN` chunks (many small
    files) is compressed by a background thread, which holds no GIL meanwhile, while
    the caller goes on reading the next batch; its frames go into packs at the next
    :meth:`add_many` or at :meth:`close`. Several threads may add at once; the session
    holds the batches they started and not yet put, usually one.
    """

    def __init__(
        self,
        missing: Callable[[Sequence[bytes]], list[bytes]],
        deliver: Callable[[packs.PackBuilder], None],
        target_size: int,
        first_size: int | None = None,
    ) -> None:
        """``first_size``: a slow start. Packs end where the bytes delivered in all reach
        ``first_size``, then twice that, and so on up to ``target_size``, then each multiple of
        ``target_size``: the first bytes reach a link sooner, and from there on packs end where
        packs of the full size would."""
        self._missing = missing
        self._deliver = deliver
        self._ends = Boundaries(first_size or target_size, target_size)
        self._builder = packs.PackBuilder()
        self._taken: set[bytes] = set()
        self._lock = threading.Lock()
        self._compressor: ThreadPoolExecutor | None = None
        #: Batches compressing in the background: their ids, raw chunks and compression.
        self._compressing: deque[tuple[list[bytes], list[bytes | memoryview], Future[Any]]] = deque()
        self.new_chunks = 0
        self.new_bytes = 0
        self.stored_bytes = 0

    def filter_new(self, ids: Sequence[bytes]) -> set[bytes]:
        with self._lock:
            unknown = [cid for cid in ids if cid not in self._taken]
        return set(self._missing(unknown)) if unknown else set()

    def add(self, cid: bytes, raw: bytes | memoryview) -> None:
        with self._lock:
            if cid in self._taken:
                return
            self._taken.add(cid)
        self._put(cid, raw, frames.encode(raw))  # compression runs outside the lock

    def add_many(self, pairs: Sequence[tuple[bytes, bytes | memoryview]]) -> None:
        """:meth:`add` of each ``(id, raw)``; a large batch is compressed in the background."""
        ids: list[bytes] = []
        raws: list[bytes | memoryview] = []
        with self._lock:
            for cid, raw in pairs:
                if cid not in self._taken:
                    self._taken.add(cid)
                    ids.append(cid)
                    raws.append(raw)
        if len(ids) < frames.BATCH_MIN:
            for cid, raw, frame in zip(ids, raws, frames.encode_many(raws)):
                self._put(cid, raw, frame)
            return
        # The previous batch's output is freed before this one's is made: the compressing
        # thread's heap then holds one batch's output, not two.
        self._put_compressed()
        with self._lock:
            if self._compressor is None:
                self._compressor = ThreadPoolExecutor(1, thread_name_prefix="fabric-compress")
            self._compressing.append((ids, raws, self._compressor.submit(frames.compress_batch, raws, 1)))

    def _put_compressed(self) -> None:
        """Put the frames of the batches being compressed in the background, waiting for each."""
        while True:
            with self._lock:
                if not self._compressing:
                    return
                ids, raws, future = self._compressing.popleft()
            for cid, raw, frame in zip(ids, raws, frames.frame_batch(raws, future.result())):
                self._put(cid, raw, frame)

    def _put(self, cid: bytes, raw: bytes | memoryview, frame: bytes) -> None:
        full = None
        with self._lock:
            self._builder.add(cid, frame)
            self.new_chunks += 1
            self.new_bytes += len(raw)
            self.stored_bytes += len(frame)
            if self._ends.reached(self._builder.size):
                full, self._builder = self._builder, packs.PackBuilder()
        if full is not None:
            self._deliver(full)

    def close(self) -> None:
        try:
            self._put_compressed()
        finally:
            self._stop_compressor()
        with self._lock:
            last, self._builder = self._builder, packs.PackBuilder()
        if len(last):
            self._deliver(last)

    def _stop_compressor(self) -> None:
        with self._lock:
            compressor, self._compressor = self._compressor, None
        if compressor is not None:
            compressor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> PackSession:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._stop_compressor()
