"""The fetch scheduler: every chunk a spoke lacks comes through here.

- Reads look in the cache first; misses become requests in one priority
  queue (demand > hint > readahead > background).
- Workers take the most urgent pending ids, up to a batch, and fetch them in
  one ``/chunks/frames`` request; frames stream back and each is verified
  (checksum and id) before it is cached and handed out.
- Concurrent readers of one chunk share one fetch (one future per id).
- Parallelism is bounded by the number of workers.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

from fabric.cache.disk import DiskCache
from fabric.errors import Corruption, FabricError, NotFound
from fabric.format import frames

from .traffic import DEMAND, PREFETCH, Traffic

#: Priority classes, most urgent first.
DEMAND_PRIORITY, HINT, READAHEAD, BACKGROUND = 0, 1, 2, 3
#: Marks an id a worker is fetching now (never queued again meanwhile).
IN_FLIGHT = -1
#: Ids of a frames request served from the cache at a time (:meth:`FetchScheduler.frames_for`):
#: at most 32 x 256 KiB of fetched chunks are held for the window being fetched ahead.
SERVE_WINDOW = 32

FetchFrames = Callable[[list[bytes]], Iterator[tuple[bytes, bytes]]]


class FetchScheduler:
    def __init__(
        self,
        fetch_frames: FetchFrames,
        cache: DiskCache,
        traffic: Traffic,
        workers: int = 4,
        batch_ids: int = 128,
    ) -> None:
        self._fetch = fetch_frames
        self.cache = cache
        self.traffic = traffic
        self.batch_ids = batch_ids
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, bytes]] = []
        self._pending: dict[bytes, Future] = {}
        self._priority: dict[bytes, int] = {}
        self._counter = itertools.count()
        self._stopped = False
        self.hit_bytes = self.miss_bytes = self.refetched = 0
        self._threads = [threading.Thread(target=self._work, name=f"fetch-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # -- public --------------------------------------------------------------
    def read(self, ids: Sequence[bytes], priority: int = DEMAND_PRIORITY) -> list[bytes]:
        """Raw bytes of each chunk (verified), fetching what the cache lacks."""
        out: dict[bytes, bytes] = {}
        waits: list[tuple[bytes, Future]] = []
        for cid in dict.fromkeys(ids):
            corruptions = self.cache.corruptions
            frame = self.cache.get(cid)
            if frame is None and self.cache.corruptions != corruptions:
                self.refetched += 1  # the cached copy failed its checksum (and was dropped): fetched again below
            if frame is not None:
                try:
                    # The id was verified when the frame was fetched; the cache checks its
                    # checksum on every read, so a hit needs no second hash of the content.
                    out[cid] = frames.decode(frame)
                    self.hit_bytes += len(out[cid])
                    continue
                except Corruption:
                    self.cache.drop_corrupt(cid)
                    self.refetched += 1
            waits.append((cid, self._request(cid, priority)))
        for cid, fut in waits:
            out[cid] = fut.result()
            self.miss_bytes += len(out[cid])
        return [out[cid] for cid in ids]

    def prefetch(self, ids: Sequence[bytes], priority: int = READAHEAD) -> None:
        """Queue chunks for fetching without waiting for them."""
        for cid in ids:
            if cid not in self.cache:
                self._request(cid, priority)

    def frames_for(self, ids: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """``(id, frame)`` for each id from the cache, fetched on a miss (to serve other clients).

        Works through ``ids`` :data:`SERVE_WINDOW` at a time, fetching the next window while
        this one is sent; frames are read back from the disk cache one at a time, so what a
        request holds is bounded by the window, not by the number of ids asked. A failed
        fetch in the first window (an unknown id: NotFound) is raised by the first ``next``,
        before any record; one in a later window ends the stream early."""
        ids = list(ids)
        windows = [ids[i : i + SERVE_WINDOW] for i in range(0, len(ids), SERVE_WINDOW)]
        ahead = self._fetch_missing(windows[0]) if windows else {}
        for k, window in enumerate(windows):
            fetched = ahead
            ahead = self._fetch_missing(windows[k + 1]) if k + 1 < len(windows) else {}
            for fut in fetched.values():
                fut.result()  # raises the fetch's error; the decoded bytes are not kept
            for cid in window:
                corruptions = self.cache.corruptions
                frame = self.cache.get(cid)
                if frame is None:  # evicted (or found corrupt, and dropped) since: fetch it again
                    if self.cache.corruptions != corruptions:
                        self.refetched += 1
                    self._request(cid, DEMAND_PRIORITY).result()
                    frame = self.cache.get(cid)
                if frame is None:
                    raise NotFound(f"chunk {cid.hex()} could not be kept in the cache")
                if cid in fetched:
                    self.miss_bytes += frames.raw_length(frame)
                else:
                    self.hit_bytes += frames.raw_length(frame)
                yield cid, frame
            fetched.clear()

    def _fetch_missing(self, ids: Sequence[bytes]) -> dict[bytes, Future]:
        """Queue (as demand) the ids the cache lacks; their futures by id."""
        return {cid: self._request(cid, DEMAND_PRIORITY) for cid in dict.fromkeys(ids) if cid not in self.cache}

    # -- internals -----------------------------------------------------------
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

    def _take_batch(self) -> list[tuple[bytes, int]]:
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            batch: list[tuple[bytes, int]] = []
            while self._queue and len(batch) < self.batch_ids:
                priority, _, cid = heapq.heappop(self._queue)
                if self._priority.get(cid) != priority:
                    continue  # stale entry: already taken, or queued again more urgently
                self._priority[cid] = IN_FLIGHT
                batch.append((cid, priority))
            return batch

    def _work(self) -> None:
        while not self._stopped:
            batch = self._take_batch()
            if not batch:
                continue
            purpose = DEMAND if min(p for _, p in batch) == DEMAND_PRIORITY else PREFETCH
            ids = [cid for cid, _ in batch]
            got: set[bytes] = set()
            try:
                with self.traffic.purpose(purpose):
                    for cid, frame in self._fetch(ids):
                        raw = frames.decode(frame, cid)  # checksum and id, before caching
                        self.cache.put(cid, frame)
                        got.add(cid)
                        self._resolve(cid, raw)
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

    def _resolve(self, cid: bytes, raw: bytes) -> None:
        with self._cond:
            fut = self._pending.pop(cid, None)
            self._priority.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_result(raw)

    def _fail(self, cid: bytes, exc: BaseException) -> None:
        with self._cond:
            fut = self._pending.pop(cid, None)
            self._priority.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
