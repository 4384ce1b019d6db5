"""Whether prefetching pays: per job and per kind (hint, learned, readahead).

Each chunk a worker fetched for a prefetch (not for a waiting reader) is *outstanding*
until a demand read takes it (``used``; ``covered`` when that read found it in the
cache rather than waiting for it) or it is found gone from the cache unread
(``wasted``: evicted). The cache is not asked to report evictions: outstanding chunks
are checked against it lazily (:meth:`PrefetchStats.sweep`, run on each stats
snapshot and whenever the outstanding set reaches its bound). A job forgotten by the
:class:`~spoke.jobs.JobTable` counts its outstanding chunks as wasted.

accuracy = used / prefetched; coverage = covered / demand bytes; both per job and kind.

In a spoke group a prefetch may fill only the owner's cache (``held``, :mod:`spoke.fetch`).
Such a chunk counts as prefetched when the owner sent it; a demand read of it counts as
used and as covered (it is read from the owner's cache over the LAN, not waited for from
the hub: this spoke cannot see whether the owner evicted it meanwhile, in which case the
read did wait on the hub). It is never found "evicted" here: it is wasted only when its
job is dropped, or when the outstanding set overflows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from .jobs import KINDS, JobRecord, JobTable, PrefetchCounters

#: Outstanding chunks remembered at most; past it, the oldest ones that are still unread
#: count as wasted (they have sat in the cache unread for a long time).
MAX_OUTSTANDING = 65_536
#: The job key of prefetches no job asked for (in the totals only).
NO_JOB = ""


class PrefetchStats:
    def __init__(self, jobs: JobTable, contains: Callable[[bytes], bool], max_outstanding: int = MAX_OUTSTANDING) -> None:
        self.jobs = jobs
        self._contains = contains
        self.max_outstanding = max_outstanding
        self._lock = threading.Lock()
        #: chunk id -> (job, kind, raw bytes, held by its owner), oldest first.
        self._outstanding: OrderedDict[bytes, tuple[str, str, int, bool]] = OrderedDict()
        self.totals = {k: PrefetchCounters() for k in KINDS}
        #: The most bytes ever outstanding at once, per (job, kind): what a lookahead held ahead.
        #: A chunk a demand read has asked for is no longer ahead, though its bytes are counted
        #: as used only once they are sent (:meth:`reading`).
        self._ahead: dict[tuple[str, str], int] = {}
        self.ahead_max: dict[tuple[str, str], int] = {}
        self._being_read: set[bytes] = set()  # outstanding chunks already taken out of ``_ahead``

    def fetched(self, cid: bytes, nbytes: int, job: str | None, kind: str, held: bool = False) -> None:
        """A worker fetched ``cid`` because ``job`` asked for it ahead of need (``held``:
        into its owner's cache in the group, not this spoke's)."""
        job = job or NO_JOB
        with self._lock:
            if cid in self._outstanding:
                return
            self._outstanding[cid] = (job, kind, nbytes, held)
            self.totals[kind].prefetched += nbytes
            key = (job, kind)
            self._ahead[key] = self._ahead.get(key, 0) + nbytes
            self.ahead_max[key] = max(self.ahead_max.get(key, 0), self._ahead[key])
            full = len(self._outstanding) > self.max_outstanding
        self._to_job(job, kind, "prefetched", nbytes)
        if full:
            self.sweep(force=True)

    def reading(self, ids: Iterable[bytes]) -> None:
        """A demand read asks for ``ids``: those outstanding are no longer held ahead of it
        (a lookahead moves on as soon as a read is asked, before its bytes are sent)."""
        if not self._outstanding:  # no prefetch waits to be read: most demand reads, no lock taken
            return
        with self._lock:
            for cid in ids:
                tag = self._outstanding.get(cid)
                if tag is not None and cid not in self._being_read:
                    self._being_read.add(cid)
                    self._ahead[(tag[0], tag[1])] -= tag[2]

    def _settle(self, cid: bytes) -> tuple[str, str, int, bool] | None:
        """Under the lock: ``cid`` leaves the outstanding set; its tag, None if it was not in it."""
        tag = self._outstanding.pop(cid, None)
        if tag is not None:
            if cid in self._being_read:
                self._being_read.discard(cid)
            else:
                self._ahead[(tag[0], tag[1])] -= tag[2]
        return tag

    def demanded(self, cid: bytes, nbytes: int, job: str | None, hit: bool) -> None:
        """A demand read took ``cid`` (``hit``: from the cache, without waiting on the hub)."""
        with self._lock:
            tag = self._settle(cid)
            if tag is None:
                return
            pjob, kind, size, held = tag
            hit = hit or held
            self.totals[kind].used += nbytes
            if hit:
                self.totals[kind].covered += nbytes
        self._to_job(pjob, kind, "used", nbytes)
        if hit and job:
            self._to_job(job, kind, "covered", nbytes)

    def sweep(self, force: bool = False) -> None:
        """Count outstanding chunks no longer cached as wasted; ``force`` (the set is over its
        bound) also gives up on the oldest quarter, cached or not."""
        with self._lock:
            items = list(self._outstanding.items())
        gone = [cid for cid, (_, _, _, held) in items if not held and not self._contains(cid)]
        if force:
            gone += [cid for cid, _ in items[: max(1, len(items) // 4)]]
        self._waste(gone)

    def waste_job(self, job: str, kind: str | None = None) -> None:
        """``job`` will not read what it prefetched (of ``kind``; None: of every kind): wasted."""
        with self._lock:
            gone = [cid for cid, (j, k, _, _) in self._outstanding.items() if j == job and kind in (None, k)]
        self._waste(gone)

    def forget_job(self, job: str) -> None:
        """``job``'s state is dropped: its unread prefetches are wasted."""
        self.waste_job(job)
        with self._lock:
            for key in [k for k in self._ahead if k[0] == job]:
                del self._ahead[key]
                self.ahead_max.pop(key, None)

    def _waste(self, ids: list[bytes]) -> None:
        wasted: list[tuple[str, str, int]] = []
        with self._lock:
            for cid in dict.fromkeys(ids):
                tag = self._settle(cid)
                if tag is not None:
                    job, kind, size, _ = tag
                    self.totals[kind].wasted += size
                    wasted.append((job, kind, size))
        for job, kind, size in wasted:
            self._to_job(job, kind, "wasted", size)

    def _to_job(self, job: str, kind: str, what: str, nbytes: int) -> None:
        if not job or (what == "wasted" and job not in self.jobs):
            return

        def add(r: JobRecord) -> None:
            counters = r.prefetch[kind]
            setattr(counters, what, getattr(counters, what) + nbytes)

        self.jobs.update(job, add)

    def held(self, cid: bytes) -> bool:
        """Whether ``cid`` was prefetched into its owner's cache and is not read yet."""
        with self._lock:
            tag = self._outstanding.get(cid)
            return tag is not None and tag[3]

    def snapshot(self) -> dict:
        """Totals by kind, and each job's most bytes held ahead (by kind)."""
        self.sweep()
        with self._lock:
            totals = {kind: c.snapshot() for kind, c in self.totals.items()}
            ahead = {}
            for (job, kind), n in self.ahead_max.items():
                if job:
                    ahead.setdefault(job, {})[kind] = n
            return {"totals": totals, "ahead_max_bytes": ahead, "outstanding_chunks": len(self._outstanding)}
