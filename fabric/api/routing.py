"""What every ``/api/v1`` route module shares: the router's prefix and error responses,
the authenticated caller, the durability header, and reading a bounded request body
(held against the process's body budget, :mod:`fabric.api.budget`).

Route modules do not use ``from __future__ import annotations``: FastAPI reads their
parameter annotations, and ``Caller`` (see :func:`caller`) is a local of the function
that adds the routes.
"""

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

import anyio
from fastapi import Depends, Header, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from fabric.api.budget import body_budget
from fabric.auth.principal import Principal
from fabric.errors import BadRequest, PayloadTooLarge
from fabric.format.model import Entry
from fabric.plane.dataplane import DataPlane
from fabric.plane.wire import unpack_changes

API_PREFIX = "/api/v1"
#: The largest msgpack body of explicit changes (commit-changes, entries).
MAX_CHANGES_BYTES = 512 * 1024 * 1024
#: The largest JSON body a route with a JSON model takes (10,000 paths of a bulk delete fit).
MAX_JSON_BYTES = 4 * 1024 * 1024

PlaneGetter = Callable[[], DataPlane]
Authenticator = Callable[[Request], Principal]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 416, 503)
}

#: ``X-Fabric-Durability`` on a write: how stored it must be before the reply (DESIGN §3).
Durability = Annotated[
    Literal["hub", "local", "replicated"] | None,
    Header(
        description="hub: stored at the hub before the reply; local: a spoke may keep it on its own disk and push it "
        "later; replicated: as local, and a copy on the disk of one other spoke of its group (a hub meets every level)"
    ),
]


def caller(authenticate: Authenticator) -> Any:
    """The annotation of a route parameter that is the authenticated caller (``who: Caller``)."""
    return Annotated[Principal, Depends(authenticate)]


class BoundedJsonRoute(APIRoute):
    """A route whose JSON body (a pydantic model parameter) is read within
    :data:`MAX_JSON_BYTES` and the body budget before FastAPI parses it: an oversized
    body is a 413, never a parsed list in memory. Routes that read their own body
    (packs, msgpack changes, file uploads) are left as they are."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def bounded(request: Request) -> Response:
            async with buffered_body(request, MAX_JSON_BYTES) as data:
                request._body = data  # what Request.body() returns to FastAPI's parser
                return await handler(request)

        return bounded


@asynccontextmanager
async def buffered_body(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The whole request body, held against the process's :class:`BodyBudget` until the
    block ends (so the budget covers the work done on it, not only the reading).

    PayloadTooLarge (413) when the body is (or says it is) over ``limit`` or over the
    whole budget; Unavailable (503, Retry-After) when the budget is spent by other requests.
    """
    budget = body_budget()
    limit = min(limit, budget.total)
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit")
    held = 0
    try:
        if declared is not None:
            await budget.take(declared)
            held = declared
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
            if size > held:  # no declared size (or a short one): take the bytes as they come
                budget.take_now(size - held)
                held = size
            parts.append(part)
        data = b"".join(parts)
        del parts
        yield data
    finally:
        budget.give(held)


@asynccontextmanager
async def changes_body(request: Request) -> AsyncIterator[tuple[dict[str, Entry | None], dict[str, Any]]]:
    """A msgpack body of changes (``{changes: {path: entry|null}, ...}``, see
    :func:`~fabric.plane.wire.unpack_changes`) decoded in a worker thread, not on the event
    loop; the body stays held against the budget until the block ends."""
    async with buffered_body(request, MAX_CHANGES_BYTES) as data:
        yield await anyio.to_thread.run_sync(unpack_changes, data)


async def read_json(request: Request, limit: int) -> Any:
    """A JSON request body of at most ``limit`` bytes, refused (413) before it is parsed
    when larger; BadRequest when it is not JSON."""
    async with buffered_body(request, limit) as data:
        try:
            return json.loads(data)
        except ValueError:
            raise BadRequest(
                "the request body could not be parsed: send JSON encoded as UTF-8 (Content-Type: application/json)"
            ) from None


M = TypeVar("M", bound=BaseModel)


async def read_model(request: Request, model: type[M], limit: int) -> M:
    """A JSON body of at most ``limit`` bytes as ``model``: for routes whose body FastAPI
    would otherwise read and parse whole, however large, before any check."""
    doc = await read_json(request, limit)
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in ('body', *e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()[:5]
        )
        raise BadRequest(f"invalid request: {problems}") from None


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    if not declared.strip().isdigit():
        raise BadRequest(f"Content-Length must be a number of bytes, not {declared!r}")
    return int(declared)
