"""Tokens in the catalog database, and the S3 key pairs derived from them.

A token looks like ``fab_<id>_<secret>``; the catalog keeps only a SHA-256 of
the secret. Each token is either a global admin or carries a role per
repository (:mod:`fabric.auth.principal`), and may hold rights beyond its roles
(``create-repos``, ``spoke``). The same token doubles as an S3
key pair: the access key id is derived from the token id and the secret key
is an HMAC of the token id under a server key, so no S3 secret is stored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable

from fabric.auth.principal import ROLES, Principal, check_rights, check_role
from fabric.catalog.db import Database
from fabric.errors import BadRequest, NotFound, Unauthorized
from fabric.format.paths import check_repo_name

TOKEN_PREFIX = "fab_"
ACCESS_KEY_PREFIX = "FAB"
_CACHE_SECONDS = 2.0


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    """Tokens in the catalog database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._cache: dict[tuple[str, str], tuple[float, Principal]] = {}
        self._lock = threading.Lock()
        key = self._setting("s3_key_secret")
        if key is None:
            with db.tx() as cur:
                cur.execute(
                    "INSERT INTO settings (key, value) VALUES ('s3_key_secret', ?) ON CONFLICT (key) DO NOTHING",
                    (secrets.token_hex(32),),
                )
            key = self._setting("s3_key_secret")
        self._s3_key = bytes.fromhex(key or "")

    def _setting(self, key: str) -> str | None:
        rows = self.db.query("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    # -- lifecycle -----------------------------------------------------------
    def create(
        self, name: str, admin: bool = False, roles: dict[str, str] | None = None, rights: frozenset[str] = frozenset()
    ) -> dict:
        """Create a token; the returned dict is the only place its secret ever appears."""
        roles = dict(roles or {})
        for repo, role in roles.items():
            if repo != "*":
                check_repo_name(repo)
            check_role(role)
        rights = check_rights(rights)
        if not admin and not roles and not rights:
            raise BadRequest("a token needs --admin, --create-repos or at least one --repo with a --role")
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO tokens (id, secret_hash, name, admin, created, revoked) VALUES (?, ?, ?, ?, ?, NULL)",
                (token_id, _hash(secret), name, int(admin), time.time()),
            )
            cur.executemany(
                "INSERT INTO token_roles (token_id, repo, role) VALUES (?, ?, ?)",
                [(token_id, repo, role) for repo, role in roles.items()],
            )
            cur.executemany(
                "INSERT INTO token_rights (token_id, right_name) VALUES (?, ?)", [(token_id, r) for r in sorted(rights)]
            )
        access, s3_secret = self.s3_credentials(token_id)
        return {
            "id": token_id,
            "name": name,
            "admin": admin,
            "roles": roles,
            "rights": sorted(rights),
            "token": f"{TOKEN_PREFIX}{token_id}_{secret}",
            "s3_access_key_id": access,
            "s3_secret_access_key": s3_secret,
        }

    def list(self) -> list[dict]:
        rows = self.db.query("SELECT id, name, admin, created, revoked FROM tokens ORDER BY created")
        out = []
        for token_id, name, admin, created, revoked in rows:
            out.append(
                {
                    "id": token_id,
                    "name": name,
                    "admin": bool(admin),
                    "roles": self._roles(token_id),
                    "rights": sorted(self._rights(token_id)),
                    "created": created,
                    "revoked": revoked is not None,
                    "s3_access_key_id": self.s3_credentials(token_id)[0],
                }
            )
        return out

    def revoke(self, token_id: str) -> None:
        with self.db.tx() as cur:
            cur.execute("UPDATE tokens SET revoked = ? WHERE id = ? AND revoked IS NULL", (time.time(), token_id))
            if cur.rowcount == 0:
                raise NotFound(f"no active token with id {token_id!r} (see `fabric token list`)")
        self._forget()

    def grant(self, token_id: str, repo: str, role: str) -> None:
        """Give token ``token_id`` ``role`` on ``repo`` (raising a role it holds there, never lowering it)."""
        check_repo_name(repo)
        check_role(role)
        have = self.principal(token_id).roles.get(repo)
        if have is None or ROLES[have] < ROLES[role]:
            with self.db.tx() as cur:
                cur.execute("DELETE FROM token_roles WHERE token_id = ? AND repo = ?", (token_id, repo))
                cur.execute("INSERT INTO token_roles (token_id, repo, role) VALUES (?, ?, ?)", (token_id, repo, role))
        self._forget()

    def _forget(self) -> None:
        """Drop cached principals: a token's rights or roles just changed."""
        with self._lock:
            self._cache.clear()

    def count(self) -> int:
        return int(self.db.query("SELECT COUNT(*) FROM tokens")[0][0])

    # -- authentication ------------------------------------------------------
    def authenticate(self, token: str) -> Principal:
        """The principal of a bearer token; Unauthorized if unknown, malformed or revoked."""
        return self._cached(("token", token), lambda: self._lookup(token))

    def _cached(self, key: tuple[str, str], lookup: Callable[[], Principal]) -> Principal:
        """A principal looked up at most every couple of seconds (revocations and grants clear it)."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return hit[1]
        principal = lookup()
        with self._lock:
            if len(self._cache) > 10000:
                self._cache.clear()
            self._cache[key] = (now + _CACHE_SECONDS, principal)
        return principal

    def _lookup(self, token: str) -> Principal:
        parts = token.split("_") if token.startswith(TOKEN_PREFIX) else []
        if len(parts) < 3:
            raise Unauthorized("malformed token: expected fab_<id>_<secret>")
        token_id, secret = parts[1], "_".join(parts[2:])
        return self.principal(token_id, secret_hash=_hash(secret))

    def principal(self, token_id: str, secret_hash: str | None = None) -> Principal:
        rows = self.db.query("SELECT secret_hash, name, admin, revoked FROM tokens WHERE id = ?", (token_id,))
        if not rows or (secret_hash is not None and not hmac.compare_digest(rows[0][0], secret_hash)):
            raise Unauthorized("unknown token; create one with `fabric token create`")
        _, name, admin, revoked = rows[0]
        if revoked is not None:
            raise Unauthorized(f"token {name!r} has been revoked")
        return Principal(token_id, name, bool(admin), self._roles(token_id), self._rights(token_id))

    def _roles(self, token_id: str) -> dict[str, str]:
        return dict(self.db.query("SELECT repo, role FROM token_roles WHERE token_id = ?", (token_id,)))

    def _rights(self, token_id: str) -> frozenset[str]:
        return frozenset(r for (r,) in self.db.query("SELECT right_name FROM token_rights WHERE token_id = ?", (token_id,)))

    # -- S3 credentials ------------------------------------------------------
    def s3_credentials(self, token_id: str) -> tuple[str, str]:
        digest = hmac.new(self._s3_key, token_id.encode(), hashlib.sha256).digest()
        return ACCESS_KEY_PREFIX + token_id.upper(), base64.b64encode(digest).decode()[:40]

    def s3_principal(self, access_key_id: str) -> tuple[Principal, str]:
        """The principal behind an S3 access key id (cached like a bearer token's), and the
        secret to check its signature with. The secret never leaves the hub."""
        if not access_key_id.startswith(ACCESS_KEY_PREFIX):
            raise Unauthorized("unknown access key id")
        token_id = access_key_id[len(ACCESS_KEY_PREFIX) :].lower()
        principal = self._cached(("id", token_id), lambda: self.principal(token_id))
        return principal, self.s3_credentials(token_id)[1]


def write_bootstrap_token(tokens: TokenStore, data_dir: str) -> str | None:
    """On first start, create a global admin token in ``DATA/admin.token`` (mode 0600).

    Returns the path when a token was written, ``None`` when one already exists.
    The token itself is never logged.
    """
    path = os.path.join(data_dir, "admin.token")
    if os.path.exists(path):
        return None
    info = tokens.create("bootstrap-admin", admin=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(info["token"] + "\n")
    return path
