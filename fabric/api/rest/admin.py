"""REST routes of service administration: stats, fsck and garbage collection."""

from typing import Annotated

from fastapi import APIRouter, Query

from fabric.api.routing import Authenticator, PlaneGetter, caller
from fabric.errors import Forbidden


def add_admin_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the administration routes to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

    @router.get("/stats", tags=["admin"])
    def stats(who: Caller) -> dict:
        """Store-wide figures: they describe every repository, so they need read access to all."""
        if not who.can("*", "read"):
            raise Forbidden(f"token {who.name!r} may not see store-wide stats: that needs read access to every repository")
        return plane().stats()

    @router.post("/admin/fsck", tags=["admin"])
    def fsck(who: Caller, deep: bool = True) -> dict:
        who.require_admin()
        return plane().fsck(deep)

    @router.post("/admin/gc", tags=["admin"])
    def gc(who: Caller, grace: Annotated[float | None, Query(ge=0)] = None, dry_run: bool = False) -> dict:
        who.require_admin()
        return plane().gc(grace, dry_run)
