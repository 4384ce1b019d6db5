"""Routes by which a spoke of the group keeps copies of another's ``replicated`` writes
(:mod:`spoke.replicas`; the sender is :mod:`spoke.replication`).

Only a spoke may call them: the caller's token needs the ``spoke`` right and write on
the repository. ``origin`` is the URL of the sending spoke as its group knows it.
"""

from collections.abc import Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response

from fabric.api.exchange import MAX_PACK_BYTES, MissingChunks, PackResult, read_chunk_ids
from fabric.api.routing import BoundedJsonRoute, buffered_body, changes_body
from fabric.auth.principal import SPOKE, Principal
from fabric.errors import BadRequest, Corruption, Forbidden
from fabric.util.groups import member_url

from .plane import SpokePlane

Origin = Annotated[str, Query(description="the URL of the spoke whose write this is, as its group knows it")]


def replica_router(plane: SpokePlane, authenticate: Callable[..., Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1/replica", tags=["replica"], route_class=BoundedJsonRoute)
    Caller = Annotated[Principal, Depends(authenticate)]

    def allowed(who: Principal, repo: str, origin: str) -> str:
        if not who.has(SPOKE):
            raise Forbidden(f"token {who.name!r} may not hand copies of writes to a spoke: that needs the spoke right")
        who.require(repo, "write")
        return member_url(origin)

    @router.post("/packs", response_model=PackResult)
    async def keep_pack(request: Request, who: Caller, repo: str, origin: Origin) -> PackResult:
        """Keep a pack of another spoke's replicated write, pinned (verified whole first)."""
        allowed(who, repo, origin)
        async with buffered_body(request, MAX_PACK_BYTES) as data:
            try:
                chunks, new = await anyio.to_thread.run_sync(plane.keep_replica_pack, repo, data)
            except Corruption as exc:
                raise BadRequest(f"pack refused, nothing from it was kept: {exc.message}") from exc
        return PackResult(chunks=chunks, new=new)

    @router.post("/missing", response_model=MissingChunks)
    async def missing(request: Request, who: Caller, repo: str, origin: Origin) -> MissingChunks:
        """Which of these chunks of ``repo`` this spoke lacks."""
        allowed(who, repo, origin)
        body = await read_chunk_ids(request)
        try:
            ids = [bytes.fromhex(c) for c in body.ids]
        except ValueError as exc:
            raise BadRequest(f"chunk ids are hex strings: {exc}") from exc
        lacking = await anyio.to_thread.run_sync(lambda: plane.missing_chunks(ids, "local", repo=repo))
        return MissingChunks(missing=[c.hex() for c in lacking])

    @router.post("/entries", status_code=204)
    async def keep_entries(request: Request, who: Caller, repo: str, branch: str, origin: Origin) -> Response:
        """Keep copies of another spoke's writes (msgpack ``{changes: {path: entry|null}}``),
        every chunk they need already here."""
        origin = allowed(who, repo, origin)
        async with changes_body(request) as (changes, _):
            await anyio.to_thread.run_sync(lambda: plane.keep_replica_entries(origin, repo, branch, changes))
        return Response(status_code=204)

    @router.post("/landed", status_code=204)
    async def landed(request: Request, who: Caller, repo: str, branch: str, origin: Origin) -> Response:
        """These writes of ``origin`` are at the hub: drop their copies."""
        origin = allowed(who, repo, origin)
        async with changes_body(request) as (changes, _):
            await anyio.to_thread.run_sync(lambda: plane.replica_landed(origin, repo, branch, changes))
        return Response(status_code=204)

    return router
