"""The chunk exchange of REST API v1: what spokes, caches and chunk-level clients
move besides files: which chunks a server lacks, packs of frames up, frames down,
metadata objects by id, and a branch's staging area.
"""

import itertools
import struct
from collections.abc import Iterator
from typing import Annotated

import anyio
import msgpack
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from fabric.api.peers import peer_scope
from fabric.api.routing import Authenticator, Durability, PlaneGetter, buffered_body, caller, read_model
from fabric.auth.principal import Principal
from fabric.errors import BadRequest, Corruption, Forbidden, PayloadTooLarge
from fabric.plane.wire import MSGPACK, hex_ids
from fabric.util.pieces import in_pieces

MAX_PACK_BYTES = 256 * 1024 * 1024
#: Chunk ids in one ``/chunks/missing`` or ``/chunks/frames`` request (clients send batches).
MAX_IDS = 10_000
#: The largest JSON body of chunk ids: refused (413) before it is parsed. 10,000 ids of 64
#: hex characters are about 690 KB.
MAX_IDS_BYTES = 1024 * 1024


class ChunkIds(BaseModel):
    ids: list[str]


async def read_chunk_ids(request: Request) -> ChunkIds:
    """The ``{"ids": [...]}`` body of a chunk route: 413 when over :data:`MAX_IDS_BYTES`
    (before parsing) or over :data:`MAX_IDS` ids."""
    body = await read_model(request, ChunkIds, MAX_IDS_BYTES)
    if len(body.ids) > MAX_IDS:
        raise PayloadTooLarge(f"too many chunk ids in one request ({len(body.ids)} > {MAX_IDS}); split the batch")
    return body


#: The request body of the chunk id routes, for the OpenAPI document (the routes read it themselves).
CHUNK_IDS_BODY = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {"ids": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_IDS}},
                    "required": ["ids"],
                }
            }
        },
        "required": True,
    }
}


class ShareChunks(BaseModel):
    source_repo: str
    ids: list[str] = Field(max_length=MAX_IDS)


class ObjectIds(BaseModel):
    ids: list[str] = Field(max_length=1024)


class MissingChunks(BaseModel):
    missing: list[str]


class PackResult(BaseModel):
    chunks: int
    new: int


#: ``?repo=``: the repository a chunk exchange call is for (see :mod:`fabric.plane.exchange`).
RepoScope = Annotated[
    str | None,
    Query(description="the repository the chunks are for; required unless the token may access every repository"),
]


def chunk_scope(who: Principal, repo: str | None, role: str) -> str | None:
    """The repository a chunk exchange call answers about: ``repo`` (the caller needs
    ``role`` on it), or ``None`` (the whole store) for a caller with ``role`` on every
    repository. A token for some repositories never learns about the others' chunks."""
    if repo is not None:
        who.require(repo, role)
        return repo
    if who.can("*", role):
        return None
    raise Forbidden(
        f"token {who.name!r} may exchange chunks only for a repository it may access: add ?repo=NAME"
    )


