"""Per-operation counters and latency statistics of a mount, for its log."""

from __future__ import annotations

import threading
import time
from typing import Any

#: Latency histogram bucket upper bounds (seconds); the last bucket is open.
BUCKETS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


class OpStats:
    __slots__ = ("count", "errors", "hist", "max", "total")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.total = 0.0
        self.max = 0.0
        self.hist = [0] * (len(BUCKETS) + 1)

    def add(self, seconds: float, failed: bool) -> None:
        self.count += 1
        self.errors += failed
        self.total += seconds
        self.max = max(self.max, seconds)
        i = 0
        while i < len(BUCKETS) and seconds > BUCKETS[i]:
            i += 1
        self.hist[i] += 1

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the ``q`` quantile."""
        want = q * self.count
        seen = 0
        for i, n in enumerate(self.hist):
            seen += n
            if seen >= want and n:
                return BUCKETS[i] if i < len(BUCKETS) else self.max
        return self.max


class Stats:
    def __init__(self) -> None:
        self.ops: dict[str, OpStats] = {}
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def record(self, op: str, seconds: float, failed: bool) -> None:
        with self.lock:
            s = self.ops.get(op)
            if s is None:
                s = self.ops[op] = OpStats()
            s.add(seconds, failed)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {
                op: {
                    "count": s.count,
                    "errors": s.errors,
                    "mean_ms": round(1000 * s.total / s.count, 3) if s.count else 0.0,
                    "p50_ms": round(1000 * s.quantile(0.5), 3),
                    "p99_ms": round(1000 * s.quantile(0.99), 3),
                    "max_ms": round(1000 * s.max, 3),
                }
                for op, s in sorted(self.ops.items())
            }

    def report(self) -> str:
        rows = self.snapshot()
        if not rows:
            return "no operations yet"
        lines = [f"{'op':<12}{'count':>10}{'errors':>8}{'mean ms':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>10}"]
        for op, r in rows.items():
            lines.append(
                f"{op:<12}{r['count']:>10}{r['errors']:>8}{r['mean_ms']:>10.3f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['max_ms']:>10.3f}"
            )
        return "\n".join(lines)
