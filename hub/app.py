"""Assembly of the hub service: the engine behind the REST API, tokens and the watch stream."""

from __future__ import annotations

from fastapi import FastAPI, Request

from fabric.api.auth_http import token_authenticator
from fabric.api.service import service_app
from fabric.auth.principal import Principal
from fabric.auth.tokens import TokenStore
from fabric.engine.engine import Engine

from .groups import groups_router
from .owners import OwningPlane, acting_for
from .tokens import tokens_router
from .watch import watch_router


def create_app(engine: Engine, tokens: TokenStore, auth: bool = True) -> FastAPI:
    """The hub's ASGI app. ``auth=False`` lets every request act as admin (loopback demos only)."""
    bearer = token_authenticator(tokens.authenticate if auth else None)

    def authenticate(request: Request) -> Principal:
        return acting_for(request, bearer(request), tokens)

    def health() -> dict:
        engine.catalog.setting("schema_version")  # the catalog answers
        return {}

    plane = OwningPlane(engine, tokens)
    app = service_app(
        "hub",
        "Versioned, deduplicated datasets: REST API v1 of a fabric hub.",
        lambda: plane,
        authenticate,
        "fabric_catalog",
        engine.catalog.stats,
        health,
    )
    app.include_router(tokens_router(tokens, bearer))
    app.include_router(watch_router(engine.catalog, bearer))
    app.include_router(groups_router(engine.catalog, bearer))
    return app
