"""Loader hints at a spoke: fetch ahead of each job along the order it said it will read.

A hint (``DataPlane.hint``) gives a job's files in read order, for one repository. The
spoke keeps, per job and repository, that order (:class:`Order`) and a *read position*:
the next chunk of the order the job has not read. The position moves as the job's
demand reads (frames or file reads carrying ``X-Fabric-Job``) take chunks at or past
it, and jumps forward when the job starts reading a later file of the order. A
background thread keeps the chunks from the read position up to ``window_bytes`` ahead
fetched at HINT priority (below every demand read); chunks already cached cost
nothing. Only the chunk lists of files inside the window are resolved, so a long order
costs one entry per path, not one per chunk. The window is worked out again once the
read position has gone :data:`REFILL_FRACTION` of it (or a hint changed the order), not
at every read: a job reading 4 MiB at a time through a 256 MiB window would otherwise
have the spoke walk the whole window 64 times per window read (measured: the lookahead
thread took about half the spoke's Python time in a 1.1 GiB export). A refill asks the
fetcher only for the chunks the previous window did not hold.

The cache's read plan for the job (:meth:`fabric.cache.disk.DiskCache.plan`) reaches
further than the window: the next :data:`PLAN_IDS` chunks of the order (with many jobs
hinting, an equal share of what the cache's plans may hold, never less than the window). Chunks it lists
that the cache holds are evicted only after every chunk no plan lists, the one read
last first: with a data set larger than the cache, what the job will read stays and
what it has read goes (without it, an epoch in a new random order evicted what it was
about to read). The plan is worked out again once the job has read half of it.

Bounds: ``window_bytes`` of chunks ahead of each job's position; :data:`MAX_PATHS`
paths hinted in all (a new hint makes room by dropping the least recently active
orders of other jobs); :data:`MAX_ORDERS` orders; an order idle for
:data:`IDLE_SECONDS` is dropped (its unread prefetches count as wasted).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fabric.cache.plans import PLAN_MAX_IDS
from fabric.errors import BadRequest, FabricError
from fabric.format.model import HOLE_ID, Entry

from .fetch import HINT, FetchScheduler

log = logging.getLogger("fabric.spoke")

#: The most bytes of chunks fetched ahead of one job's read position (``fabric spoke --hint-window``).
WINDOW_BYTES = 256 * 1024 * 1024
#: The share of a window the read position passes before the window is worked out again.
REFILL_FRACTION = 1 / 8
#: The most chunk ids one order's read plan lists (a quarter of what the cache's plans hold
#: in all, :data:`fabric.cache.plans.PLAN_MAX_IDS`: about 2 GiB of 64 KiB chunks).
PLAN_IDS = PLAN_MAX_IDS // 4
#: Chunk lists fetched in one call when a window or plan reaches files not resolved yet.
RESOLVE_BATCH = 64
#: A job's new order that replaces its last (the next epoch's) and whose first
#: :data:`SETTLE_BYTES` the cache holds whole is worked out this long after the hint, not at
#: once: the epoch's first batches then read cached chunks, and the work on its order (about
#: 60 ms of this process's CPU for 3,000 files) would only delay them (an epoch's first batch
#: is time the accelerators wait; later, the loader's prefetched batches hide it).
SETTLE_SECONDS = 0.5
SETTLE_BYTES = 64 * 1024 * 1024
#: Paths held in the orders of all jobs together.
MAX_PATHS = 2_000_000
#: Orders (job and repository) kept at once.
MAX_ORDERS = 256
#: An order no read or hint has touched for this long is dropped.
IDLE_SECONDS = 600.0

#: The chunk lists of some files (one call may fetch the lists of many at once).
ChunkLists = Callable[[Sequence[Entry]], Sequence[Sequence[tuple[bytes, int]]]]
#: Told ``(name, ids)``: the ids an order will read next, in that order (the cache's read
#: plan of that name, :meth:`fabric.cache.disk.DiskCache.plan`; no ids: drop it).
Plan = Callable[[str, Sequence[bytes]], object]


def default_window(cache_budget: int) -> int:
    """The lookahead bound for a chunk cache of ``cache_budget`` bytes: a quarter of it, at
    most :data:`WINDOW_BYTES`, so what is fetched ahead fits beside what is being read."""
    return min(WINDOW_BYTES, cache_budget // 4)


@dataclass
class _Span:
    """Chunks of an order ahead of a position (:meth:`Lookahead._span`)."""

    ids: list[bytes] = field(default_factory=list)
    #: The position (file index, chunk index) in the order of each of ``ids``.
    places: list[tuple[int, int]] = field(default_factory=list)
    #: The chunk lists of the files the span covers, by file index.
    lists: dict[int, Sequence[tuple[bytes, int]]] = field(default_factory=dict)
    #: The position from which the span is worked out again (None: it reaches the
    #: order's end).
    mark: tuple[int, int] | None = None


@dataclass
class Order:
    """One job's hinted files in one repository, and how far the job has read them."""

    job: str
    repo: str
    files: list[Entry]
    #: The read position: (file index, chunk index) of the next chunk not read.
    cursor: tuple[int, int] = (0, 0)
    #: Chunk ids of the current window -> their positions in it.
    window: dict[bytes, list[tuple[int, int]]] = field(default_factory=dict)
    #: First chunk id of each file whose chunk list is inline -> the files' indices.
    starts: dict[bytes, list[int]] = field(default_factory=dict)
    #: Chunk lists resolved for files in the window, by file index.
    resolved: dict[int, Sequence[tuple[bytes, int]]] = field(default_factory=dict)
    #: The read position from which the window is worked out again (None: it reaches the
    #: order's end, so nothing is left to fetch ahead until a hint extends the order).
    refill: tuple[int, int] | None = None
    #: The read position from which the read plan is worked out again (None: it reaches
    #: the order's end); ``planned`` is False until the first plan of the order is set.
    replan: tuple[int, int] | None = None
    planned: bool = False
    last_active: float = field(default_factory=time.monotonic)
    dirty: bool = True
    #: Not worked out before this time (``time.monotonic``; see :data:`SETTLE_SECONDS`).
    not_before: float = 0.0

    @property
    def plan_name(self) -> str:
        return f"hint {self.job} {self.repo}"

    def extend(self, files: Sequence[Entry]) -> None:
        base = len(self.files)
        self.files.extend(files)
        for i, entry in enumerate(files, base):
            if entry.chunks:
                self.starts.setdefault(entry.chunks[0][0], []).append(i)

    def saw(self, ids: Sequence[bytes]) -> bool:
        """Move the read position past the chunks of ``ids`` found at or after it; whether it moved."""
        moved = False
        for cid in ids:
            at = [p for p in self.window.get(cid, ()) if p >= self.cursor]
            if at:
                fi, ci = min(at)
                self.cursor, moved = (fi, ci + 1), True
                continue
            later = [i for i in self.starts.get(cid, ()) if i > self.cursor[0]]
            if later:  # the job went on to a later file of its order
                self.cursor, moved = (min(later), 1), True
        return moved


