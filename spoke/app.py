"""Assembly of the spoke service: the same REST API as the hub, over a SpokePlane."""

from __future__ import annotations

from fastapi import FastAPI

from fabric.api.auth_http import token_authenticator
from fabric.api.service import service_app

from .auth import SpokeAuth
from .plane import SpokePlane


def create_app(plane: SpokePlane, auth: SpokeAuth | None) -> FastAPI:
    """The spoke's ASGI app; ``auth=None`` lets every request act as admin (loopback demos).

    Its ``/metrics`` also shows the spoke's calls to its hub (``plane.upstream_metrics``)."""
    return service_app(
        "spoke",
        "A fabric spoke: the hub's REST API v1, served from a regional cache.",
        lambda: plane,
        token_authenticator(auth.authenticate if auth else None),
        "fabric_spoke",
        plane.stats,
        lambda: {"hub_stream_live": plane.tracker.live()},
        collectors=[plane.upstream_metrics],
    )
