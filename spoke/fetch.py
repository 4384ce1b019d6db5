"""The fetch scheduler: every chunk a spoke lacks comes through here.

- Reads look in memory first (a bounded LRU of chunks already verified and
  decoded, so a warm read neither reads the disk nor hashes again), then in the
  disk cache (whose copy is checksummed on every read: what guards against a
  bad disk); misses become requests in one priority queue (demand > hint >
  readahead > background).
- Workers take the most urgent pending ids, up to a batch, and fetch them in
  one ``/chunks/frames`` request; frames stream back and each is verified
  (checksum and id) before it is cached and handed out.
- Concurrent readers of one chunk share one fetch (one future per id).
- Parallelism is bounded by the number of workers.
- Reads are accounted to the job they serve (:func:`spoke.jobs.current_job`):
  demand bytes, hits, seconds waited on the hub (:class:`~spoke.jobs.JobTable`);
  prefetches carry the job and kind that asked for them, so their accuracy,
  coverage and waste are known (:class:`~spoke.prefetch_stats.PrefetchStats`).
  Listeners (:meth:`FetchScheduler.on_demand`) see the ids each job demand-reads.
- In a spoke group, batches go through ``group_frames`` (:meth:`spoke.peers.GroupFetch.fetch`),
  which hands over a frame another spoke sent with its bytes, already verified (it is not
  decoded again here). In a prefetch batch such a frame is held in its owner's cache, so it
  is handed to any waiting reader but not cached here, and not prefetched again while it
  is outstanding; demand reads of it come from the owner.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from fabric.cache.disk import DiskCache
from fabric.cache.lru import BytesLRU
from fabric.errors import Corruption, FabricError, NotFound
from fabric.format import frames

from .jobs import KINDS, JobTable, current_job
from .prefetch_stats import PrefetchStats
from .traffic import DEMAND, PREFETCH, Traffic

#: Priority classes, most urgent first.
DEMAND_PRIORITY, HINT, READAHEAD, BACKGROUND = 0, 1, 2, 3
#: Marks an id a worker is fetching now (never queued again meanwhile).
IN_FLIGHT = -1
#: Ids of a frames request served from the cache at a time (:meth:`FetchScheduler.frames_for`):
#: at most 32 x 256 KiB of fetched chunks are held for the window being fetched ahead.
SERVE_WINDOW = 32

FetchFrames = Callable[[list[bytes]], Iterator[tuple[bytes, bytes]]]
#: ``ids -> (id, frame, raw)``: ``raw``, the frame's bytes already verified, when another
#: spoke of the group sent it (and keeps a copy); None when it came from the hub.
GroupFrames = Callable[[list[bytes]], Iterator[tuple[bytes, bytes, bytes | None]]]
#: Bytes of verified, decoded chunks a scheduler keeps in memory by default (as the hub's
#: chunk store does): warm reads of a working set this size skip the disk and the checksum.
MEMORY_CACHE = 64 << 20
#: Told ``(job, ids)`` before a demand read of ``ids`` for ``job``.
DemandListener = Callable[[str, Sequence[bytes]], None]


class Fetched(NamedTuple):
    """What a fetch hands its waiters: the chunk's verified bytes, and the frame they came in
    (what a ``frames`` request sends on, without reading it back from the disk cache)."""

    raw: bytes
    frame: bytes


class FetchScheduler:
    def __init__(
        self,
        fetch_frames: FetchFrames,
        cache: DiskCache,
        traffic: Traffic,
        workers: int = 4,
        batch_ids: int = 128,
        background_workers: int = 1,
        group_frames: GroupFrames | None = None,
        memory: int = MEMORY_CACHE,
    ) -> None:
        """``memory``: bytes of decoded chunks kept in memory in front of ``cache``.
        ``background_workers``: how many workers may fetch BACKGROUND batches at once (at
        least one); the others stay free for more urgent reads. ``group_frames``: how a
        batch is fetched in a spoke group, instead of ``fetch_frames`` (see the module's docstring)."""
        self._fetch = fetch_frames
        self._group_frames = group_frames
        self.cache = cache
        self.memory = BytesLRU(memory, max_item=memory // 4)
        self.traffic = traffic
        self.batch_ids = batch_ids
        self.background_workers = max(1, background_workers)
        self._background_busy = self.background_busy_max = 0
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, bytes]] = []
        self._pending: dict[bytes, Future] = {}
        self._priority: dict[bytes, int] = {}
        self._counter = itertools.count()
        self._stopped = False
        self.hit_bytes = self.miss_bytes = self.refetched = 0
        #: The job and kind of each pending prefetch, by chunk id.
        self._tags: dict[bytes, tuple[str | None, str]] = {}
        self._listeners: list[DemandListener] = []
        self.jobs = JobTable(on_drop=lambda job: self.prefetch_stats.forget_job(job))
        self.prefetch_stats = PrefetchStats(self.jobs, cache.__contains__)
        self._advice = ThreadPoolExecutor(1, thread_name_prefix="cache-advice")
        self._threads = [threading.Thread(target=self._work, name=f"fetch-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._advice.shutdown(wait=False, cancel_futures=True)

    # -- public --------------------------------------------------------------
    def on_demand(self, listener: DemandListener) -> None:
        """Call ``listener(job, ids)`` before each demand read a job makes (in the reading
        thread: it must be quick and must not read through this scheduler)."""
        self._listeners.append(listener)

    def read(self, ids: Sequence[bytes], priority: int = DEMAND_PRIORITY) -> list[bytes]:
        """Raw bytes of each chunk (verified), fetching what the cache lacks; accounted to
        the current request's job."""
        job = current_job()
        self._demanding(job, ids)
        out: dict[bytes, bytes] = {}
        waits: list[tuple[bytes, Future]] = []
        hit = 0
        for cid in dict.fromkeys(ids):
            raw = self._cached(cid)
            if raw is not None:
                out[cid] = raw
                self.hit_bytes += len(raw)
                hit += len(raw)
                self.prefetch_stats.demanded(cid, len(raw), job, True)
                continue
            waits.append((cid, self._request(cid, priority)))
        started = time.monotonic()
        for cid, fut in waits:
            out[cid] = fut.result().raw
            self.memory.put(cid, out[cid])
            self.miss_bytes += len(out[cid])
            self.prefetch_stats.demanded(cid, len(out[cid]), job, False)
        if job is not None:
            wait = time.monotonic() - started if waits else 0.0
            self.jobs.demand(job, sum(len(v) for v in out.values()), hit, wait)
        return [out[cid] for cid in ids]

    def read_beside(self, ids: Sequence[bytes], job: str | None) -> None:
        """A client beside this spoke read these chunks from the cache's files itself
        (spoke/local_reads_api.py): reads of the cache as if they had been served here, for its
        recency and plans, the job's lookahead and the job's figures (a hit each). Bytes are
        counted as the cache holds them, less a frame's header: a chunk's own size unless it
        was stored compressed. Ids the cache lacks count for nothing."""
        self._demanding(job, ids)
        hit = 0
        for cid in ids:
            size = self.cache.touch(cid)
            if size is None:
                continue
            size = max(0, size - frames.HEADER_LEN)
            hit += size
            self.prefetch_stats.demanded(cid, size, job, True)
        self.hit_bytes += hit
        if job is not None and hit:
            self.jobs.demand(job, hit, hit, 0.0)

    def _cached(self, cid: bytes) -> bytes | None:
        """The chunk's bytes from memory or the disk cache, or ``None`` (a damaged disk copy is dropped)."""
        raw = self.memory.get(cid)
        if raw is not None:
            self.cache.touch(cid)
            return raw
        corruptions = self.cache.corruptions
        frame = self.cache.get(cid)
        if frame is None:
            if self.cache.corruptions != corruptions:
                self.refetched += 1  # the cached copy failed its checksum (and was dropped)
            return None
        try:
            # The id was verified when the frame was fetched; the cache checks its
            # checksum on every read, so a hit needs no second hash of the content.
            raw = frames.decode(frame)
        except Corruption:
            self.cache.drop_corrupt(cid)
            self.refetched += 1
            return None
        self.memory.put(cid, raw)
        return raw

    def prefetch(self, ids: Sequence[bytes], priority: int = READAHEAD, job: str | None = None, kind: str = "readahead") -> None:
        """Queue chunks for fetching without waiting for them; ``job`` and ``kind`` (one of
        :data:`~spoke.jobs.KINDS`) say who asked, for the prefetch accounting. Cached chunks,
        and chunks prefetched into their owner's cache and not read yet, cost nothing."""
        if kind not in KINDS:
            raise ValueError(f"unknown prefetch kind {kind!r}: use one of {', '.join(KINDS)}")
        if priority <= DEMAND_PRIORITY:
            raise ValueError("a prefetch cannot have demand priority")
        for cid in ids:
            if cid not in self.cache and not self.prefetch_stats.held(cid):
                with self._cond:
                    if cid not in self._pending:
                        self._tags[cid] = (job, kind)
                self._request(cid, priority)

    def will_read(self, ids: Sequence[bytes]) -> None:
        """Tell the kernel, from a thread of its own, that the cache files of ``ids`` will be
        read soon (:meth:`DiskCache.will_need`): those not in the page cache then come off the
        disk many at a time rather than one per read."""
        self._advice.submit(self.cache.will_need, ids)

    def frames_for(self, ids: Sequence[bytes], job: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(id, frame)`` for each id from the cache, fetched on a miss (to serve other clients).

        Works through ``ids`` :data:`SERVE_WINDOW` at a time, fetching the next window while
        this one is sent; frames are read back from the disk cache one at a time, so what a
        request holds is bounded by the window, not by the number of ids asked. The kernel is
        told at once that the request's cache files will be read (:meth:`will_read`). A failed
        fetch in the first window (an unknown id: NotFound) is raised by the first ``next``,
        before any record; one in a later window ends the stream early.

        Accounted to ``job`` (the caller reads it from the request: a generator's body runs later)."""
        ids = list(ids)
        windows = [ids[i : i + SERVE_WINDOW] for i in range(0, len(ids), SERVE_WINDOW)]
        if windows:
            self._demanding(job, windows[0])
        ahead = self._fetch_missing(windows[0]) if windows else {}
        if len(ids) > 1:
            self.will_read(ids)
        for k, window in enumerate(windows):
            fetched = ahead
            if k + 1 < len(windows):
                self._demanding(job, windows[k + 1])
            ahead = self._fetch_missing(windows[k + 1]) if k + 1 < len(windows) else {}
            started = time.monotonic()
            for fut in fetched.values():
                fut.result()  # raises the fetch's error (the frame stays in the future until the window is sent)
            wait = time.monotonic() - started if fetched else 0.0
            missed = set(fetched)
            total = hit = 0
            for cid in window:
                frame = None
                if cid not in fetched:
                    corruptions = self.cache.corruptions
                    frame = self.cache.get(cid)
                    if frame is None:  # a hit evicted (or found corrupt, and dropped) since
                        if self.cache.corruptions != corruptions:
                            self.refetched += 1
                        fetched[cid] = self._request(cid, DEMAND_PRIORITY)
                        missed.add(cid)
                if frame is None:  # fetched for this request: its frame is at hand, not read back from the disk
                    again = time.monotonic()
                    frame = fetched[cid].result().frame
                    wait += time.monotonic() - again
                    self.cache.missed(cid)
                size = frames.raw_length(frame)
                total += size
                if cid in missed:
                    self.miss_bytes += size
                else:
                    self.hit_bytes += size
                    hit += size
                self.prefetch_stats.demanded(cid, size, job, cid not in missed)
                yield cid, frame
            if job is not None:
                self.jobs.demand(job, total, hit, wait)
            fetched.clear()

    def fetch_here(self, ids: Sequence[bytes], fetch: FetchFrames) -> None:
        """Fetch the ids the cache lacks with ``fetch``, in the calling thread rather than a
        worker's, so it never waits for a free worker (a spoke serving its group's peers
        while its workers wait on those peers). Still one fetch per id: an id queued here
        is taken over, one in flight is waited for. Raises the fetch's error."""
        mine: list[tuple[bytes, int]] = []
        waits: list[Future] = []
        with self._cond:
            for cid in dict.fromkeys(ids):
                if cid in self.cache:
                    continue
                fut = self._pending.get(cid)
                if fut is not None and self._priority.get(cid) == IN_FLIGHT:
                    waits.append(fut)
                    continue
                if fut is None:
                    fut = self._pending[cid] = Future()
                self._priority[cid] = IN_FLIGHT  # a queued entry for it is now stale
                mine.append((cid, DEMAND_PRIORITY))
                waits.append(fut)
        if mine:
            self._fetch_batch(mine, fetch)
        for fut in waits:
            fut.result()

    def _fetch_missing(self, ids: Sequence[bytes]) -> dict[bytes, Future]:
        """Queue (as demand) the ids the cache lacks; their futures by id."""
        return {cid: self._request(cid, DEMAND_PRIORITY) for cid in dict.fromkeys(ids) if cid not in self.cache}

    # -- internals -----------------------------------------------------------
    def _demanding(self, job: str | None, ids: Sequence[bytes]) -> None:
        self.prefetch_stats.reading(ids)
        if job is not None:
            for listener in self._listeners:
                listener(job, ids)

    def _request(self, cid: bytes, priority: int) -> Future:
        with self._cond:
            fut = self._pending.get(cid)
            if fut is None:
                fut = self._pending[cid] = Future()
            if priority < self._priority.get(cid, BACKGROUND + 1):
                self._priority[cid] = priority
                heapq.heappush(self._queue, (priority, next(self._counter), cid))
                self._cond.notify()
            return fut

    def _ready(self) -> bool:
        """Whether a batch may start now: the most urgent id is not BACKGROUND, or fewer than
        ``background_workers`` background batches are in flight (stale entries are dropped)."""
        while self._queue:
            priority, _, cid = self._queue[0]
            if self._priority.get(cid) != priority:
                heapq.heappop(self._queue)  # stale entry: already taken, or queued again more urgently
                continue
            return priority < BACKGROUND or self._background_busy < self.background_workers
        return False

    def _take_batch(self) -> tuple[list[tuple[bytes, int]], bool]:
        """The next batch, and whether it is a background one (which never mixes with urgent ids)."""
        with self._cond:
            while not self._ready() and not self._stopped:
                self._cond.wait()
            batch: list[tuple[bytes, int]] = []
            background = bool(self._queue) and self._queue[0][0] == BACKGROUND
            while self._queue and len(batch) < self.batch_ids:
                priority, _, cid = self._queue[0]
                if priority == BACKGROUND and not background:
                    break
                heapq.heappop(self._queue)
                if self._priority.get(cid) != priority:
                    continue
                self._priority[cid] = IN_FLIGHT
                batch.append((cid, priority))
            if background and batch:
                self._background_busy += 1
                self.background_busy_max = max(self.background_busy_max, self._background_busy)
            return batch, background and bool(batch)

    def _work(self) -> None:
        while not self._stopped:
            batch, background = self._take_batch()
            if not batch:
                continue
            try:
                self._fetch_batch(batch)
            finally:
                if background:
                    with self._cond:
                        self._background_busy -= 1
                        self._cond.notify_all()

    def _fetch_batch(self, batch: list[tuple[bytes, int]], fetch: FetchFrames | None = None) -> None:
        purpose = DEMAND if min(p for _, p in batch) == DEMAND_PRIORITY else PREFETCH
        ids = [cid for cid, _ in batch]
        prefetched = {cid: p != DEMAND_PRIORITY for cid, p in batch}
        got: set[bytes] = set()
        try:
            with self.traffic.purpose(purpose):
                for cid, frame, verified in self._frames(ids, fetch):
                    raw = frames.decode(frame, cid) if verified is None else verified  # checksum and id, before caching
                    held = verified is not None and purpose == PREFETCH  # a prefetch a peer sent fills its cache only
                    if not held:
                        self.cache.put(cid, frame)
                    got.add(cid)
                    if prefetched.get(cid, False):
                        self.prefetch_stats.fetched(cid, len(raw), *self._tags.get(cid, (None, "readahead")), held=held)
                    self._resolve(cid, Fetched(raw, frame))
            missing = [cid for cid in ids if cid not in got]
            if missing:
                raise NotFound(f"the hub did not return chunk {missing[0].hex()}")
        except FabricError as exc:
            for cid in ids:
                if cid not in got:
                    self._fail(cid, exc)
        except Exception as exc:  # noqa: BLE001 - a broken connection must not kill the worker
            for cid in ids:
                if cid not in got:
                    self._fail(cid, exc)

    def _frames(self, ids: list[bytes], fetch: FetchFrames | None) -> Iterator[tuple[bytes, bytes, bytes | None]]:
        """The batch's frames, each with its verified bytes when a peer of the group sent it."""
        if fetch is None and self._group_frames is not None:
            return self._group_frames(ids)
        return ((cid, frame, None) for cid, frame in (fetch or self._fetch)(ids))

    def _resolve(self, cid: bytes, fetched: Fetched) -> None:
        with self._cond:
            fut = self._pending.pop(cid, None)
            self._priority.pop(cid, None)
            self._tags.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_result(fetched)

    def _fail(self, cid: bytes, exc: BaseException) -> None:
        with self._cond:
            fut = self._pending.pop(cid, None)
            self._priority.pop(cid, None)
            self._tags.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
