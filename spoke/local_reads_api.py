"""The route by which a client beside its spoke reports the chunks it read from the spoke's
cache files itself (``fabric mount --spoke-cache``, ``fabric://`` with ``spoke_cache=``;
fabric/client/spoke_files.py).

Each id counts as a read of the spoke's chunk cache (:meth:`spoke.fetch.Fetcher.read_beside`):
its recency, its plans and its hit count see the read as if the spoke had served it, so chunks
a client reads beside the spoke are not evicted as unread, and the job the request names
(``X-Fabric-Job``) has them counted as its reads, hits all, and its lookahead moves on. The
caller needs read access to the repository; the answer is 204 whatever the cache holds (it
tells nothing about it).
"""

from collections.abc import Callable

import anyio
from fastapi import APIRouter, Request, Response

from fabric.api.exchange import read_chunk_ids
from fabric.api.routing import caller
from fabric.auth.principal import Principal
from fabric.plane.wire import hex_ids

#: Ids in one report, at most (a mount sends more in several).
MAX_IDS = 4096


def local_reads_router(touch: Callable[[list[bytes]], None], authenticate: Callable[..., Principal]) -> APIRouter:
    """``touch(ids)``: count reads of these chunk ids (the spoke's plane)."""
    router = APIRouter(prefix="/api/v1", tags=["objects"])
    Caller = caller(authenticate)

    @router.post("/repos/{repo}/cache/local-reads", status_code=204, response_class=Response)
    async def local_reads(repo: str, request: Request, who: Caller) -> Response:
        """Chunks of ``repo`` a mount beside this spoke read from its cache files (hex ids)."""
        who.require(repo, "read")
        ids = hex_ids((await read_chunk_ids(request)).ids, MAX_IDS)
        await anyio.to_thread.run_sync(touch, ids)
        return Response(status_code=204)

    return router
