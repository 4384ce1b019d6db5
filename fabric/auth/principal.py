"""The principal a request acts as, and the roles it may hold per repository.

Each token is either a global admin or carries a role per repository:
``read`` < ``write`` < ``admin``; ``*`` stands for every repository.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabric.errors import BadRequest, Forbidden

ROLES = {"read": 1, "write": 2, "admin": 3}


@dataclass(frozen=True)
class Principal:
    """Who a request acts as, and what it may do."""

    token_id: str | None
    name: str
    admin: bool = False
    roles: dict[str, str] = field(default_factory=dict)

    def can(self, repo: str, role: str) -> bool:
        if self.admin:
            return True
        have = self.roles.get(repo) or self.roles.get("*")
        return have is not None and ROLES[have] >= ROLES[role]

    def require(self, repo: str, role: str) -> None:
        if not self.can(repo, role):
            raise Forbidden(f"token {self.name!r} lacks {role} access to repository {repo!r}")

    def require_admin(self) -> None:
        if not self.admin:
            raise Forbidden(f"token {self.name!r} is not an administrator token")

    def describe(self) -> dict:
        return {"token_id": self.token_id, "name": self.name, "admin": self.admin, "roles": self.roles}


#: What every request acts as when authentication is off (``--no-auth``).
ANONYMOUS_ADMIN = Principal(None, "anonymous", admin=True)


def check_role(role: str) -> str:
    if role not in ROLES:
        raise BadRequest(f"unknown role {role!r}: use read, write or admin")
    return role
