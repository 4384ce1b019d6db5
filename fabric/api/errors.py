"""Mapping fabric errors and request validation failures to JSON error responses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fabric.errors import FabricError

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


def error_response(exc: FabricError) -> JSONResponse:
    headers = {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="fabric"'
    if exc.status == 416 and "size" in exc.details:
        headers["Content-Range"] = f"bytes */{exc.details['size']}"
    if exc.status in (429, 503) and "retry_after" in exc.details:
        headers["Retry-After"] = str(max(1, round(exc.details["retry_after"])))
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(FabricError)
    async def fabric_error(_request: Request, exc: FabricError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Framework errors (unknown route, wrong method, a body that is not UTF-8 JSON) in
        # the same {"error": {code, message}} document as every other error.
        code = _HTTP_CODES.get(exc.status_code, "badrequest" if exc.status_code < 500 else "internal_error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = "the request body could not be parsed: send JSON encoded as UTF-8 (Content-Type: application/json)"
        elif exc.status_code == 404 and message == "Not Found":
            message = f"no such route: {request.method} {request.url.path} (see /openapi.json)"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path} (see /openapi.json)"
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5]
        )
        return JSONResponse({"error": {"code": "bad_request", "message": f"invalid request: {problems}"}}, status_code=400)