class Lookahead:
    """The orders of every job, and the thread that fetches ahead of them."""

    def __init__(
        self,
        fetcher: FetchScheduler,
        chunk_lists: ChunkLists,
        window_bytes: int,
        plan: Plan | None = None,
        cached: Callable[[bytes], bool] | None = None,
        max_paths: int = MAX_PATHS,
        max_orders: int = MAX_ORDERS,
        idle: float = IDLE_SECONDS,
    ) -> None:
        self.fetcher = fetcher
        self.window_bytes = window_bytes
        self._chunk_lists = chunk_lists
        self._plan = plan
        self._cached = cached
        self.max_paths, self.max_orders, self.idle = max_paths, max_orders, idle
        self._cond = threading.Condition()
        self._orders: OrderedDict[tuple[str, str], Order] = OrderedDict()
        self._stopped = False
        fetcher.on_demand(self.demanded)
        self._thread = threading.Thread(target=self._run, name="hint-lookahead", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def hint(self, job: str, repo: str, files: Sequence[Entry], append: bool) -> None:
        """Set (or with ``append`` extend) ``job``'s order in ``repo``; BadRequest, changing
        nothing, when the order would hold more than :data:`MAX_PATHS` paths."""
        key = (job, repo)
        dropped: list[Order] = []
        settle = not append and key in self._orders and self._head_cached(files)
        with self._cond:
            order = self._orders.get(key)
            keep = len(order.files) if order is not None and append else 0
            if keep + len(files) > self.max_paths:
                raise BadRequest(
                    f"job {job!r} would have {keep + len(files)} paths hinted in {repo!r}; a spoke keeps at most "
                    f"{self.max_paths}: hint a shorter order (append the rest as the job gets there)"
                )
            if order is None or not append:
                order = Order(job, repo, [])
            order.extend(files)
            order.last_active, order.dirty = time.monotonic(), True
            order.not_before = order.last_active + SETTLE_SECONDS if settle else 0.0
            self._orders.pop(key, None)
            self._orders[key] = order
            used = sum(len(o.files) for o in self._orders.values())
            while len(self._orders) > self.max_orders or used > self.max_paths:
                old = self._orders.popitem(last=False)[1]
                used -= len(old.files)
                dropped.append(old)
            self._cond.notify_all()
        self._forget(dropped)

    def _head_cached(self, files: Sequence[Entry]) -> bool:
        """Whether the cache holds every chunk of the first :data:`SETTLE_BYTES` (at most the
        window) of ``files`` (False for a file whose chunk list is not inline)."""
        if self._cached is None:
            return False
        left = min(SETTLE_BYTES, self.window_bytes)
        for entry in files:
            if left <= 0:
                break
            if entry.size and not entry.chunks:
                return False
            for cid, n in entry.chunks:
                if cid != HOLE_ID and not self._cached(cid):
                    return False
                left -= n
        return True

    def hinting(self, job: str, repo: str) -> bool:
        """Whether ``job`` has an order in ``repo``."""
        with self._cond:
            return (job, repo) in self._orders

    def demanded(self, job: str, ids: Sequence[bytes]) -> None:
        """A demand read by ``job`` (a :class:`FetchScheduler` listener): move its read positions."""
        with self._cond:
            for (j, _), order in self._orders.items():
                if j == job and order.saw(ids):
                    order.last_active = time.monotonic()
                    if order.refill is not None and order.cursor >= order.refill:
                        order.dirty = True
                        self._cond.notify_all()

    # -- the lookahead thread ---------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                waits = [max(0.0, o.not_before - now) for o in self._orders.values() if o.dirty]
                if not self._stopped and (not waits or min(waits) > 0):
                    self._cond.wait(timeout=min([*waits, self.idle / 10]))
                if self._stopped:
                    return
                now = time.monotonic()
                idle = [k for k, o in self._orders.items() if now - o.last_active > self.idle]
                dropped = [self._orders.pop(k) for k in idle]
                work = [o for o in self._orders.values() if o.dirty and o.not_before <= now]
                for order in work:
                    order.dirty = False
            self._forget(dropped)
            for order in work:
                try:
                    self._advance(order)
                except FabricError as exc:  # a chunk list the hub cannot give now: try at the next read
                    log.warning("hint lookahead of job %s in %s: %s", order.job, order.repo, exc.message)

    def _advance(self, order: Order) -> None:
        """Fetch the chunks of ``order``'s window (from its read position, within the bound)
        that the previous window did not hold; work the read plan out again when due."""
        with self._cond:
            cursor = order.cursor
            replan = not order.planned or (order.replan is not None and cursor >= order.replan)
        span = self._span(order, cursor, self.window_bytes, REFILL_FRACTION, order.resolved)
        window: dict[bytes, list[tuple[int, int]]] = {}
        for cid, place in zip(span.ids, span.places):
            window.setdefault(cid, []).append(place)
        with self._cond:  # positions behind a read position that moved meanwhile are ignored by Order.saw
            previous = order.window
            order.window, order.resolved, order.refill = window, span.lists, span.mark
            if span.mark is not None and order.cursor >= span.mark:
                order.dirty = True  # the job read past it meanwhile: work the window out again
        planned_window = self._plan is not None and not order.planned
        if planned_window:
            self._plan(order.plan_name, span.ids)  # before the fetches: the cache holds each planned chunk as it arrives
        self.fetcher.prefetch([cid for cid in span.ids if cid not in previous], HINT, job=order.job, kind="hint")
        if self._plan is not None and replan:
            with self._cond:  # the cache's plans hold PLAN_MAX_IDS in all: a share for each order, at least its window
                share = max(len(span.ids), min(PLAN_IDS, PLAN_MAX_IDS // max(1, len(self._orders))))
            ahead = self._span(order, cursor, float("inf"), 1 / 2, span.lists, share)
            with self._cond:
                order.replan, order.planned = ahead.mark, True
                if ahead.mark is not None and order.cursor >= ahead.mark:
                    order.dirty = True
            if not (planned_window and ahead.ids == span.ids):  # a window as long as the order: planned already
                self._plan(order.plan_name, ahead.ids)

    def _span(
        self,
        order: Order,
        start: tuple[int, int],
        limit: float,
        mark: float,
        known: dict[int, Sequence[tuple[bytes, int]]],
        max_ids: int | None = None,
    ) -> _Span:
        """The chunks of ``order`` from position ``start``, in read order, up to ``limit`` bytes
        (and ``max_ids`` ids); its ``mark`` is the position once the share ``mark`` of its
        chunks was read. Chunk lists come from ``known`` or are fetched :data:`RESOLVE_BATCH`
        files at a time."""
        fi, ci = start
        files = order.files
        known = dict(known)
        span = _Span()
        while fi < len(files):
            if fi not in known:
                batch = [i for i in range(fi, min(len(files), fi + RESOLVE_BATCH)) if i not in known]
                known.update(zip(batch, self._chunk_lists([files[i] for i in batch])))
            chunks = known[fi]
            span.lists[fi] = chunks
            for j in range(ci, len(chunks)):
                cid, n = chunks[j]
                if cid == HOLE_ID:
                    continue
                if n > limit or (max_ids is not None and len(span.ids) >= max_ids):
                    if span.places:
                        at_fi, at_j = span.places[max(0, math.ceil(len(span.places) * mark) - 1)]
                        span.mark = (at_fi, at_j + 1)
                    return span
                limit -= n
                span.ids.append(cid)
                span.places.append((fi, j))
            fi, ci = fi + 1, 0
        return span  # it reaches the order's end: no mark, all of it is asked for

    def _forget(self, orders: Sequence[Order]) -> None:
        for order in orders:
            if self._plan is not None:
                self._plan(order.plan_name, [])
            self.fetcher.prefetch_stats.waste_job(order.job, "hint")
