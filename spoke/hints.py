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
thread took about half the spoke's Python time in a 1.1 GiB export).

Bounds: ``window_bytes`` of chunks ahead of each job's position; :data:`MAX_PATHS`
paths hinted in all (a new hint makes room by dropping the least recently active
orders of other jobs); :data:`MAX_ORDERS` orders; an order idle for
:data:`IDLE_SECONDS` is dropped (its unread prefetches count as wasted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fabric.errors import BadRequest, FabricError
from fabric.format.model import HOLE_ID, Entry

from .fetch import HINT, FetchScheduler

log = logging.getLogger("fabric.spoke")

#: The most bytes of chunks fetched ahead of one job's read position (``fabric spoke --hint-window``).
WINDOW_BYTES = 256 * 1024 * 1024
#: The share of a window the read position passes before the window is worked out again.
REFILL_FRACTION = 1 / 8
#: Paths held in the orders of all jobs together.
MAX_PATHS = 2_000_000
#: Orders (job and repository) kept at once.
MAX_ORDERS = 256
#: An order no read or hint has touched for this long is dropped.
IDLE_SECONDS = 600.0

ChunkList = Callable[[Entry], Sequence[tuple[bytes, int]]]
#: Told ``(name, ids)``: the ids of an order's window, in the order they will be read (the
#: cache's read plan of that name, :meth:`fabric.cache.disk.DiskCache.plan`; no ids: drop it).
Plan = Callable[[str, Sequence[bytes]], object]


def default_window(cache_budget: int) -> int:
    """The lookahead bound for a chunk cache of ``cache_budget`` bytes: a quarter of it, at
    most :data:`WINDOW_BYTES`, so what is fetched ahead fits beside what is being read."""
    return min(WINDOW_BYTES, cache_budget // 4)


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
    last_active: float = field(default_factory=time.monotonic)
    dirty: bool = True

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
        chunk_list: ChunkList,
        window_bytes: int,
        plan: Plan | None = None,
        max_paths: int = MAX_PATHS,
        max_orders: int = MAX_ORDERS,
        idle: float = IDLE_SECONDS,
    ) -> None:
        self.fetcher = fetcher
        self.window_bytes = window_bytes
        self._chunk_list = chunk_list
        self._plan = plan
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
            self._orders.pop(key, None)
            self._orders[key] = order
            used = sum(len(o.files) for o in self._orders.values())
            while len(self._orders) > self.max_orders or used > self.max_paths:
                old = self._orders.popitem(last=False)[1]
                used -= len(old.files)
                dropped.append(old)
            self._cond.notify_all()
        self._forget(dropped)

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
                self._cond.wait_for(lambda: self._stopped or any(o.dirty for o in self._orders.values()), timeout=self.idle / 10)
                if self._stopped:
                    return
                now = time.monotonic()
                idle = [k for k, o in self._orders.items() if now - o.last_active > self.idle]
                dropped = [self._orders.pop(k) for k in idle]
                work = [o for o in self._orders.values() if o.dirty]
                for order in work:
                    order.dirty = False
            self._forget(dropped)
            for order in work:
                try:
                    self._advance(order)
                except FabricError as exc:  # a chunk list the hub cannot give now: try at the next read
                    log.warning("hint lookahead of job %s in %s: %s", order.job, order.repo, exc.message)

    def _advance(self, order: Order) -> None:
        """Fetch the chunks of ``order``'s window (from its read position, within the bound)."""
        with self._cond:
            fi, ci = order.cursor
            files = order.files
        budget, ids, window = self.window_bytes, [], {}
        resolved = {}
        refill, refill_budget = None, self.window_bytes * (1 - REFILL_FRACTION)
        while fi < len(files):
            chunks = order.resolved.get(fi)
            if chunks is None:
                chunks = self._chunk_list(files[fi])
            resolved[fi] = chunks
            full = False
            for j in range(ci, len(chunks)):
                cid, n = chunks[j]
                if cid == HOLE_ID:
                    continue
                if n > budget:
                    full = True
                    break
                budget -= n
                ids.append(cid)
                window.setdefault(cid, []).append((fi, j))
                if refill is None and budget <= refill_budget:
                    refill = (fi, j + 1)
            if full:
                break
            fi, ci = fi + 1, 0
        if fi >= len(files):
            refill = None  # the window reaches the order's end: all of it is asked for
        with self._cond:  # positions behind a read position that moved meanwhile are ignored by Order.saw
            order.window, order.resolved, order.refill = window, resolved, refill
            if refill is not None and order.cursor >= refill:
                order.dirty = True  # the job read past it meanwhile: work the window out again
        if self._plan is not None:  # before the fetches: the cache holds each planned chunk as it arrives
            self._plan(order.plan_name, ids)
        self.fetcher.prefetch(ids, HINT, job=order.job, kind="hint")

    def _forget(self, orders: Sequence[Order]) -> None:
        for order in orders:
            if self._plan is not None:
                self._plan(order.plan_name, [])
            self.fetcher.prefetch_stats.waste_job(order.job, "hint")
