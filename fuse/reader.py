"""Chunk-level reads: whole chunks fetched in batches, ahead of the kernel.

A mount never pays a network round trip per kernel read. A file's entry
(from :meth:`~fabric.plane.dataplane.DataPlane.stat_chunks` or a whole-entry listing)
lists its chunks; :class:`Fetcher` gets chunks from the memory cache, the
disk cache, or the server with one :meth:`~fabric.plane.dataplane.DataPlane.frames`
request for many ids, verifies each frame against its id
(:func:`fabric.format.frames.decode`) and shares in-flight fetches between readers.
:class:`FileReader` serves ``read(offset, size)`` from whole chunks and keeps
a readahead window of chunk requests running ahead of a sequential reader.
A hole of a sparse file (:data:`~fabric.format.model.HOLE_ID`) is never fetched:
it reads as zeros.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from fabric.cache.lru import BytesLRU
from fabric.cache.packs import PackCache
from fabric.client.spoke_files import SpokeFiles
from fabric.errors import Corruption
from fabric.format import frames
from fabric.format.model import HOLE_ID
from fabric.plane.dataplane import DataPlane
from fabric.plane.retry import RetryingPlane
from fuse.outage import result

log = logging.getLogger("fabric.fuse")

#: One frames request carries at most this many raw bytes (a few pack reads at the server).
BATCH_BYTES = 4 * 1024 * 1024
BATCH_IDS = 512
#: Files up to this size are fetched whole on their first read.
WHOLE_FILE = 2 * 1024 * 1024
#: The readahead window starts here and doubles with each sequential read.
FIRST_WINDOW = 1024 * 1024
#: Zeros shared by the reads of holes (a longer piece of a hole is made anew).
ZEROS = bytes(1024 * 1024)


def chunk_disk_cache(root: str, budget: int) -> PackCache:
    """The ``--cache-dir`` of a mount: raw chunks in packs, put once checked against their ids
    (:func:`~fabric.format.frames.decode`), checked against their records when read back."""
    return PackCache(root, budget)


class Fetcher:
    """Where chunk bytes come from: memory, disk, then the server (batched, deduplicated).

    Every chunk being loaded has one future in ``_inflight``, owned by the thread that
    loads it; other readers of it wait on that future. Readahead fetches only what the
    disk cache lacks: a chunk on disk is read when it is needed, by
    :meth:`read_cached_into` straight into the kernel's buffer when a read covers it whole
    (the neighbours in a pack with one read).
    """

    def __init__(
        self,
        plane: RetryingPlane,
        memory: BytesLRU,
        disk: PackCache | None = None,
        workers: int = 4,
        repo: str | None = None,
        spoke_files: SpokeFiles | None = None,
    ) -> None:
        """``repo``: the repository the chunks are read for (a token for some repositories
        may fetch only their chunks). ``spoke_files``: the cache files of the spoke mounted,
        when it runs on this machine (read before asking it over HTTP)."""
        self.plane = plane
        self.repo = repo
        self.memory = memory
        self.disk = disk
        self.spoke_files = spoke_files
        self._inflight: dict[bytes, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="fabric-fetch")
        self.fetched_chunks = 0
        self.fetched_bytes = 0
        self.requests = 0
        self.disk_chunks = 0  # chunks read back from the disk cache

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def get(self, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """The bytes of every chunk in ``ids``; loads what memory lacks, in this thread."""
        out: dict[bytes, bytes] = {}
        mine: list[bytes] = []
        waits: list[tuple[bytes, Future]] = []
        for cid in dict.fromkeys(ids):
            data = self.memory.get(cid)
            if data is not None:
                out[cid] = data
                continue
            with self._lock:
                fut = self._inflight.get(cid)
                if fut is None:
                    self._inflight[cid] = Future()
                    mine.append(cid)
                else:
                    waits.append((cid, fut))
        if mine:
            out.update(self._load(mine))
        for cid, fut in waits:
            # Another thread fetches it: during an outage, waiting for it is waiting for the server.
            out[cid] = result(getattr(self.plane, "health", None), fut)
        return out

    def loading(self, cid: bytes) -> bool:
        """Whether chunk ``cid`` is being fetched (or read from disk) now."""
        return cid in self._inflight

    def read_cached_into(self, pairs: Sequence[tuple[bytes, memoryview]]) -> set[bytes]:
        """Copy chunks (each ``len(dst)`` bytes) from the disk cache into their buffers,
        verified, without keeping them in memory; the ids served. Not served: those memory has
        or is loading, and those the disk cache lacks or holds damaged (dropped): :meth:`get` them."""
        if self.disk is None:
            return set()
        todo = [(cid, dst) for cid, dst in pairs if cid not in self.memory and cid not in self._inflight]
        served = self.disk.read_into(todo) if todo else set()
        self.disk_chunks += len(served)
        return served

    def prefetch(self, chunks: Iterable[tuple[bytes, int]]) -> int:
        """Start fetching chunks in the background (batched); returns the bytes requested."""
        batch: list[bytes] = []
        size = 0
        total = 0
        for cid, n in chunks:
            if cid == HOLE_ID or cid in self.memory or (self.disk is not None and cid in self.disk):
                continue
            with self._lock:
                if cid in self._inflight:
                    continue
                self._inflight[cid] = Future()
            batch.append(cid)
            size += n
            if size >= BATCH_BYTES or len(batch) >= BATCH_IDS:
                self._submit(batch)
                total += size
                batch, size = [], 0
        if batch:
            self._submit(batch)
            total += size
        return total

    def _submit(self, batch: list[bytes]) -> None:
        try:
            self._pool.submit(self._fetch_quiet, batch)
        except RuntimeError:  # shut down
            self._fail(batch, RuntimeError("fetcher closed"))

    def _fetch_quiet(self, ids: list[bytes]) -> None:
        try:
            self._load(ids, disk=False)  # prefetch left out what the disk cache holds
        except Exception as exc:  # noqa: BLE001 - the waiting readers get the error
            log.debug("readahead of %d chunks failed: %s", len(ids), exc)

    def _load(self, ids: list[bytes], disk: bool = True) -> dict[bytes, bytes]:
        """Load chunks whose futures this thread owns: from the disk cache (unless ``disk`` is
        False), then the spoke's files, the rest from the server."""
        got: dict[bytes, bytes] = {}
        missing = ids
        try:
            if disk and self.disk is not None:
                missing = []
                for cid in ids:
                    data = self.disk.read(cid)
                    if data is None:
                        missing.append(cid)
                        continue
                    self.disk_chunks += 1
                    self._loaded(got, cid, data)
            if missing and self.spoke_files is not None:
                for cid, data in self.spoke_files.read_many(missing).items():
                    self._loaded(got, cid, data)
                missing = [cid for cid in missing if cid not in got]
        except BaseException as exc:
            self._fail([c for c in ids if c not in got], exc)
            raise
        if missing:
            got.update(self._fetch(missing))
        return got

    def _loaded(self, got: dict[bytes, bytes], cid: bytes, data: bytes) -> None:
        got[cid] = data
        self.memory.put(cid, data)
        self._resolve(cid, data)

    def _resolve(self, cid: bytes, data: bytes) -> None:
        with self._lock:
            fut = self._inflight.pop(cid, None)
        if fut is not None:
            fut.set_result(data)

    def _fetch(self, ids: list[bytes]) -> dict[bytes, bytes]:
        """Fetch chunks whose futures this thread owns; resolve them (or fail them)."""
        got: dict[bytes, bytes] = {}
        corrupt_retries = 1

        def attempt(plane: DataPlane) -> None:
            remaining = [cid for cid in ids if cid not in got]
            if not remaining:
                return
            self.requests += 1
            for cid, frame in plane.frames(remaining, repo=self.repo):
                if cid in got or cid not in self._inflight:
                    continue
                data = frames.decode(frame, cid)
                got[cid] = data
                self.memory.put(cid, data)
                if self.disk is not None:
                    self.disk.put(cid, data)
                self.fetched_chunks += 1
                self.fetched_bytes += len(data)
                self._resolve(cid, data)
            lacking = [cid for cid in ids if cid not in got]
            if lacking:
                raise Corruption(f"the server did not send chunk {lacking[0].hex()} ({len(lacking)} missing)")

        while True:
            try:
                self.plane.retried(attempt)
                return got
            except Corruption as exc:
                if corrupt_retries > 0:
                    corrupt_retries -= 1
                    log.warning("refetching after a bad chunk: %s", exc.message)
                    continue
                self._fail([c for c in ids if c not in got], exc)
                raise
            except BaseException as exc:
                self._fail([c for c in ids if c not in got], exc)
                raise

    def _fail(self, ids: Sequence[bytes], exc: BaseException) -> None:
        with self._lock:
            futs = [self._inflight.pop(cid, None) for cid in ids]
        for fut in futs:
            if fut is not None and not fut.done():
                fut.set_exception(exc)


