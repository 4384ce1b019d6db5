"""Assembly of the spoke service: the same REST API as the hub, over a SpokePlane."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import Gauge

from fabric import __version__
from fabric.api.auth_http import token_authenticator
from fabric.api.errors import install_error_handlers
from fabric.api.metrics import Metrics, MetricsMiddleware
from fabric.api.rest import build_router

from .auth import SpokeAuth
from .plane import SpokePlane


def create_app(plane: SpokePlane, auth: SpokeAuth | None) -> FastAPI:
    """The spoke's ASGI app; ``auth=None`` lets every request act as admin (loopback demos)."""
    app = FastAPI(
        title="fabric spoke",
        version=__version__,
        description="A fabric spoke: the hub's REST API v1, served from a regional cache.",
    )
    install_error_handlers(app)
    authenticate = token_authenticator(auth.authenticate if auth else None)
    app.include_router(build_router(lambda: plane, authenticate))

    metrics = Metrics("spoke")
    gauge = Gauge("fabric_spoke", "Spoke cache and upstream traffic", ["what"], registry=metrics.registry)

    def collect() -> None:
        for key, value in plane.stats().items():
            if isinstance(value, (int, float)):
                gauge.labels(key).set(value)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict:
        return {"status": "ok", "role": "spoke", "version": __version__, "hub_stream_live": plane.tracker.live()}

    @app.get("/metrics", tags=["service"], include_in_schema=False)
    def metrics_endpoint():  # noqa: ANN202 - a plain-text Response
        return metrics.response(collect)

    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app
