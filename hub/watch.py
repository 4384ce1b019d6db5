"""The ref watch stream: JSON lines of ref changes with sequence numbers.

``GET /api/v1/watch?since=SEQ[&repo=R]`` streams one JSON object per line,
``{"seq", "repo", "kind", "name", "old", "new", "time"}``, for every ref
change after ``SEQ``, then keeps the connection open and streams new ones as
they happen. A ``{"type": "heartbeat", "seq": N}`` line every few seconds
tells a subscriber the stream is alive. Resume after a disconnect by passing
the last ``seq`` seen. Events come from the catalog, so every hub replica on
one PostgreSQL serves the same stream.

The caller's token is checked again every few seconds while the stream is open:
a revoked token (or one that lost its role on ``repo``) gets one
``{"type": "error", "code", "message"}`` line and the stream ends; a token whose
roles changed sees events of the repositories it may read now.

The catalog keeps a bounded history of events (see :mod:`fabric.catalog.catalog`).
A subscriber that resumes from a ``seq`` older than what is kept, or falls that
far behind, gets one ``{"type": "resync", "seq": N}`` line and the stream ends:
it has missed events, so it must reload every ref it follows, then watch again
from ``N``.
"""


import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from fabric.auth.principal import Principal
from fabric.catalog import Catalog
from fabric.errors import Forbidden, Unauthorized

from .spokes import SpokeRegistry

POLL_SECONDS = 0.1
#: Events read from the catalog at a time; ``once`` reads page after page until it is caught up.
PAGE = 1000
HEARTBEAT_SECONDS = 5.0
#: How often an open stream checks its caller's token again.
REAUTH_SECONDS = 2.0


#: A watcher may name itself (a spoke: its URL or host name) for the console's spokes page.
SPOKE_HEADER = "X-Fabric-Spoke"


def watch_router(catalog: Catalog, authenticate: Callable[..., Principal], registry: SpokeRegistry | None = None) -> APIRouter:
    """``registry``: where each stream's progress is recorded (the console's spokes page)."""
    router = APIRouter(prefix="/api/v1", tags=["watch"])
    Caller = Annotated[Principal, Depends(authenticate)]

    @router.get("/watch", response_class=StreamingResponse, responses={200: {"content": {"application/x-ndjson": {}}}})
    def watch(
        request: Request,
        who: Caller,
        since: Annotated[int | None, Query(ge=0, le=2**63 - 1, description="last seq seen; omit to start from now")] = None,
        repo: str | None = None,
        once: bool = False,
    ) -> StreamingResponse:
        """Stream ref changes after ``since`` (``once``: return what is there and close).

        Without ``since`` the stream starts at the current position, announced
        by a first heartbeat line carrying its ``seq``."""
        if repo is not None:
            who.require(repo, "read")

        async def current_caller() -> Principal:
            caller = await anyio.to_thread.run_sync(authenticate, request)
            if repo is not None:
                caller.require(repo, "read")
            return caller

        async def lines() -> AsyncIterator[bytes]:
            caller = who
            checked = time.monotonic()
            seq = since
            if seq is None:
                seq = await anyio.to_thread.run_sync(catalog.last_event_seq)
                yield _line({"type": "heartbeat", "seq": seq})
            last_sent = time.monotonic()
            record = None
            if registry is not None and not once:
                client = request.client
                record = registry.opened(
                    who.token_id, who.name, f"{client.host}:{client.port}" if client else "?",
                    (request.headers.get(SPOKE_HEADER) or "")[:200] or None, seq,
                )  # fmt: skip
            try:
                async for line in _stream(seq, caller, checked, last_sent, record):
                    yield line
            finally:
                if record is not None:
                    registry.closed(record)

        async def _stream(seq: int, caller: Principal, checked: float, last_sent: float, record) -> AsyncIterator[bytes]:  # noqa: ANN001
            while True:
                if time.monotonic() - checked > REAUTH_SECONDS:
                    try:
                        caller = await current_caller()
                    except (Unauthorized, Forbidden) as exc:
                        yield _line({"type": "error", "code": exc.code, "message": exc.message})
                        return
                    checked = time.monotonic()
                events = await anyio.to_thread.run_sync(functools.partial(catalog.events_after, seq, repo, PAGE))
                if events and events[0][0] > seq + 1 and await _missed(catalog, seq):
                    # A gap: events after ``seq`` may have been pruned (sequences have gaps of their own).
                    yield _line({"type": "resync", "seq": await anyio.to_thread.run_sync(catalog.last_event_seq)})
                    return
                for s, r, kind, name, old, new, when in events:
                    seq = s
                    if caller.can(r, "read"):
                        yield _line({"seq": s, "repo": r, "kind": kind, "name": name, "old": old, "new": new, "time": when})
                        last_sent = time.monotonic()
                        if record is not None:
                            record.sent(s)
                if record is not None and events:
                    record.seq = max(record.seq, seq)
                if once and len(events) < PAGE:  # (a full page: more may follow, visible to this caller or not)
                    return
                if time.monotonic() - last_sent > HEARTBEAT_SECONDS:
                    yield _line({"type": "heartbeat", "seq": seq})
                    last_sent = time.monotonic()
                    if record is not None:
                        record.sent(seq)
                if not events:
                    await anyio.sleep(POLL_SECONDS)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return router


async def _missed(catalog: Catalog, seq: int) -> bool:
    """Were events after ``seq`` pruned before this subscriber saw them?"""
    return seq < await anyio.to_thread.run_sync(catalog.events_pruned_through)


def _line(obj: dict) -> bytes:
    return (json.dumps(obj) + "\n").encode()
