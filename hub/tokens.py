"""Token administration routes, and what spokes ask of the hub to serve S3 (hub only: the
hub is the authority for tokens).

A spoke never gets an S3 secret: it asks for the SigV4 signing key of one access
key for one day, region and service (``/auth/s3-signing-keys``), or has the hub
check a SigV2 signature (``/auth/s3-v2-check``). Both need a token with the
``spoke`` right (or a global admin), and both answer the key's principal with its
roles capped at the spoke token's own (:meth:`Principal.within`): a key that has
no role on a repository the spoke's token covers (and no right to create one) is
refused.
"""

import re
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field

from fabric.api.routing import BoundedJsonRoute
from fabric.api.s3 import sigv4
from fabric.auth.principal import CREATE_REPOS, SPOKE, Principal
from fabric.auth.tokens import TokenStore
from fabric.errors import BadRequest, Forbidden, NotFound, Unauthorized

Right = Literal["create-repos", "spoke"]
_REGION = re.compile(r"^[a-z0-9-]{1,64}$")
#: A SigV2 request has at most a few candidate strings to sign (path forms x date forms).
MAX_V2_STRINGS = 8


class TokenCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    admin: bool = False
    roles: dict[str, Literal["read", "write", "admin"]] = Field(
        default_factory=dict, description="repository name (or '*') -> role"
    )
    rights: list[Right] = Field(
        default_factory=list,
        description="create-repos: may create repositories (and owns them); spoke: the token of a spoke",
    )


class TokenCreated(BaseModel):
    id: str
    name: str
    admin: bool
    roles: dict[str, str]
    rights: list[str]
    token: str
    s3_access_key_id: str
    s3_secret_access_key: str


class TokenInfo(BaseModel):
    id: str
    name: str
    admin: bool
    roles: dict[str, str]
    rights: list[str]
    created: float
    revoked: bool
    s3_access_key_id: str


class WhoAmI(BaseModel):
    token_id: str | None
    name: str
    admin: bool
    roles: dict[str, str]
    rights: list[str] = []


class SigningKey(BaseModel):
    principal: WhoAmI
    key: str = Field(description="the SigV4 signing key for the date, region and service asked for (hex)")


class V2Check(BaseModel):
    access_key_id: str = Field(max_length=64)
    strings_to_sign: list[Annotated[str, Field(max_length=16384)]] = Field(min_length=1, max_length=MAX_V2_STRINGS)
    signature: str = Field(max_length=64)


class V2Verdict(BaseModel):
    match: bool
    principal: WhoAmI | None = None


def tokens_router(tokens: TokenStore, authenticate: Callable[..., Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["auth"], route_class=BoundedJsonRoute)
    Caller = Annotated[Principal, Depends(authenticate)]

    def key_principal(access_key_id: str, spoke: Principal) -> tuple[Principal, str]:
        """The principal of an S3 key as ``spoke`` may see it, and the key's secret."""
        if not spoke.has(SPOKE):
            raise Forbidden(f"token {spoke.name!r} is not a spoke's token (create one with `fabric token create --spoke`)")
        try:
            principal, secret = tokens.s3_principal(access_key_id)
        except Unauthorized:
            raise NotFound("unknown access key id") from None
        seen = principal.within(spoke)
        if not (seen.admin or seen.roles or seen.has(CREATE_REPOS)):
            raise Forbidden(f"the S3 key of token {principal.name!r} has no role on a repository this spoke serves")
        return seen, secret

    @router.post("/tokens", response_model=TokenCreated, status_code=201)
    def create(body: TokenCreate, who: Caller) -> dict:
        """Create a token. Its secret (and S3 secret key) appear only in this response."""
        who.require_admin()
        return tokens.create(body.name, body.admin, dict(body.roles), frozenset(body.rights))

    @router.get("/tokens", response_model=list[TokenInfo])
    def list_tokens(who: Caller) -> list[dict]:
        who.require_admin()
        return tokens.list()

    @router.delete("/tokens/{token_id}", status_code=204)
    def revoke(token_id: str, who: Caller) -> Response:
        who.require_admin()
        tokens.revoke(token_id)
        return Response(status_code=204)

    @router.get("/auth/s3-signing-keys/{access_key_id}", response_model=SigningKey)
    def s3_signing_key(
        access_key_id: str,
        who: Caller,
        date: Annotated[str, Query(pattern=r"^\d{8}$", description="YYYYMMDD")],
        region: Annotated[str, Query(max_length=64)],
        service: Literal["s3"] = "s3",
    ) -> dict:
        """The SigV4 signing key of an S3 access key for one day, region and service, and its
        principal capped at the caller's roles. For spokes (tokens with the ``spoke`` right)."""
        if not _REGION.match(region):
            raise BadRequest("region must be 1-64 of a-z, 0-9 and '-'")
        principal, secret = key_principal(access_key_id, who)
        return {"principal": principal.describe(), "key": sigv4.signing_key(secret, date, region, service).hex()}

    @router.post("/auth/s3-v2-check", response_model=V2Verdict)
    def s3_v2_check(body: V2Check, who: Caller) -> dict:
        """Whether a SigV2 signature signs one of the given strings with an access key's secret;
        if so, the key's principal capped at the caller's roles. For spokes."""
        principal, secret = key_principal(body.access_key_id, who)
        if not sigv4.v2_matches(secret, body.strings_to_sign, body.signature):
            return {"match": False}
        return {"match": True, "principal": principal.describe()}

    @router.get("/auth/whoami", response_model=WhoAmI)
    def whoami(who: Caller) -> dict:
        """The caller's token, roles and rights (spokes use this to check a caller's token)."""
        return who.describe()

    return router
