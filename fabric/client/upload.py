"""A chunk sink for a server across a link: the caller's thread never waits on a round trip.

A :class:`~fabric.format.ingest.PackSession` asks the destination which chunks it
lacks and uploads full packs in the thread that adds them. Over a WAN that puts
every question (one round trip) and every pack upload (round trip plus the pack's
time on the link) in series with reading and hashing the files: at 50 ms RTT a
1.3 GiB import waited about 8 s on questions alone.

:class:`PipelinedSink` takes the chunks offered to it in batches and hands each
batch to a few background threads, which ask the question, frame (compress) the
chunks the server lacks and upload the packs, while the caller reads on. Memory is
bounded: at most :data:`DEPTH` batches of :data:`BATCH_BYTES` are held (the first
batches are smaller: a slow start, so that the first pack is uploaded early), and a
caller that gets further ahead waits for a batch to finish. The first error of a
background batch is raised by the next :meth:`~PipelinedSink.add` or by
:meth:`~PipelinedSink.close`; nothing is committed by a sink, so a failed import
leaves the branch as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from fabric.format.ingest import Boundaries, PackSession
from fabric.util.inflight import Inflight

#: Raw bytes of chunks per background batch (one question to the server each).
BATCH_BYTES = 8 * 1024 * 1024
#: The first batch's bytes: batches end at this many bytes offered in all, then twice that and so on
#: up to :data:`BATCH_BYTES`, then at its multiples (:class:`~fabric.format.ingest.Boundaries`), so
#: that the first chunks are on their way while the caller is still cutting the rest.
FIRST_BATCH_BYTES = 1024 * 1024
#: Batches in flight at once: while one thread uploads a pack, others ask and compress.
DEPTH = 3


class PipelinedSink:
    """A :class:`~fabric.format.ingest.ChunkSink` that asks and uploads in background threads.

    :meth:`filter_new` answers without asking the server: every id this sink has not
    been offered yet counts as new, and :meth:`add` queues its bytes; the background
    batch then asks the server and sends only what it lacks. The counters
    (``new_chunks``, ``new_bytes``, ``stored_bytes``) count chunks actually sent, and
    are final once :meth:`close` returns. Safe to use from many threads.
    """

    def __init__(
        self, session: PackSession, batch_bytes: int = BATCH_BYTES, depth: int = DEPTH, first_batch_bytes: int = FIRST_BATCH_BYTES
    ) -> None:
        """``session``: the sink the background batches feed (it asks, frames and delivers); the
        batches start at ``first_batch_bytes`` and grow to ``batch_bytes`` (:data:`FIRST_BATCH_BYTES`)."""
        self._session = session
        self._ends = Boundaries(first_batch_bytes, batch_bytes)
        self._lock = threading.Lock()
        self._offered: set[bytes] = set()
        self._batch: list[tuple[bytes, bytes]] = []
        self._pending = 0
        self._inflight = Inflight(depth, "fabric-upload")  # bounds the bytes held: add() waits for a batch to finish

    @property
    def new_chunks(self) -> int:
        return self._session.new_chunks

    @property
    def new_bytes(self) -> int:
        return self._session.new_bytes

    @property
    def stored_bytes(self) -> int:
        return self._session.stored_bytes

    def filter_new(self, ids: Sequence[bytes]) -> set[bytes]:
        with self._lock:
            new = {cid for cid in ids if cid not in self._offered}
            self._offered.update(new)
        return new

    def add(self, cid: bytes, raw: bytes | memoryview) -> None:
        self._inflight.raise_error()
        with self._lock:
            self._batch.append((cid, bytes(raw)))  # the caller may reuse its buffer
            self._pending += len(raw)
            batch = self._take_batch() if self._ends.reached(self._pending) else None
        if batch:
            self._dispatch(batch)

    def add_many(self, pairs: Sequence[tuple[bytes, bytes | memoryview]]) -> None:
        for cid, raw in pairs:
            self.add(cid, raw)

    def close(self) -> None:
        with self._lock:
            batch = self._take_batch()
        if batch:
            self._dispatch(batch)
        try:
            self._inflight.wait()
            self._session.close()
        finally:
            self._inflight.close()

    def __enter__(self) -> PipelinedSink:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._inflight.close()

    def _take_batch(self) -> list[tuple[bytes, bytes]]:
        batch, self._batch, self._pending = self._batch, [], 0
        return batch

    def _dispatch(self, batch: list[tuple[bytes, bytes]]) -> None:
        self._inflight.submit(lambda: self._send(batch))

    def _send(self, batch: list[tuple[bytes, bytes]]) -> None:
        new = self._session.filter_new([cid for cid, _ in batch])
        self._session.add_many([(cid, data) for cid, data in batch if cid in new])
