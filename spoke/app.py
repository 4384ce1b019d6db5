"""Assembly of the spoke service: the same REST API as the hub, over a SpokePlane."""

from __future__ import annotations

from fastapi import FastAPI

from fabric.api.auth_http import token_authenticator
from fabric.api.console import ConsoleSource
from fabric.api.service import service_app
from fabric.plane.dataplane import DataPlane

from .auth import SpokeAuth
from .jobs import JobMetrics
from .local_reads_api import local_reads_router
from .mirror_api import mirror_router
from .plane import SpokePlane
from .replica_api import replica_router
from .writeback_api import writeback_router


def create_app(plane: SpokePlane, auth: SpokeAuth | None, served: DataPlane | None = None) -> FastAPI:
    """The spoke's ASGI app; ``auth=None`` lets every request act as admin (loopback demos).

    The REST API serves ``served`` (default: ``plane``; the spoke passes it wrapped in
    :class:`~spoke.owners.CreatorAware`). Its ``/metrics`` also shows the spoke's calls to
    its hub (``plane.upstream_metrics``) and each job's reads (``fabric_spoke_job_*``)."""
    rest_plane = served or plane
    authenticate = token_authenticator(auth.authenticate if auth else None)

    def health() -> dict:
        """The console's health page: the stats, the watch stream's position and the ref lease."""
        return {**plane.stats(), "watch_seq": plane.tracker.seq, "watch_lease_seconds": plane.tracker.lease}

    console = ConsoleSource(verify_token=auth.authenticate if auth else None, sample=plane.stats, health=health)
    app = service_app(
        "spoke",
        "A fabric spoke: the hub's REST API v1, served from a regional cache.",
        lambda: rest_plane,
        authenticate,
        "fabric_spoke",
        plane.stats,
        lambda: {"hub_stream_live": plane.tracker.live(), "hub_reachable": plane.breaker.state()["reachable"]},
        collectors=[plane.upstream_metrics, JobMetrics(plane.fetcher.jobs)],
        console=console,
    )
    app.include_router(writeback_router(plane.writeback, authenticate))
    app.include_router(replica_router(plane, authenticate))
    app.include_router(mirror_router(plane.mirrors, plane.replication, authenticate))
    app.include_router(local_reads_router(plane.read_locally, authenticate))
    return app
