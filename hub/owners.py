"""Repositories owned by the token that created them.

The hub's frontends (REST and S3) are written over any data plane and pass the
token a new repository is for as ``owner`` (a spoke forwards it to its hub with
``X-Fabric-On-Behalf-Of``). At the hub, the token authority, :class:`OwningPlane`
turns it into a grant: the owner gets the ``admin`` role on the repository it
created (a global admin needs none).
"""

from __future__ import annotations

from fastapi import Request

from fabric.auth.principal import SPOKE, Principal
from fabric.auth.tokens import TokenStore
from fabric.engine.engine import Engine
from fabric.errors import BadRequest, Forbidden, Unauthorized
from fabric.plane.wrapper import PlaneWrapper

#: The header a spoke names its caller's token id in when it creates a repository or bucket binding.
ON_BEHALF_OF = "x-fabric-on-behalf-of"
#: The only calls a spoke makes on behalf of a caller: those whose result the caller owns.
_ON_BEHALF_CALLS = {("POST", "/api/v1/repos"), ("POST", "/api/v1/buckets")}


class OwningPlane(PlaneWrapper):
    """The engine, with repositories granted to the token that creates them."""

    def __init__(self, engine: Engine, tokens: TokenStore) -> None:
        super().__init__(engine)
        self.tokens = tokens

    def create_repo(self, name: str, default_branch: str = "main", owner: str | None = None) -> dict:
        """Create a repository; ``owner`` (a token id) must hold ``create-repos`` and is granted ``admin`` on it."""
        principal = self.tokens.principal(owner) if owner is not None else None
        if principal is not None:
            principal.require_create_repos()
        info = self.inner.create_repo(name, default_branch)
        if principal is not None and not principal.admin:
            try:
                self.tokens.grant(principal.token_id, name, "admin")
            except Exception:
                self.inner.delete_repo(name)  # an unowned repository nobody asked for
                raise
        return info

    def create_bucket(
        self, name: str, repo: str, ref: str, created_by_s3: bool = False, owner: str | None = None
    ) -> dict:
        """Bind a bucket; ``owner`` is who asked (the route checked their role on ``repo``)."""
        return self.inner.create_bucket(name, repo, ref, created_by_s3)


def acting_for(request: Request, caller: Principal, tokens: TokenStore) -> Principal:
    """The principal a request acts as: ``caller``, or the token a spoke names in ``X-Fabric-On-Behalf-Of``.

    Honoured only from a token with the ``spoke`` right (or a global admin) and only
    for creating a repository or a bucket binding; the routes then check the named
    token's own rights and roles."""
    on_behalf = request.headers.get(ON_BEHALF_OF)
    if on_behalf is None:
        return caller
    if (request.method, request.url.path) not in _ON_BEHALF_CALLS:
        raise BadRequest("X-Fabric-On-Behalf-Of is accepted only when creating a repository or a bucket binding")
    if not caller.has(SPOKE):
        raise Forbidden(f"token {caller.name!r} may not act on behalf of another token: that needs a spoke's token")
    try:
        return tokens.principal(on_behalf.strip())
    except Unauthorized as exc:
        raise Forbidden(f"X-Fabric-On-Behalf-Of names no active token: {exc.message}") from None
