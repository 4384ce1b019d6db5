"""What every ``/api/v1`` route module shares: the router's prefix and error responses,
the authenticated caller, the durability header, and reading a bounded request body.

Route modules do not use ``from __future__ import annotations``: FastAPI reads their
parameter annotations, and ``Caller`` (see :func:`caller`) is a local of the function
that adds the routes.
"""

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, Header, Request
from pydantic import BaseModel

from fabric.auth.principal import ROLES, Principal
from fabric.errors import BadRequest, Forbidden
from fabric.plane.dataplane import DataPlane

API_PREFIX = "/api/v1"
#: The largest msgpack body of explicit changes (commit-changes, entries).
MAX_CHANGES_BYTES = 512 * 1024 * 1024

PlaneGetter = Callable[[], DataPlane]
Authenticator = Callable[[Request], Principal]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 416, 503)
}

#: ``X-Fabric-Durability`` on a write: how stored it must be before the reply (DESIGN §3).
Durability = Annotated[
    Literal["hub", "local"] | None,
    Header(description="hub: stored at the hub before the reply; local: a spoke may keep it on its own disk and push it later"),
]


def caller(authenticate: Authenticator) -> Any:
    """The annotation of a route parameter that is the authenticated caller (``who: Caller``)."""
    return Annotated[Principal, Depends(authenticate)]


def require_any(who: Principal, role: str) -> None:
    """Chunk exchange is not per repository: any repository role of this level will do."""
    if who.admin or any(ROLES[r] >= ROLES[role] for r in who.roles.values()):
        return
    raise Forbidden(f"token {who.name!r} has no {role} role on any repository")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body; BadRequest when it is (or says it is) over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body of {declared} bytes is over the {limit}-byte limit")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BadRequest(f"request body is over the {limit}-byte limit")
        parts.append(part)
    return b"".join(parts)
