"""How an HTTP request proves who it is (bearer tokens)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request

from fabric.auth.principal import ANONYMOUS_ADMIN, Principal
from fabric.errors import Unauthorized


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def token_authenticator(verify: Callable[[str], Principal] | None) -> Callable[[Request], Principal]:
    """A FastAPI dependency; ``verify=None`` turns authentication off (everyone is admin)."""

    def authenticate(request: Request) -> Principal:
        if verify is None:
            return ANONYMOUS_ADMIN
        token = bearer_token(request)
        if token is None:
            raise Unauthorized(
                "authentication required: send 'Authorization: Bearer <token>' "
                "(the hub wrote an admin token to DATA/admin.token; see `fabric token create`)"
            )
        return verify(token)

    return authenticate
