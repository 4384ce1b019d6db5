"""The paths of a local tree an import leaves out: ``fabric import --exclude PATTERN``.

Patterns are written as for rsync's ``--exclude`` and ``.gitignore``, and matched against a
path relative to the imported directory:

- ``*`` and ``?`` match within one name, ``[...]`` one character of a class (``[!...]``:
  not of it), ``**`` any run of names (``a/**/b`` matches ``a/b``, ``a/x/b``, ``a/x/y/b``),
  and ``\\`` makes the next character literal;
- a pattern with no ``/`` but a trailing one matches a name at any depth (``*.tmp``,
  ``.git``, ``__pycache__``);
- a pattern with a ``/`` in front or inside is matched against the whole path from the
  directory's root (``/build``, ``data/raw/*.csv``);
- a trailing ``/`` matches directories only (``cache/``);
- an excluded directory is left out with everything under it.

A ``!`` in front (``.gitignore``'s negation) is refused rather than read as a name: write
``\\!`` for a name that starts with one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fabric.errors import BadRequest


class Excludes:
    def __init__(self, patterns: Iterable[str]) -> None:
        """BadRequest for a pattern that is empty, starts with ``!`` or has an unclosed ``[``."""
        self.patterns = list(patterns)
        self._rules = [_compile(p) for p in self.patterns]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def excluded(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative, ``/``-separated) is left out by a pattern itself."""
        return any((is_dir or not dir_only) and rule.match(path) for rule, dir_only in self._rules)

    def covers(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` or a directory above it is left out."""
        parts = path.split("/")
        for i in range(1, len(parts)):
            if self.excluded("/".join(parts[:i]), True):
                return True
        return self.excluded(path, is_dir)


def read_patterns(text: str) -> list[str]:
    """The patterns of an ``--exclude-from`` file: one a line; blank lines and lines that
    start with ``#`` are skipped, trailing blanks dropped (``\\ `` keeps one)."""
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        stripped = line.rstrip(" \t")
        if stripped.endswith("\\") and len(stripped) < len(line):
            stripped += line[len(stripped)]
        if stripped and not stripped.startswith("#"):
            out.append(stripped)
    return out


def _compile(pattern: str) -> tuple[re.Pattern[str], bool]:
    """The regular expression of ``pattern`` and whether it matches directories only."""
    if pattern.startswith("!"):
        raise BadRequest(f"exclude pattern {pattern!r}: negation ('!') is not supported; write '\\!' for a name starting with '!'")
    dir_only = pattern.endswith("/") and not pattern.endswith("\\/")
    body = pattern.rstrip("/") if dir_only else pattern
    anchored = "/" in body
    body = body.lstrip("/")
    if not body:
        raise BadRequest(f"exclude pattern {pattern!r} matches no name: give a name or a glob such as '*.tmp'")
    regex = _translate(body, pattern)
    return re.compile(("^" if anchored else "^(?:.*/)?") + regex + "$", re.DOTALL), dir_only


def _translate(body: str, pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        if body.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif body[i] == "*":
            out.append("[^/]*")
            i += 1
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        elif body[i] == "\\" and i + 1 < len(body):
            out.append(re.escape(body[i + 1]))
            i += 2
        elif body[i] == "[":
            klass, i = _character_class(body, i, pattern)
            out.append(klass)
        else:
            out.append(re.escape(body[i]))
            i += 1
    return "".join(out)


def _character_class(body: str, start: int, pattern: str) -> tuple[str, int]:
    """The regular expression of the class ``[...]`` opening at ``start``, and the index after it."""
    i = start + 1
    negate = i < len(body) and body[i] in "!^"
    if negate:
        i += 1
    first = i
    while i < len(body) and (body[i] != "]" or i == first):
        i += 1
    if i >= len(body):
        raise BadRequest(f"exclude pattern {pattern!r}: '[' at {start} is never closed")
    members = body[first:i].replace("/", "").replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
    if not members:
        raise BadRequest(f"exclude pattern {pattern!r}: the class at {start} holds no character a name can have")
    return ("[^/" if negate else "[") + members + "]", i + 1
