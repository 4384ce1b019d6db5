"""Routes of a spoke's write-back queue for operators (admin only): parked writes,
listed, queued again, or dropped (see :mod:`spoke.writeback`)."""


import time
from collections.abc import Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends
from pydantic import BaseModel

from fabric.api.routing import BoundedJsonRoute
from fabric.auth.principal import Principal

from .writeback import WriteBack


class ParkedWrite(BaseModel):
    id: int
    repo: str
    branch: str
    path: str
    delete: bool
    error: str
    created: float
    parked_at: float
    age: float
    held: int


class Moved(BaseModel):
    count: int


def writeback_router(writeback: WriteBack, authenticate: Callable[..., Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1/writeback", tags=["writeback"], route_class=BoundedJsonRoute)
    Caller = Annotated[Principal, Depends(authenticate)]

    @router.get("/parked", response_model=list[ParkedWrite])
    async def list_parked(who: Caller) -> list[dict]:
        """Writes the hub refused for good, oldest first (``age`` in seconds since accepted;
        ``held``: later writes of the branch waiting behind them)."""
        who.require_admin()
        now = time.time()
        return [{**p, "age": max(0.0, now - p["created"])} for p in await anyio.to_thread.run_sync(writeback.parked)]

    @router.post("/parked/retry", response_model=Moved)
    async def retry_all(who: Caller) -> dict:
        """Queue every parked write again."""
        who.require_admin()
        return {"count": await anyio.to_thread.run_sync(writeback.retry)}

    @router.post("/parked/{op_id}/retry", response_model=Moved)
    async def retry_one(op_id: int, who: Caller) -> dict:
        """Queue parked write ``op_id`` again (404 when it is not parked)."""
        who.require_admin()
        return {"count": await anyio.to_thread.run_sync(writeback.retry, op_id)}

    @router.delete("/parked", response_model=Moved)
    async def drop_all(who: Caller) -> dict:
        """Drop every parked write and unpin its chunks."""
        who.require_admin()
        return {"count": await anyio.to_thread.run_sync(writeback.drop)}

    @router.delete("/parked/{op_id}", response_model=Moved)
    async def drop_one(op_id: int, who: Caller) -> dict:
        """Drop parked write ``op_id`` and unpin its chunks (404 when it is not parked)."""
        who.require_admin()
        return {"count": await anyio.to_thread.run_sync(writeback.drop, op_id)}

    return router