class FileReader:
    """Reads of one immutable file version: whole chunks, sequential readahead."""

    def __init__(self, fetcher: Fetcher, chunks: Sequence[tuple[bytes, int]], readahead: int) -> None:
        self.fetcher = fetcher
        self.ids = [cid for cid, _ in chunks]
        self.lengths = [n for _, n in chunks]
        self.offsets = [0]
        for n in self.lengths:
            self.offsets.append(self.offsets[-1] + n)
        self.size = self.offsets[-1]
        self.readahead = max(readahead, 0)
        self.window = FIRST_WINDOW
        self.max_end = 0
        self.ahead = 0  # chunks [0, ahead) have been requested already
        self._lock = threading.Lock()

    def read_into(self, dst: memoryview, offset: int) -> int:
        """Copy ``[offset, offset + len(dst))`` into ``dst`` (the kernel's buffer); returns
        the bytes copied (fewer at the end of the file). A chunk the read covers whole is
        copied from the disk cache straight into ``dst`` when it is there; the others go
        through the fetcher (and its memory cache)."""
        if offset >= self.size or len(dst) <= 0:
            return 0
        end = min(offset + len(dst), self.size)
        first = bisect.bisect_right(self.offsets, offset) - 1
        last = bisect.bisect_left(self.offsets, end)  # exclusive
        if self.size > WHOLE_FILE:
            self._read_ahead(offset, end, last)
        rest: list[int] = []
        whole: list[tuple[int, memoryview]] = []
        for i in range(first, last):
            cid = self.ids[i]
            lo, hi, at = self._span(i, offset, end)
            if cid == HOLE_ID:
                dst[at : at + hi - lo] = memoryview(ZEROS)[: hi - lo] if hi - lo <= len(ZEROS) else bytes(hi - lo)
            elif lo == 0 and hi == self.lengths[i]:
                whole.append((i, dst[at : at + hi]))
            else:
                rest.append(i)
        served = self.fetcher.read_cached_into([(self.ids[i], view) for i, view in whole]) if whole else set()
        rest = sorted(rest + [i for i, _ in whole if self.ids[i] not in served])
        if rest:
            if self.size <= WHOLE_FILE:  # small: the rest of it in one request, later reads from memory
                ids = [c for c in self.ids if c != HOLE_ID and c not in served]
            else:
                ids = [self.ids[i] for i in rest]
            got = self.fetcher.get(ids)
            for i in rest:
                lo, hi, at = self._span(i, offset, end)
                dst[at : at + hi - lo] = memoryview(got[self.ids[i]])[lo:hi]
        return end - offset

    def _span(self, i: int, offset: int, end: int) -> tuple[int, int, int]:
        """Chunk ``i``'s part of ``[offset, end)``: ``(lo, hi)`` within the chunk, and where it goes."""
        base = self.offsets[i]
        lo, hi = max(offset, base) - base, min(end, self.offsets[i + 1]) - base
        return lo, hi, base + lo - offset

    def read(self, offset: int, size: int) -> bytes:
        buf = bytearray(max(0, min(size, self.size - offset)))
        self.read_into(memoryview(buf), offset)
        return bytes(buf)

    def _read_ahead(self, offset: int, end: int, last: int) -> None:
        if not self.readahead:
            self.ahead = max(self.ahead, last)
            return
        with self._lock:
            # The kernel reads ahead too, several requests at once that threads may serve out of
            # order: a read within one readahead window of the furthest one is still sequential.
            sequential = offset == 0 or (self.max_end - 2 * self.window <= offset <= self.max_end + self.readahead)
            self.max_end = max(self.max_end, end)
            if not sequential:
                self.window = FIRST_WINDOW
                return
            self.window = min(self.window * 2, self.readahead)
            horizon = self.max_end + self.window
            # Issue more only when less than half the window is still ahead of the reader.
            start = max(self.ahead, last)
            if start < len(self.ids) and self.offsets[start] - self.max_end > self.window // 2:
                return
            stop = min(bisect.bisect_left(self.offsets, horizon), len(self.ids))
            if stop <= start:
                return
            self.ahead = stop
        self.fetcher.prefetch(zip(self.ids[start:stop], self.lengths[start:stop], strict=True))
