"""Ref expressions: ``branch``, ``tag``, a commit id (or unique prefix), with ``~N``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fabric.errors import BadRequest

_EXPR = re.compile(r"^(?P<base>[^~^]+)(?P<suffix>(?:~\d*|\^)*)$")


@dataclass(frozen=True)
class RefExpr:
    base: str
    ancestors: int  # how many first parents to walk back

    @property
    def plain(self) -> bool:
        return self.ancestors == 0


def parse_ref(expr: str) -> RefExpr:
    """Parse ``main``, ``v1``, ``3fa2c9e1``, ``main~2`` or ``main^^``."""
    m = _EXPR.match(expr or "")
    if not m:
        raise BadRequest(f"invalid ref {expr!r}: give a branch, a tag or a commit id, optionally with ~N")
    n = 0
    for part in re.findall(r"~\d*|\^", m.group("suffix")):
        n += int(part[1:] or 1) if part.startswith("~") else 1
    return RefExpr(m.group("base"), n)


def split_repo_ref(spec: str, default_ref: str | None = None) -> tuple[str, str | None]:
    """``repo@ref`` -> ``(repo, ref)``; a bare ``repo`` gives ``default_ref``."""
    if "@" in spec:
        repo, ref = spec.split("@", 1)
        if not repo or not ref:
            raise BadRequest(f"invalid {spec!r}: expected REPO@REF, e.g. datasets@main")
        return repo, ref
    return spec, default_ref
