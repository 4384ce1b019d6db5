"""Routes by which a ``--writeback`` mount at ``replicated`` durability keeps a copy of each
file it parks on a peer spoke (:mod:`spoke.mirrors`; the sender is ``fuse/mirror.py``).

The mount first asks its own spoke which peer to use (``GET /api/v1/mirror/peer``), then
sends that peer each file whose fsync it is answering (``PUT .../files/{id}``, the record in
the ``X-Fabric-Record`` header, the bytes as the body; a file that only grew since its last
copy with ``?offset=N``, the bytes from N on, appended there), renews its lease every few
seconds, and drops each copy once the file is staged. A copy needs write access to the repository
it names; every other call on a mount's copies needs the token that sent them.
"""


import json
import os
from collections.abc import Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel

from fabric.api.routing import BoundedJsonRoute, read_json
from fabric.auth.principal import Principal
from fabric.errors import BadRequest, Unavailable
from fabric.util.fileio import pwrite_all

from .mirrors import MirrorStore, check_record
from .replication import Replication

PREFIX = "/api/v1/mirror"
#: Bytes of a record (its header or body): a path and a few attributes.
MAX_RECORD = 64 * 1024
#: Bytes received before they are written to disk (per upload).
WRITE_BLOCK = 4 * 1024 * 1024
#: Uploads taken at once (more get 503: the mount stages the file itself instead).
MAX_UPLOADS = 16


class Peer(BaseModel):
    peer: str


def mirror_router(store: MirrorStore, replication: Replication | None, authenticate: Callable[..., Principal]) -> APIRouter:
    router = APIRouter(prefix=PREFIX, tags=["mirror"], route_class=BoundedJsonRoute)
    Caller = Annotated[Principal, Depends(authenticate)]
    uploads = [0]

    @router.get("/peer", response_model=Peer)
    async def peer(who: Caller) -> Peer:
        """The spoke of this one's group that should keep a mount's parked files."""
        if replication is None:
            raise BadRequest("this spoke is in no group (--group or --peers): no peer can keep copies of a mount's files")
        peers = replication.peers()
        if not peers:
            raise Unavailable("no other member of this spoke's group is up to keep copies of a mount's files")
        return Peer(peer=peers[0])

    @router.put("/{mount}/files/{rid}", status_code=204)
    async def keep(
        mount: str, rid: str, request: Request, who: Caller,
        offset: Annotated[int, Query(ge=0, le=2**62, description="append the body at this byte of the kept copy, its length")] = 0,
    ) -> Response:
        """Keep a parked file (on disk, synced, before the answer); with ``offset``, the bytes it
        grew by since its last copy (409 when the copy kept here is not ``offset`` bytes long)."""
        raw = request.headers.get("x-fabric-record", "")
        if len(raw) > MAX_RECORD:
            raise BadRequest(f"the X-Fabric-Record header is over {MAX_RECORD} bytes")
        try:
            record = check_record(json.loads(raw or "null"))
        except ValueError as exc:
            raise BadRequest(f"the X-Fabric-Record header is not JSON: {exc}") from None
        who.require(record["repo"], "write")
        try:
            size = int(request.headers.get("content-length", "-1"))
        except ValueError:
            raise BadRequest("Content-Length is a number of bytes") from None
        if uploads[0] >= MAX_UPLOADS:
            raise Unavailable(f"this spoke is taking {MAX_UPLOADS} copies already; stage the file instead", retry_after=1)
        upload = await anyio.to_thread.run_sync(store.begin, mount, who.name, rid, record, size, offset)
        uploads[0] += 1
        try:
            written = await _receive(request, upload.path, size, offset)
        except BaseException:
            uploads[0] -= 1
            await anyio.to_thread.run_sync(upload.abort)
            raise
        uploads[0] -= 1
        await anyio.to_thread.run_sync(upload.finish, written)
        return Response(status_code=204)

    @router.put("/{mount}/files/{rid}/record", status_code=204)
    async def rename(mount: str, rid: str, request: Request, who: Caller) -> Response:
        """A kept file was renamed, or its attributes changed: its new record."""
        record = check_record(await read_json(request, MAX_RECORD))
        who.require(record["repo"], "write")
        await anyio.to_thread.run_sync(store.rename, mount, who.name, rid, record)
        return Response(status_code=204)

    @router.delete("/{mount}/files/{rid}", status_code=204)
    async def drop(mount: str, rid: str, who: Caller) -> Response:
        """The mount staged this file (or replaced it): forget its copy."""
        await anyio.to_thread.run_sync(store.drop, mount, who.name, rid)
        return Response(status_code=204)

    @router.post("/{mount}/lease", status_code=204)
    async def renew(mount: str, who: Caller) -> Response:
        """The mount is alive: keep its files unstaged."""
        await anyio.to_thread.run_sync(store.renew, mount, who.name)
        return Response(status_code=204)

    @router.delete("/{mount}/lease", status_code=204)
    async def end(mount: str, who: Caller) -> Response:
        """The mount ended with nothing parked: forget it."""
        await anyio.to_thread.run_sync(store.end, mount, who.name)
        return Response(status_code=204)

    return router


async def _receive(request: Request, path: str, size: int, offset: int = 0) -> int:
    """Write the body to ``path`` (synced) from ``offset`` on (a new file for 0), at most
    ``size`` bytes; how many came."""
    flags = os.O_WRONLY | os.O_CLOEXEC | (0 if offset else os.O_CREAT | os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    try:
        parts: list[bytes] = []
        held = written = 0  # (bytes pending, received)
        async for part in request.stream():
            written += len(part)
            if written > size:
                raise BadRequest(f"the body is longer than its Content-Length ({size} bytes)")
            parts.append(part)
            held += len(part)
            if held >= WRITE_BLOCK:
                full, parts, held = parts, [], 0
                offset = await anyio.to_thread.run_sync(pwrite_all, fd, full, offset)
        if parts:
            await anyio.to_thread.run_sync(pwrite_all, fd, parts, offset)
        await anyio.to_thread.run_sync(os.fdatasync, fd)
        return written
    finally:
        os.close(fd)
