"""Assembly of the hub service: the engine behind the REST API, tokens and the watch stream."""

from __future__ import annotations

from fastapi import FastAPI, Request

from fabric.api.auth_http import token_authenticator
from fabric.api.console import ConsoleSource
from fabric.api.service import service_app
from fabric.auth.principal import Principal
from fabric.auth.tokens import TokenStore
from fabric.engine.engine import Engine

from .groups import HEARTBEAT_SECONDS, MISSED_HEARTBEATS, groups_router
from .owners import OwningPlane, acting_for
from .spokes import SpokeRegistry
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
    spokes = SpokeRegistry()

    def repo_usage(repo: str) -> dict:
        """The chunks a repository holds and their stored (compressed) bytes."""
        ((chunks, stored),) = engine.catalog.db.query(
            "SELECT COUNT(*), COALESCE(SUM(c.len), 0) FROM repo_chunks r JOIN chunks c ON c.id = r.chunk WHERE r.repo = ?",
            (repo,),
        )
        return {"chunks": int(chunks), "stored_bytes": int(stored)}

    def spokes_view() -> dict:
        names = {t["id"]: t["name"] for t in tokens.list()}
        return spokes.describe(engine.catalog, names, HEARTBEAT_SECONDS * MISSED_HEARTBEATS)

    console = ConsoleSource(
        verify_token=tokens.authenticate if auth else None,
        sample=lambda: {"last_event_seq": engine.catalog.last_event_seq()},
        spokes=spokes_view,
        repo_usage=repo_usage,
    )
    app = service_app(
        "hub",
        "Versioned, deduplicated datasets: REST API v1 of a fabric hub.",
        lambda: plane,
        authenticate,
        "fabric_catalog",
        engine.catalog.stats,
        health,
        console=console,
    )
    app.include_router(tokens_router(tokens, bearer))
    app.include_router(watch_router(engine.catalog, bearer, spokes))
    app.include_router(groups_router(engine.catalog, bearer))
    return app
