"""Learned prefetch: fetch what a job will read, as earlier jobs of its dataset did.

Each file a job opens at the spoke (``SpokePlane.stat_chunks``: mount and fsspec opens;
``SpokePlane.open_file``: REST and S3 reads) is told to :meth:`LearnedPrefetch.opened`
with the request's job (``X-Fabric-Job``). Reads without a job id are neither recorded
nor prefetched for: the spoke cannot tell one anonymous client's stream from another's,
and mixed streams would teach wrong orders. The call only queues the event (bounded:
events past :data:`QUEUE_EVENTS` are dropped); one background thread does the rest:

1. **Record** (:mod:`spoke.workload`): per (job, repository, ref) a *session* keeps the
   files opened this epoch; they and their successor pairs are written to the model of
   the dataset (after :data:`~spoke.workload.PREFIX_READS` opens fix its prefix, or at once
   when the first open falls under a known dataset). A file opened again after at least
   ``min(64, half the files read)`` others starts a new epoch.
2. **Predict and prefetch**: while the session's job reads inside the dataset's working
   set, the predicted next files (:meth:`spoke.workload.Dataset.predict`) are fetched at
   BACKGROUND priority (``kind="learned"``, tagged with the job), in order, until the
   bytes fetched ahead and not yet opened reach the session's window. That starts small
   (the hint window), so a job that opens one file of the dataset and then reads
   something else costs little; once :data:`GROW_AFTER` opens in a row were inside the
   working set, it doubles at each further one, up to ``fabric spoke --prefetch-window``
   (half the chunk cache by default), and an open outside it brings it back to the start.
   A job reading in an order nobody can predict (a new random order every epoch) is
   covered only by what was fetched ahead of it, so the window must be able to hold the
   working set: with a window of a third of it, coverage at a data rate of a third of the
   link is about 64% at best, with all of it about 77%. The chunks ahead are the cache's
   plan for the job (:meth:`fabric.cache.disk.DiskCache.plan`), so they are not evicted
   before they are read.
   A file fetched ahead that the job has not opened within :data:`STALE_OPENS` opens
   leaves the window (a wrong guess).
3. **Stop**: once :data:`MIN_OPENS` of the last :data:`RECENT_OPENS` opens are known and
   fewer than :data:`STOP_RATIO` of them were in the working set, the session stops
   prefetching for good (its plan is dropped): a job that reads something else wastes at
   most about one window.

Background prefetch never delays a demand read: demand is first in the fetch queue and
background batches may use at most ``--prefetch-share`` of the fetch workers
(:class:`spoke.fetch.FetchScheduler`). Whether it pays (accuracy, coverage, waste per job)
is counted by :mod:`spoke.prefetch_stats` under the kind ``learned``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fabric.cache.disk import DiskCache
from fabric.errors import FabricError

from .fetch import BACKGROUND, FetchScheduler
from .jobs import current_job
from .workload import MAX_FILES, PREFIX_READS, Dataset, WorkloadStore, common_directory

log = logging.getLogger("fabric.spoke.learned")

#: The share of the fetch workers background (learned) prefetch may keep busy (``fabric spoke --prefetch-share``).
PREFETCH_SHARE = 0.25
#: Events waiting for the background thread, at most (more are dropped: learning is best effort).
QUEUE_EVENTS = 10_000
#: Sessions kept (least recently active dropped).
MAX_SESSIONS = 256
#: The stop rule: over the last RECENT_OPENS opens (at least MIN_OPENS), fewer than STOP_RATIO in the working set.
RECENT_OPENS, MIN_OPENS, STOP_RATIO = 16, 8, 0.5
#: The share of the window fetched ahead after which the cache's plan for a session is set again.
REPLAN_FRACTION = 1 / 8
#: Opens in a row inside the working set after which a session's window grows (doubling at each).
GROW_AFTER = 4
#: Opens after which a file fetched ahead and still unopened counts as a wrong guess.
STALE_OPENS = 64
#: Observations written to the model at a time (and whenever the thread is idle).
FLUSH_OPENS = 256
IDLE_FLUSH = 0.5

#: ``resolve(repo, ref)`` -> a function from a path to its (size, chunk ids), None when not a file.
Resolve = Callable[[str, str], Callable[[str], "tuple[int, list[bytes]] | None"]]


@dataclass
class _Session:
    job: str
    repo: str
    ref: str
    dataset: Dataset | None = None
    first: list[str] = field(default_factory=list)  # paths opened before the prefix is fixed
    read: dict[str, int] = field(default_factory=dict)  # this epoch's files -> open number
    opens: int = 0
    last: str | None = None
    files: list[tuple[str, int]] = field(default_factory=list)  # not yet written
    pairs: list[tuple[str, str]] = field(default_factory=list)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_OPENS))
    inside_run: int = 0  # the last opens in a row that were inside the working set
    ahead: OrderedDict = field(default_factory=OrderedDict)  # path -> (bytes, open number, chunk ids)
    unplanned: int = 0  # bytes fetched ahead since the cache's plan was last set
    stopped: bool = False

    @property
    def name(self) -> str:
        return f"learned:{self.job}:{self.repo}@{self.ref}"


class LearnedPrefetch:
    def __init__(
        self,
        store: WorkloadStore,
        resolve: Resolve,
        fetcher: FetchScheduler,
        cache: DiskCache,
        window: int,
        enabled: bool = True,
        hinted: Callable[[str, str], bool] | None = None,
        first_window: int | None = None,
    ) -> None:
        """``window``: the most bytes fetched ahead of a session; ``first_window``: a session's
        window until it has read :data:`GROW_AFTER` files of the working set in a row (the
        same as ``window`` if None). ``hinted(job, repo)``: whether the job has sent its read
        order for the repository (then its hints, not what others did, say what it reads
        next: nothing is predicted)."""
        self.store = store
        self._hinted = hinted
        self._resolve = resolve
        self.fetcher = fetcher
        self.cache = cache
        self.window = window
        self.first_window = window if first_window is None else min(first_window, window)
        self.enabled = enabled and window > 0
        self._events: queue.Queue = queue.Queue(QUEUE_EVENTS)
        self._sessions: OrderedDict[tuple[str, str, str], _Session] = OrderedDict()
        self.dropped_events = self.stopped_sessions = self.prefetched_files = self.prefetched_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="learned-prefetch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.store.close()

    def opened(self, repo: str, ref: str, path: str, size: int) -> None:
        """A file was opened for reading by the current request's job (nothing without one)."""
        job = current_job()
        if job is None:
            return
        try:
            self._events.put_nowait((job, repo, ref, path, size))
        except queue.Full:
            self.dropped_events += 1

    def stats(self) -> dict:
        active = sum(1 for s in self._sessions.values() if s.dataset is not None and not s.stopped)
        return {
            **self.store.stats(),
            "sessions": len(self._sessions),
            "sessions_prefetching": active,
            "sessions_stopped": self.stopped_sessions,
            "prefetched_files": self.prefetched_files,
            "prefetched_bytes": self.prefetched_bytes,
            "dropped_events": self.dropped_events,
            "window_bytes": self.window,
            "first_window_bytes": self.first_window,
        }

    # -- the background thread -----------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._events.get(timeout=IDLE_FLUSH)
            except queue.Empty:
                self._flush_all()
                continue
            try:
                self._handle(*event)
                if self._events.empty():
                    self._flush_all()
            except Exception:  # noqa: BLE001 - learning is best effort; the reads it watches go on
                log.exception("learned prefetch: an open of %s could not be handled", event[3])
            finally:
                self._events.task_done()
        self._flush_all()

    def _session(self, job: str, repo: str, ref: str) -> _Session:
        key = (job, repo, ref)
        s = self._sessions.get(key)
        if s is None:
            s = self._sessions[key] = _Session(job, repo, ref)
            while len(self._sessions) > MAX_SESSIONS:
                self._end(self._sessions.popitem(last=False)[1])
        self._sessions.move_to_end(key)
        return s

    def _end(self, s: _Session) -> None:
        self._flush(s)
        self.cache.drop_plan(s.name)

    def _handle(self, job: str, repo: str, ref: str, path: str, size: int) -> None:
        s = self._session(job, repo, ref)
        if path == s.last:
            return  # the same file again (a stat, then its bytes; a ranged read)
        if path in s.read:
            if s.opens - s.read[path] < min(64, max(1, len(s.read) // 2)):
                return  # a loader worker's late open of a recent file
            self._new_epoch(s)  # read again long after
        elif len(s.read) >= MAX_FILES:
            self._new_epoch(s)
        s.opens += 1
        s.read[path] = s.opens
        if s.last is not None:
            s.pairs.append((s.last, path))
        s.last = path
        s.files.append((path, size))
        if s.dataset is None:
            self._place(s, path)
        if s.dataset is not None:
            inside = path in s.dataset
            s.recent.append(inside)
            s.inside_run = s.inside_run + 1 if inside else 0
            s.ahead.pop(path, None)
            if len(s.files) >= FLUSH_OPENS:
                self._flush(s)
            self._prefetch(s)

    def _new_epoch(self, s: _Session) -> None:
        """The job reads the dataset again: what it read, and whether prefetch paid, start afresh."""
        s.read.clear()
        s.recent.clear()
        s.stopped = False

    def _place(self, s: _Session, path: str) -> None:
        """Find the session's dataset: a known one holding its first file, else one whose
        prefix its first opens fix."""
        if not s.first:
            s.dataset = self.store.find(s.repo, path)
        if s.dataset is None:
            s.first.append(path)
            if len(s.first) >= PREFIX_READS:
                self._fix_prefix(s)

    def _fix_prefix(self, s: _Session) -> None:
        """The session's dataset: the one whose prefix holds every file of its first opens."""
        s.dataset = self.store.dataset(s.repo, common_directory(s.first))
        s.first.clear()

    def _prefetch(self, s: _Session) -> None:
        if not self.enabled or s.stopped or (self._hinted is not None and self._hinted(s.job, s.repo)):
            return
        if len(s.recent) >= MIN_OPENS and sum(s.recent) < STOP_RATIO * len(s.recent):
            s.stopped = True
            self.stopped_sessions += 1
            s.ahead.clear()
            self.cache.drop_plan(s.name)
            return
        if not s.recent or not s.recent[-1] and sum(s.recent) < STOP_RATIO * len(s.recent):
            return  # not (or no longer) reading inside the working set
        for path in [p for p, (_, at, _) in s.ahead.items() if s.opens - at >= STALE_OPENS]:
            del s.ahead[path]
        used = sum(n for n, _, _ in s.ahead.values())
        window = self.window_of(s)
        if used >= window:
            return
        resolve = None
        fetched = False
        for path in s.dataset.predict(s.last, _Skip(s.read, s.ahead)):
            if used >= window:
                break
            if resolve is None:
                try:
                    resolve = self._resolve(s.repo, s.ref)
                except FabricError:
                    return
            try:
                found = resolve(path)
            except FabricError:
                found = None
            if found is None:
                continue
            size, ids = found
            s.ahead[path] = (size, s.opens, ids)
            used += size
            s.unplanned += size
            self.fetcher.prefetch(ids, BACKGROUND, job=s.job, kind="learned")
            self.prefetched_files += 1
            self.prefetched_bytes += size
            fetched = True
        # The plan is set again once an eighth of a window was added to it (or when it held
        # nothing): setting it for every file opened walked the whole window at each open.
        if fetched and (s.unplanned >= window * REPLAN_FRACTION or s.unplanned == used):
            self.cache.plan([cid for _, _, ids in s.ahead.values() for cid in ids], s.name)
            s.unplanned = 0

    def window_of(self, s: _Session) -> int:
        """The bytes ``s`` may have fetched ahead: the first window, doubled at each open inside
        the working set from the :data:`GROW_AFTER`-th in a row on, at most :attr:`window`."""
        doublings = s.inside_run - GROW_AFTER + 1
        if doublings <= 0:
            return self.first_window
        return min(self.window, self.first_window << min(doublings, 40))

    def _flush_all(self) -> None:
        for s in list(self._sessions.values()):
            self._flush(s)

    def _flush(self, s: _Session) -> None:
        if s.dataset is None and len(s.first) >= 2:  # a short job: its opens so far fix the prefix
            self._fix_prefix(s)
        if s.dataset is None or not (s.files or s.pairs):
            return
        files, pairs, s.files, s.pairs = s.files, s.pairs, [], []
        try:
            self.store.record(s.dataset, files, pairs)
        except Exception:  # noqa: BLE001 - a full disk must not stop the reads
            log.exception("learned prefetch: the model of %s could not be written", s.repo)


class _Skip:
    """Paths prediction passes over: read this epoch, or already fetched ahead."""

    def __init__(self, read: dict, ahead: dict) -> None:
        self.read, self.ahead = read, ahead

    def __contains__(self, path: object) -> bool:
        return path in self.read or path in self.ahead
