"""The job a request reads for: ``X-Fabric-Job``, checked and kept in a context variable.

:class:`JobMiddleware` (served by hub and spoke) refuses a request whose header is not a
valid job id (400, before any route runs) and otherwise makes the id visible to the code
serving the request through :func:`request_job`: FastAPI runs sync routes and streamed
bodies in worker threads that copy the request's context, so plane methods see it too.
"""

from __future__ import annotations

import contextvars

from starlette.types import ASGIApp, Receive, Scope, Send

from fabric.api.errors import error_response
from fabric.errors import BadRequest
from fabric.plane.jobs import JOB_HEADER, check_job

_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("fabric_request_job", default=None)
_HEADER = JOB_HEADER.lower().encode()


def request_job() -> str | None:
    """The job id the current request carries, if any."""
    return _job.get()


class JobMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == _HEADER), None)
        if raw is None:
            await self.app(scope, receive, send)
            return
        try:
            job = check_job(raw.decode("latin-1"))
        except BadRequest as exc:
            await error_response(BadRequest(f"{JOB_HEADER}: {exc.message}"))(scope, receive, send)
            return
        token = _job.set(job)
        try:
            await self.app(scope, receive, send)
        finally:
            _job.reset(token)
