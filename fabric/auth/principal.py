"""The principal a request acts as, and the roles and rights it may hold.

Each token is either a global admin or carries a role per repository:
``read`` < ``write`` < ``admin``; ``*`` stands for every repository. A token may
also hold rights beyond its roles (:data:`RIGHTS`): ``create-repos`` (it may
create repositories, and owns, with the ``admin`` role, each one it creates) and
``spoke`` (the token of a spoke: it may get S3 signing keys for the repositories
its own roles cover, and create repositories on behalf of a user who holds
``create-repos``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabric.errors import BadRequest, Forbidden

ROLES = {"read": 1, "write": 2, "admin": 3}
CREATE_REPOS = "create-repos"
SPOKE = "spoke"
RIGHTS = (CREATE_REPOS, SPOKE)


@dataclass(frozen=True)
class Principal:
    """Who a request acts as, and what it may do."""

    token_id: str | None
    name: str
    admin: bool = False
    roles: dict[str, str] = field(default_factory=dict)
    rights: frozenset[str] = frozenset()

    def role_on(self, repo: str) -> str | None:
        """The role this principal has on ``repo`` (``*``: on every repository), if any."""
        if self.admin:
            return "admin"
        return self.roles.get(repo) or self.roles.get("*")

    def can(self, repo: str, role: str) -> bool:
        have = self.role_on(repo)
        return have is not None and ROLES[have] >= ROLES[role]

    def has(self, right: str) -> bool:
        """Whether this principal holds ``right``; a global admin holds every right."""
        return self.admin or right in self.rights

    def require(self, repo: str, role: str) -> None:
        if not self.can(repo, role):
            raise Forbidden(f"token {self.name!r} lacks {role} access to repository {repo!r}")

    def require_admin(self) -> None:
        if not self.admin:
            raise Forbidden(f"token {self.name!r} is not an administrator token")

    def require_create_repos(self) -> None:
        if not self.has(CREATE_REPOS):
            raise Forbidden(
                f"token {self.name!r} may not create repositories: that needs an administrator token or one created "
                "with `fabric token create --create-repos`"
            )

    def within(self, limit: Principal) -> Principal:
        """This principal as seen through ``limit`` (a spoke's token): each role capped at what
        ``limit`` holds on the same repository; ``admin`` only if both are admins; the
        ``spoke`` right never passes through."""
        if limit.admin:
            return self
        roles = {}
        for repo in set(self.roles) | set(limit.roles) | ({"*"} if self.admin else set()):
            mine, theirs = self.role_on(repo), limit.role_on(repo)
            if mine is not None and theirs is not None:
                roles[repo] = min(mine, theirs, key=ROLES.__getitem__)
        return Principal(self.token_id, self.name, False, roles, self.rights - {SPOKE})

    def describe(self) -> dict:
        return {
            "token_id": self.token_id,
            "name": self.name,
            "admin": self.admin,
            "roles": self.roles,
            "rights": sorted(self.rights),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Principal:
        """The inverse of :meth:`describe` (answers of ``/auth/whoami``; ``rights`` may be absent)."""
        return cls(d["token_id"], d["name"], bool(d["admin"]), dict(d["roles"]), frozenset(d.get("rights") or ()))


#: What every request acts as when authentication is off (``--no-auth``).
ANONYMOUS_ADMIN = Principal(None, "anonymous", admin=True)


def check_role(role: str) -> str:
    if role not in ROLES:
        raise BadRequest(f"unknown role {role!r}: use read, write or admin")
    return role


def check_rights(rights: frozenset[str] | set[str] | list[str]) -> frozenset[str]:
    unknown = sorted(set(rights) - set(RIGHTS))
    if unknown:
        raise BadRequest(f"unknown right {unknown[0]!r}: use {' or '.join(RIGHTS)}")
    return frozenset(rights)
