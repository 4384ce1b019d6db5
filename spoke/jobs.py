"""Jobs at a spoke: which job a request reads for, and what each job's reads cost.

The job id comes from the request's ``X-Fabric-Job`` header, checked and kept by the
service's :class:`~fabric.api.jobs.JobMiddleware` for the request's duration;
:func:`current_job` reads it anywhere below a route (plane methods, the fetch
scheduler, streamed bodies). :class:`JobTable` keeps per-job counters for the
spoke's stats and ``/metrics``: demand bytes, cache hits, seconds waited on the hub,
and the prefetch figures (:mod:`spoke.prefetch_stats`), for at most
:data:`MAX_JOBS` jobs (the least recently active is dropped).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fabric.api.jobs import request_job

#: Jobs whose counters a spoke keeps.
MAX_JOBS = 256
#: Kinds of prefetch, by who asked for it: a loader's hint, a learned pattern, a reader's readahead.
KINDS = ("hint", "learned", "readahead")


def current_job() -> str | None:
    """The job the request being served reads for (its ``X-Fabric-Job``), if any."""
    return request_job()


@dataclass
class PrefetchCounters:
    """Bytes of one kind of prefetch: fetched ahead; of those, later read by a demand read
    (``used``); demand bytes served from the cache because of it (``covered``); and fetched
    ahead but evicted, or still unread when forgotten (``wasted``)."""

    prefetched: int = 0
    used: int = 0
    covered: int = 0
    wasted: int = 0

    def snapshot(self) -> dict:
        return {
            "prefetched_bytes": self.prefetched,
            "used_bytes": self.used,
            "covered_bytes": self.covered,
            "wasted_bytes": self.wasted,
            "accuracy": self.used / self.prefetched if self.prefetched else None,
        }


@dataclass
class JobRecord:
    demand_bytes: int = 0
    hit_bytes: int = 0
    wan_wait_seconds: float = 0.0
    last_active: float = field(default_factory=time.time)
    prefetch: dict[str, PrefetchCounters] = field(default_factory=lambda: {k: PrefetchCounters() for k in KINDS})

    def snapshot(self) -> dict:
        prefetch = {kind: c.snapshot() for kind, c in self.prefetch.items()}
        covered = sum(c.covered for c in self.prefetch.values())
        return {
            "demand_bytes": self.demand_bytes,
            "hit_bytes": self.hit_bytes,
            "hit_ratio": self.hit_bytes / self.demand_bytes if self.demand_bytes else None,
            "wan_wait_seconds": round(self.wan_wait_seconds, 6),
            "prefetch_coverage": covered / self.demand_bytes if self.demand_bytes else None,
            "last_active": self.last_active,
            "prefetch": prefetch,
        }


class JobTable:
    """Per-job counters, bounded to ``max_jobs`` (least recently active dropped; ``on_drop``
    is told each job dropped, outside the table's lock)."""

    def __init__(self, max_jobs: int = MAX_JOBS, on_drop: Callable[[str], None] | None = None) -> None:
        self.max_jobs = max_jobs
        self.on_drop = on_drop
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, JobRecord] = OrderedDict()

    def update(self, job: str, change: Callable[[JobRecord], None]) -> None:
        """Apply ``change`` to ``job``'s record (made if new) under the table's lock."""
        dropped = []
        with self._lock:
            record = self._jobs.get(job)
            if record is None:
                record = self._jobs[job] = JobRecord()
                while len(self._jobs) > self.max_jobs:
                    dropped.append(self._jobs.popitem(last=False)[0])
            else:
                self._jobs.move_to_end(job)
            record.last_active = time.time()
            change(record)
        for gone in dropped:
            if self.on_drop is not None:
                self.on_drop(gone)

    def demand(self, job: str, nbytes: int, hit_bytes: int, wait: float) -> None:
        """A demand read of ``nbytes`` by ``job``: ``hit_bytes`` of them from the cache, ``wait``
        seconds spent waiting for the rest from the hub."""

        def add(r: JobRecord) -> None:
            r.demand_bytes += nbytes
            r.hit_bytes += hit_bytes
            r.wan_wait_seconds += wait

        self.update(job, add)

    def __contains__(self, job: str) -> bool:
        with self._lock:
            return job in self._jobs

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return {job: r.snapshot() for job, r in self._jobs.items()}


class JobMetrics:
    """A Prometheus collector of a :class:`JobTable`: ``fabric_spoke_job_*{job=...}`` (and
    ``kind=`` for prefetch figures), one series per job kept."""

    def __init__(self, table: JobTable) -> None:
        self.table = table

    def collect(self) -> Iterator[Metric]:
        jobs = self.table.snapshot()
        demand = CounterMetricFamily("fabric_spoke_job_demand_bytes", "Bytes a job read (demand)", labels=["job"])
        hits = CounterMetricFamily("fabric_spoke_job_hit_bytes", "Bytes of a job's demand reads found in the cache", labels=["job"])
        ratio = GaugeMetricFamily("fabric_spoke_job_hit_ratio", "Cache hit bytes / demand bytes of a job", labels=["job"])
        wait = CounterMetricFamily("fabric_spoke_job_wan_wait_seconds", "Seconds a job's demand reads waited on the hub", labels=["job"])
        families = {
            what: CounterMetricFamily(f"fabric_spoke_job_prefetch_{what}_bytes", doc, labels=["job", "kind"])
            for what, doc in (
                ("prefetched", "Bytes fetched ahead for a job"),
                ("used", "Bytes fetched ahead for a job and later read by a demand read"),
                ("covered", "Bytes of a job's demand reads served from chunks fetched ahead"),
                ("wasted", "Bytes fetched ahead for a job and evicted, or dropped, unread"),
            )
        }
        for job, r in jobs.items():
            demand.add_metric([job], r["demand_bytes"])
            hits.add_metric([job], r["hit_bytes"])
            wait.add_metric([job], r["wan_wait_seconds"])
            if r["hit_ratio"] is not None:
                ratio.add_metric([job], r["hit_ratio"])
            for kind, counters in r["prefetch"].items():
                for what, family in families.items():
                    family.add_metric([job, kind], counters[f"{what}_bytes"])
        yield from (demand, hits, ratio, wait, *families.values())