def add_exchange_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the chunk exchange routes to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

    async def chunk_ids(request: Request, _who: Caller) -> ChunkIds:
        # Depends on the caller, so a request is authenticated before its body is read.
        return await read_chunk_ids(request)

    ChunkIdsBody = Annotated[ChunkIds, Depends(chunk_ids)]

    @router.post("/chunks/missing", response_model=MissingChunks, tags=["chunks"], openapi_extra=CHUNK_IDS_BODY)
    def missing(
        body: ChunkIdsBody, who: Caller, repo: RepoScope = None, x_fabric_durability: Durability = None
    ) -> MissingChunks:
        """Which of these chunk ids (hex) the server lacks (at the durability asked); with
        ``repo``, which it lacks as chunks of that repository."""
        scope = chunk_scope(who, repo, "write")
        lacking = plane().missing_chunks(hex_ids(body.ids), x_fabric_durability, repo=scope)
        return MissingChunks(missing=[c.hex() for c in lacking])

    @router.post(
        "/chunks/packs",
        response_model=PackResult,
        tags=["chunks"],
        openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}, "required": True}},
    )
    async def upload_pack(
        request: Request, who: Caller, repo: RepoScope = None, x_fabric_durability: Durability = None
    ) -> PackResult:
        """Store a pack of frames; every frame is verified before anything is indexed. With
        ``repo`` its chunks become chunks of that repository."""
        scope = chunk_scope(who, repo, "write")
        async with buffered_body(request, MAX_PACK_BYTES) as data:
            try:
                chunks, new = await anyio.to_thread.run_sync(lambda: plane().receive_pack(data, x_fabric_durability, repo=scope))
            except Corruption as exc:
                # The client sent bad bytes: its error (400), not the server's (500).
                raise BadRequest(f"pack refused, nothing from it was stored: {exc.message}") from exc
        return PackResult(chunks=chunks, new=new)

    @router.post(
        "/chunks/frames",
        tags=["chunks"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
        openapi_extra=CHUNK_IDS_BODY,
    )
    def frames(
        body: ChunkIdsBody,
        who: Caller,
        repo: RepoScope = None,
        x_fabric_peer: Annotated[str | None, Header(description="1: asked by a spoke of the same group (needs the spoke right)")] = None,
    ) -> StreamingResponse:
        """Stream ``id(32) length(u32 LE) frame`` records for the given chunk ids.

        A token for some repositories names one (``repo``) and gets only chunks of it: an
        id it learnt elsewhere is no capability (404, as for an id stored nowhere).
        ``X-Fabric-Peer: 1``: a spoke of a group asks its owner (:mod:`fabric.api.peers`)."""
        # A token that may read every repository needs no check (a spoke's, an admin's).
        scope = None if who.can("*", "read") else chunk_scope(who, repo, "read")
        ids = hex_ids(body.ids)
        with peer_scope(who, x_fabric_peer):
            stream = iter(plane().frames(ids, repo=scope))
            # Planes may locate chunks lazily: pull the first record now, so an unknown id
            # is a 404 before the 200 is sent, not a connection dropped mid-stream.
            first = next(stream, None)

        def records() -> Iterator[bytes]:
            if first is None:
                return
            for cid, frame in itertools.chain([first], stream):
                yield cid
                yield struct.pack("<I", len(frame))
                yield frame

        return StreamingResponse(in_pieces(records()), media_type="application/octet-stream")

    @router.post("/repos/{repo}/chunks/share", status_code=204, tags=["chunks"])
    def share(repo: str, body: ShareChunks, who: Caller) -> Response:
        """Make chunks of ``source_repo`` chunks of ``repo`` too, for copying a file between
        repositories without sending its bytes: read access to the source and write
        access to the target are needed; 404 (nothing shared) unless every id is a chunk
        of the source."""
        who.require(body.source_repo, "read")
        who.require(repo, "write")
        plane().share_chunks(body.source_repo, repo, hex_ids(body.ids))
        return Response(status_code=204)

    # -- metadata objects (for caches) ------------------------------------------------
    @router.post(
        "/objects/batch",
        tags=["chunks"],
        response_class=Response,
        responses={200: {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}}},
    )
    def objects_batch(body: ObjectIds, who: Caller) -> Response:
        """Stored bytes of metadata objects (msgpack map id -> bytes); unknown ids are left out.

        Objects are addressed by id across repositories, so this needs read access to
        every repository (a global admin, or a role on '*'): it is for spokes."""
        if not who.can("*", "read"):
            raise Forbidden(
                f"token {who.name!r} may not fetch metadata objects by id: that needs read access to all "
                "repositories (--repo '*'), as a spoke's token has"
            )
        return Response(msgpack.packb(plane().get_objects(body.ids), use_bin_type=True), media_type=MSGPACK)

    @router.get(
        "/repos/{repo}/branches/{branch}/staging",
        tags=["branches"],
        response_class=Response,
        responses={200: {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}}},
    )
    def staging(repo: str, branch: str, who: Caller, since: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0) -> Response:
        """A branch's head and staging area (msgpack ``{head, seq, entries}``), for spokes;
        ``since``: only rows written after that staging seq."""
        who.require(repo, "read")
        head, seq, entries = plane().staging_snapshot(repo, branch, since)
        body = {"head": head, "seq": seq, "entries": [[p, e] for p, e in entries]}
        return Response(msgpack.packb(body, use_bin_type=True), media_type=MSGPACK)
