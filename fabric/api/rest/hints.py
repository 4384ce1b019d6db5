"""REST route of loader hints: the order in which a job will read files (``DataPlane.hint``)."""

from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Request
from pydantic import BaseModel

from fabric.api.routing import Authenticator, PlaneGetter, caller, read_model
from fabric.errors import BadRequest
from fabric.plane.jobs import MAX_HINT_BYTES, MAX_HINT_PATHS, check_hint_size, check_job


class HintRequest(BaseModel):
    ref: str
    paths: list[str]
    job: str | None = None
    append: bool = False
    top_up: bool = False


class HintResult(BaseModel):
    job: str
    paths: int
    bytes: int
    window_bytes: int


#: The request body, for the OpenAPI document. The route reads it itself (within its limit), after
#: the permission check: a caller who may not read the repository gets 403 whatever it sent.
HINT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "ref": {"type": "string"},
                        "paths": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_HINT_PATHS},
                        "job": {"type": "string"},
                        "append": {"type": "boolean", "default": False},
                        "top_up": {"type": "boolean", "default": False},
                    },
                    "required": ["ref", "paths"],
                }
            }
        },
    }
}


def add_hint_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the hint route to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

    @router.post("/repos/{repo}/hints", response_model=HintResult, tags=["objects"], openapi_extra=HINT_BODY)
    async def hint(
        repo: str, request: Request, who: Caller, x_fabric_job: Annotated[str | None, Header()] = None
    ) -> dict:
        """The files a job will read, in order (``append``: after those hinted before; else a new
        order). A spoke fetches ahead of the job's reads; a hub only checks the hint. The job is
        ``job`` in the body, else the ``X-Fabric-Job`` header. ``top_up``: files a reader may open
        next; a spoke fetches only what it lacks of those it holds in part (no order is kept)."""
        who.require(repo, "read")
        body = await read_model(request, HintRequest, MAX_HINT_BYTES)
        job = body.job if body.job is not None else x_fabric_job
        if job is None:
            raise BadRequest("a hint needs a job id: give 'job' in the body or the X-Fabric-Job header")
        check_job(job)
        check_hint_size(len(body.paths))
        return await anyio.to_thread.run_sync(lambda: plane().hint(repo, body.ref, body.paths, job, body.append, body.top_up))
