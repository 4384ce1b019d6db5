"""Call counts and latency of a data plane, per operation and outcome, for Prometheus.

:class:`MetricsPlane` wraps a plane (usually a remote one, such as a spoke's
:class:`~fabric.client.http.HttpPlane` to its hub) and tells an operator how
often each operation is called, how often it fails and with which error, and
how long it takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from fabric.plane.wrapper import PlaneWrapper

#: The ``outcome`` label of a call that returned.
OK = "ok"


class MetricsPlane(PlaneWrapper):
    """Counts each call of the wrapped plane and observes its latency into ``registry``.

    Metrics are ``{prefix}_calls_total`` and the histogram ``{prefix}_call_seconds``,
    both labelled with ``op`` (the method name) and ``outcome``: ``ok``, or the class
    name of the error raised (``NotFound``, ``Unavailable``...). Both are taken when
    the call returns: for a method that returns a stream (``read_stream``, ``frames``,
    ``diff``...) the latency is the time to open it, and an error raised while the
    stream is read is not counted.
    """

    def __init__(self, inner: Any, registry: CollectorRegistry, prefix: str) -> None:
        super().__init__(inner)
        self.calls = Counter(f"{prefix}_calls", "Data-plane calls", ["op", "outcome"], registry=registry)
        self.latency = Histogram(
            f"{prefix}_call_seconds", "Data-plane call latency", ["op", "outcome"], registry=registry
        )

    def around(self, name: str, call: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> Any:
        start = time.perf_counter()
        try:
            result = call(*args, **kwargs)
        except Exception as exc:
            self._observe(name, type(exc).__name__, start)
            raise
        self._observe(name, OK, start)
        return result

    def _observe(self, op: str, outcome: str, start: float) -> None:
        self.calls.labels(op, outcome).inc()
        self.latency.labels(op, outcome).observe(time.perf_counter() - start)
