"""REST API v1 over any data plane (served by the hub and by every spoke).

Routes translate HTTP to :class:`~fabric.plane.dataplane.DataPlane` calls and
:mod:`fabric.errors` to statuses; every route checks the caller's role on the
repository it touches before calling the plane.

One module per group of routes: :mod:`.refs` (repositories, branches, commits,
tags), :mod:`.objects`, :mod:`.hints` (loader hints), :mod:`fabric.api.exchange` (chunks and metadata objects,
for spokes and caches), :mod:`.admin` and :mod:`.buckets` (S3 bucket bindings).
"""

from fastapi import APIRouter

from fabric.api.exchange import add_exchange_routes
from fabric.api.rest.admin import add_admin_routes
from fabric.api.rest.buckets import add_bucket_routes
from fabric.api.rest.hints import add_hint_routes
from fabric.api.rest.objects import add_object_routes
from fabric.api.rest.refs import add_ref_routes
from fabric.api.routing import API_PREFIX, ERRORS, Authenticator, BoundedJsonRoute, PlaneGetter

__all__ = ["Authenticator", "PlaneGetter", "build_router"]


def build_router(get_plane: PlaneGetter, authenticate: Authenticator) -> APIRouter:
    """The ``/api/v1`` routes over the plane returned by ``get_plane``."""
    router = APIRouter(prefix=API_PREFIX, responses=ERRORS, route_class=BoundedJsonRoute)
    for add_routes in (add_ref_routes, add_object_routes, add_exchange_routes, add_admin_routes, add_bucket_routes, add_hint_routes):
        add_routes(router, get_plane, authenticate)
    return router
