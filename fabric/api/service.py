"""What every fabric service app has: REST v1 over a plane, errors, /healthz, /metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from fastapi import FastAPI
from prometheus_client import Gauge
from prometheus_client.registry import Collector

from fabric import __version__
from fabric.api.console import ConsoleSource, install_console
from fabric.api.errors import install_error_handlers
from fabric.api.jobs import JobMiddleware
from fabric.api.metrics import Metrics, MetricsMiddleware
from fabric.api.rest import PlaneGetter, build_router
from fabric.auth.principal import Principal


def service_app(
    role: str,
    description: str,
    get_plane: PlaneGetter,
    authenticate: Callable[..., Principal],
    gauge_name: str,
    gauge_values: Callable[[], Mapping[str, object]],
    health: Callable[[], dict],
    collectors: Sequence[Collector] = (),
    console: ConsoleSource | None = None,
) -> FastAPI:
    """A service's ASGI app; callers add their own routers before serving it.

    A request's ``X-Fabric-Job`` is checked (400 when invalid) and kept for the code that
    serves it (:func:`fabric.api.jobs.request_job`).

    ``gauge_values`` feeds the ``gauge_name`` gauge (numeric values only) on each
    scrape; ``health`` adds fields to ``/healthz`` (and raises when unhealthy);
    ``collectors`` (e.g. a registry of the service's own metrics) are served on
    ``/metrics`` too. ``console``: serve the web console at ``/ui`` (:mod:`fabric.api.console`).
    """
    app = FastAPI(title=f"fabric {role}", version=__version__, description=description)
    install_error_handlers(app)
    app.include_router(build_router(get_plane, authenticate))

    metrics = Metrics(role)
    gauge = Gauge(gauge_name, f"fabric {role} sizes and counters", ["what"], registry=metrics.registry)
    for collector in collectors:
        metrics.registry.register(collector)

    def collect() -> None:
        for key, value in gauge_values().items():
            if isinstance(value, (int, float)):
                gauge.labels(key).set(value)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict:
        return {"status": "ok", "role": role, "version": __version__, **health()}

    @app.get("/metrics", tags=["service"], include_in_schema=False)
    def metrics_endpoint():  # noqa: ANN202 - a plain-text Response
        return metrics.response(collect)

    if console is not None:
        install_console(app, role, get_plane, console, lambda: http_totals(metrics))

    app.add_middleware(JobMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def http_totals(metrics: Metrics) -> dict[str, float]:
    """Requests served (all, and 5xx) and body bytes in and out, since the process started."""
    out = {"http_requests": 0.0, "http_errors": 0.0, "http_bytes_in": 0.0, "http_bytes_out": 0.0}
    for family in metrics.requests.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                out["http_requests"] += s.value
                if s.labels.get("status", "").startswith("5"):
                    out["http_errors"] += s.value
    for family in metrics.bytes.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                out["http_bytes_" + s.labels.get("direction", "in")] += s.value
    return out
