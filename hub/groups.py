"""Spoke groups: which spokes of a region share their caches (the hub is the authority).

``POST /api/v1/groups/{name}/members`` with ``{"url": ...}`` is a spoke's
heartbeat: it joins (or stays in) the group, and the answer is the group's live
members and how often to send the next heartbeat. A member that misses
:data:`MISSED_HEARTBEATS` heartbeats in a row leaves. ``GET`` lists the live
members; ``DELETE ...?url=`` is a clean leave. All three need a token with the
``spoke`` right: member URLs are where spokes send their own tokens.

Membership lives in the catalog, so every hub process of one catalog gives the
same answer.
"""

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field

from fabric.api.routing import BoundedJsonRoute
from fabric.auth.principal import SPOKE, Principal
from fabric.catalog import Catalog
from fabric.errors import Forbidden
from fabric.util.groups import MAX_URL, check_group_name, member_url

#: Seconds between a member's heartbeats.
HEARTBEAT_SECONDS = 2.0
#: Heartbeats a member may miss before it leaves its group.
MISSED_HEARTBEATS = 3
#: The most members one group may have.
MAX_MEMBERS = 256


class Heartbeat(BaseModel):
    url: str = Field(min_length=1, max_length=MAX_URL, description="where the other members reach this spoke")


class Members(BaseModel):
    group: str
    members: list[str]
    heartbeat_seconds: float
    ttl_seconds: float


def groups_router(catalog: Catalog, authenticate: Callable[..., Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["groups"], route_class=BoundedJsonRoute)

    def spoke_caller(who: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if not who.has(SPOKE):
            raise Forbidden(
                f"token {who.name!r} is not a spoke's token: spoke groups need the spoke right "
                "(`fabric token create --spoke`)"
            )
        return who

    SpokeCaller = Annotated[Principal, Depends(spoke_caller)]
    ttl = HEARTBEAT_SECONDS * MISSED_HEARTBEATS

    def members(group: str, now: float) -> Members:
        return Members(
            group=group,
            members=catalog.group_members(group, now - ttl),
            heartbeat_seconds=HEARTBEAT_SECONDS,
            ttl_seconds=ttl,
        )

    @router.post("/groups/{name}/members", response_model=Members)
    def heartbeat(name: str, body: Heartbeat, who: SpokeCaller) -> Members:
        """Join group ``name`` (or stay in it): the live members after this heartbeat."""
        group, url = check_group_name(name), member_url(body.url)
        now = time.time()
        catalog.group_heartbeat(group, url, who.token_id, now, now - ttl, MAX_MEMBERS)
        return members(group, now)

    @router.get("/groups/{name}/members", response_model=Members)
    def list_members(name: str, _who: SpokeCaller) -> Members:
        """The live members of group ``name`` (none: an empty list)."""
        return members(check_group_name(name), time.time())

    @router.delete("/groups/{name}/members", status_code=204)
    def leave(name: str, _who: SpokeCaller, url: Annotated[str, Query(max_length=MAX_URL)]) -> Response:
        """Leave group ``name`` now (a spoke that stops cleanly); leaving twice is no error."""
        catalog.leave_group(check_group_name(name), member_url(url))
        return Response(status_code=204)

    return router
