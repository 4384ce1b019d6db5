"""Mapping fabric errors and request validation failures to JSON error responses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..errors import FabricError


def error_response(exc: FabricError) -> JSONResponse:
    headers = {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="fabric"'
    if exc.status == 416 and "size" in exc.details:
        headers["Content-Range"] = f"bytes */{exc.details['size']}"
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(FabricError)
    async def fabric_error(_request: Request, exc: FabricError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5]
        )
        return JSONResponse({"error": {"code": "bad_request", "message": f"invalid request: {problems}"}}, status_code=400)
