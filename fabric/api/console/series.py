"""Time series for the console's plots: a bounded sampler of a service's counters.

Every ``interval`` seconds (env ``FABRIC_CONSOLE_SAMPLE_SECONDS``, default 5) a daemon
thread calls ``sample()`` and keeps its numeric values, the last ``keep`` samples (720:
an hour at 5 s). Counters that only grow (bytes, hits) are turned into rates or ratios per
interval when plotted (:meth:`Sampler.delta`); levels (cache use, backlog) are plotted as
they are (:meth:`Sampler.level`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

log = logging.getLogger("fabric.console")

INTERVAL_ENV = "FABRIC_CONSOLE_SAMPLE_SECONDS"
DEFAULT_INTERVAL = 5.0
DEFAULT_KEEP = 720

Point = tuple[float, float]


def interval_from_env() -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return min(max(value, 0.05), 3600.0)


class Sampler:
    def __init__(self, sample: Callable[[], Mapping[str, float]], interval: float | None = None, keep: int = DEFAULT_KEEP) -> None:
        self._sample = sample
        self.interval = interval if interval is not None else interval_from_env()
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.take()
            self._stop.wait(self.interval)

    def take(self) -> None:
        """Take one sample now (a failing source is logged and skipped)."""
        try:
            values = {k: float(v) for k, v in self._sample().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        except Exception as exc:  # noqa: BLE001 - a plot must never take the service down
            log.debug("console sample failed: %s", exc)
            return
        with self._lock:
            self._samples.append((time.time(), values))

    def samples(self) -> list[tuple[float, dict[str, float]]]:
        with self._lock:
            return list(self._samples)

    def level(self, key: str) -> list[Point]:
        return [(t, v[key]) for t, v in self.samples() if key in v]

    def delta(self, key: str, per_second: bool = False) -> list[Point]:
        """The growth of counter ``key`` in each interval (a reset counts as 0)."""
        out: list[Point] = []
        prev: tuple[float, float] | None = None
        for t, values in self.samples():
            if key not in values:
                continue
            if prev is not None:
                d = max(values[key] - prev[1], 0.0)
                if per_second:
                    d /= max(t - prev[0], 1e-6)
                out.append((t, d))
            prev = (t, values[key])
        return out

    def ratio(self, part: str, other: str) -> list[Point]:
        """Per interval: growth of ``part`` / (growth of ``part`` + growth of ``other``);
        intervals where neither grew are left out."""
        a, b = self.delta(part), dict(self.delta(other))
        out = []
        for t, x in a:
            y = b.get(t, 0.0)
            if x + y > 0:
                out.append((t, x / (x + y)))
        return out
