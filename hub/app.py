"""Assembly of the hub service: the engine behind the REST API, tokens and the watch stream."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import Gauge

from fabric import __version__
from fabric.api.auth_http import token_authenticator
from fabric.api.errors import install_error_handlers
from fabric.api.metrics import Metrics, MetricsMiddleware
from fabric.api.rest import build_router
from fabric.auth import TokenStore
from fabric.engine import Engine

from .tokens import tokens_router
from .watch import watch_router


def create_app(engine: Engine, tokens: TokenStore, auth: bool = True) -> FastAPI:
    """The hub's ASGI app. ``auth=False`` lets every request act as admin (loopback demos only)."""
    app = FastAPI(
        title="fabric hub",
        version=__version__,
        description="Versioned, deduplicated datasets: REST API v1 of a fabric hub.",
    )
    install_error_handlers(app)
    authenticate = token_authenticator(tokens.authenticate if auth else None)
    app.include_router(build_router(lambda: engine, authenticate))
    app.include_router(tokens_router(tokens, authenticate))
    app.include_router(watch_router(engine.catalog, authenticate))

    metrics = Metrics("hub")
    catalog_gauge = Gauge("fabric_catalog", "Catalog sizes", ["what"], registry=metrics.registry)

    def collect() -> None:
        for key, value in engine.catalog.stats().items():
            catalog_gauge.labels(key).set(value)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict:
        engine.catalog.setting("schema_version")
        return {"status": "ok", "role": "hub", "version": __version__}

    @app.get("/metrics", tags=["service"], include_in_schema=False)
    def metrics_endpoint():  # noqa: ANN202 - a plain-text Response
        return metrics.response(collect)

    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app
