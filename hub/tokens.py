"""Token administration routes (hub only: the hub is the authority for tokens)."""


from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, Field

from fabric.auth.principal import Principal
from fabric.auth.tokens import TokenStore


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    admin: bool = False
    roles: dict[str, Literal["read", "write", "admin"]] = Field(
        default_factory=dict, description="repository name (or '*') -> role"
    )


class TokenCreated(BaseModel):
    id: str
    name: str
    admin: bool
    roles: dict[str, str]
    token: str
    s3_access_key_id: str
    s3_secret_access_key: str


class TokenInfo(BaseModel):
    id: str
    name: str
    admin: bool
    roles: dict[str, str]
    created: float
    revoked: bool
    s3_access_key_id: str


class WhoAmI(BaseModel):
    token_id: str | None
    name: str
    admin: bool
    roles: dict[str, str]


class S3Key(BaseModel):
    principal: WhoAmI
    secret: str


def tokens_router(tokens: TokenStore, authenticate: Callable[..., Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["auth"])
    Caller = Annotated[Principal, Depends(authenticate)]

    @router.post("/tokens", response_model=TokenCreated, status_code=201)
    def create(body: TokenCreate, who: Caller) -> dict:
        """Create a token. Its secret (and S3 secret key) appear only in this response."""
        who.require_admin()
        return tokens.create(body.name, body.admin, dict(body.roles))

    @router.get("/tokens", response_model=list[TokenInfo])
    def list_tokens(who: Caller) -> list[dict]:
        who.require_admin()
        return tokens.list()

    @router.delete("/tokens/{token_id}", status_code=204)
    def revoke(token_id: str, who: Caller) -> Response:
        who.require_admin()
        tokens.revoke(token_id)
        return Response(status_code=204)

    @router.get("/auth/s3-keys/{access_key_id}", response_model=S3Key)
    def s3_key(access_key_id: str, who: Caller) -> dict:
        """The token behind an S3 access key id and the secret its signatures use.

        For spokes that serve S3 (they verify signatures themselves); global admins only."""
        who.require_admin()
        principal, secret = tokens.s3_principal(access_key_id)
        return {"principal": principal.describe(), "secret": secret}

    @router.get("/auth/whoami", response_model=WhoAmI)
    def whoami(who: Caller) -> dict:
        """The caller's token and roles (spokes use this to check a caller's token)."""
        return who.describe()

    return router
