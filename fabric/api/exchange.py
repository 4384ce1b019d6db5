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
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from fabric.api.routing import Authenticator, Durability, PlaneGetter, caller, read_body, require_any
from fabric.errors import BadRequest, Corruption, Forbidden
from fabric.plane.wire import MSGPACK, hex_ids

MAX_PACK_BYTES = 256 * 1024 * 1024
FRAMES_PIECE = 1024 * 1024


class ChunkIds(BaseModel):
    ids: list[str]


class ObjectIds(BaseModel):
    ids: list[str] = Field(max_length=1024)


class MissingChunks(BaseModel):
    missing: list[str]


class PackResult(BaseModel):
    chunks: int
    new: int


def add_exchange_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the chunk exchange routes to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

    @router.post("/chunks/missing", response_model=MissingChunks, tags=["chunks"])
    def missing(body: ChunkIds, who: Caller, x_fabric_durability: Durability = None) -> MissingChunks:
        """Which of these chunk ids (hex) the server lacks (at the durability asked)."""
        require_any(who, "write")
        return MissingChunks(missing=[c.hex() for c in plane().missing_chunks(hex_ids(body.ids), x_fabric_durability)])

    @router.post(
        "/chunks/packs",
        response_model=PackResult,
        tags=["chunks"],
        openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}, "required": True}},
    )
    async def upload_pack(request: Request, who: Caller, x_fabric_durability: Durability = None) -> PackResult:
        """Store a pack of frames; every frame is verified before anything is indexed."""
        require_any(who, "write")
        data = await read_body(request, MAX_PACK_BYTES)
        try:
            chunks, new = await anyio.to_thread.run_sync(lambda: plane().receive_pack(data, x_fabric_durability))
        except Corruption as exc:
            # The client sent bad bytes: its error (400), not the server's (500).
            raise BadRequest(f"pack refused, nothing from it was stored: {exc.message}") from exc
        return PackResult(chunks=chunks, new=new)

    @router.post(
        "/chunks/frames",
        tags=["chunks"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def frames(body: ChunkIds, who: Caller) -> StreamingResponse:
        """Stream ``id(32) length(u32 LE) frame`` records for the given chunk ids.

        A chunk id is the BLAKE3 hash of its bytes: it is learnt only from metadata the
        caller may read (``/entry``) or from the bytes themselves, so it serves as the
        capability to fetch them; any read role is enough."""
        require_any(who, "read")
        ids = hex_ids(body.ids)
        stream = iter(plane().frames(ids))
        # Planes may locate chunks lazily: pull the first record now, so an unknown id
        # is a 404 before the 200 is sent, not a connection dropped mid-stream.
        first = next(stream, None)

        def records() -> Iterator[bytes]:
            if first is None:
                return
            # Records go out in pieces of about 1 MiB: one thread hop and one write per
            # piece, not per 64 KiB chunk (that alone bounded a stream to ~100 MB/s).
            pending: list[bytes] = []
            size = 0
            for cid, frame in itertools.chain([first], stream):
                pending += (cid, struct.pack("<I", len(frame)), frame)
                size += 36 + len(frame)
                if size >= FRAMES_PIECE:
                    yield b"".join(pending)
                    pending, size = [], 0
            if pending:
                yield b"".join(pending)

        return StreamingResponse(records(), media_type="application/octet-stream")

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
