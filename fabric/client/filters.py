"""The paths of a tree an import or export leaves out: ``--include`` and ``--exclude`` rules.

Rules are read as rsync reads its ``--include`` and ``--exclude`` options: **in the order
given, the first rule whose pattern matches a path decides** (an include keeps it, an exclude
leaves it out), and a path no rule matches is kept. So ``--include '*/' --include '*.csv'
--exclude '*'`` keeps the CSV files at any depth and nothing else, while ``--exclude '*'``
first leaves everything out. A directory left out is not entered: nothing under it is kept,
whatever a later include says (hence the ``*/`` above).

Patterns are written as for rsync and ``.gitignore``, and matched against a path relative to
the tree's root:

- ``*`` and ``?`` match within one name, ``[...]`` one character of a class (``[!...]``:
  not of it), ``**`` any run of names (``a/**/b`` matches ``a/b``, ``a/x/b``, ``a/x/y/b``),
  and ``\\`` makes the next character literal;
- a pattern with no ``/`` but a trailing one matches a name at any depth (``*.tmp``,
  ``.git``, ``__pycache__``);
- a pattern with a ``/`` in front or inside is matched against the whole path from the
  tree's root (``/build``, ``data/raw/*.csv``);
- a trailing ``/`` matches directories only (``cache/``).

A ``!`` in front (``.gitignore``'s negation) is refused rather than read as a name: write
``\\!`` for a name that starts with one, and an ``--include`` for what ``!`` would keep.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from fabric.errors import BadRequest
from fabric.format.paths import check_path

INCLUDE, EXCLUDE = "include", "exclude"
T = TypeVar("T")


@dataclass(frozen=True)
class _Rule:
    include: bool
    regex: re.Pattern[str]
    dir_only: bool

    def matches(self, path: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.match(path) is not None


class Filters:
    def __init__(self, rules: Iterable[tuple[str, str]]) -> None:
        """``rules``: ``(INCLUDE or EXCLUDE, pattern)`` in the order they apply. BadRequest for
        a pattern that is empty, starts with ``!`` or has an unclosed ``[``."""
        self._rules = [_Rule(kind == INCLUDE, *_compile(pattern, kind)) for kind, pattern in rules]

    @classmethod
    def excluding(cls, patterns: Iterable[str]) -> Filters:
        """Exclude rules only."""
        return cls((EXCLUDE, p) for p in patterns)

    def __bool__(self) -> bool:
        return bool(self._rules)

    @property
    def leaves_out_nothing(self) -> bool:
        """Whether no rule excludes anything (includes only: every path is kept)."""
        return all(rule.include for rule in self._rules)

    def excluded(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative, ``/``-separated) is left out by the first rule matching it."""
        for rule in self._rules:
            if rule.matches(path, is_dir):
                return not rule.include
        return False

    def covers(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` or a directory above it is left out."""
        parts = path.split("/")
        for i in range(1, len(parts)):
            if self.excluded("/".join(parts[:i]), True):
                return True
        return self.excluded(path, is_dir)


def read_patterns(text: str) -> list[str]:
    """The patterns of an ``--exclude-from`` or ``--include-from`` file: one a line; blank lines
    and lines that start with ``#`` are skipped, trailing blanks dropped (``\\ `` keeps one)."""
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        stripped = line.rstrip(" \t")
        if stripped.endswith("\\") and len(stripped) < len(line):
            stripped += line[len(stripped)]
        if stripped and not stripped.startswith("#"):
            out.append(stripped)
    return out


def _compile(pattern: str, kind: str) -> tuple[re.Pattern[str], bool]:
    """The regular expression of ``pattern`` and whether it matches directories only."""
    if pattern.startswith("!"):
        raise BadRequest(f"{kind} pattern {pattern!r}: negation ('!') is not supported; write '\\!' for a name starting with '!'")
    dir_only = pattern.endswith("/") and not pattern.endswith("\\/")
    body = pattern.rstrip("/") if dir_only else pattern
    anchored = "/" in body
    body = body.lstrip("/")
    if not body:
        raise BadRequest(f"{kind} pattern {pattern!r} matches no name: give a name or a glob such as '*.tmp'")
    regex = _translate(body, f"{kind} pattern {pattern!r}")
    return re.compile(("^" if anchored else "^(?:.*/)?") + regex + "$", re.DOTALL), dir_only


def _translate(body: str, what: str) -> str:
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
            klass, i = _character_class(body, i, what)
            out.append(klass)
        else:
            out.append(re.escape(body[i]))
            i += 1
    return "".join(out)


def _character_class(body: str, start: int, what: str) -> tuple[str, int]:
    """The regular expression of the class ``[...]`` opening at ``start``, and the index after it."""
    i = start + 1
    negate = i < len(body) and body[i] in "!^"
    if negate:
        i += 1
    first = i
    while i < len(body) and (body[i] != "]" or i == first):
        i += 1
    if i >= len(body):
        raise BadRequest(f"{what}: '[' at {start} is never closed")
    members = body[first:i].replace("/", "").replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
    if not members:
        raise BadRequest(f"{what}: the class at {start} holds no character a name can have")
    return ("[^/" if negate else "[") + members + "]", i + 1


class FileList:
    """The paths of ``--files-from``: only these are copied, a directory with everything under it."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = set(paths)
        self._above = {"/".join(p.split("/")[:i]) for p in self.paths for i in range(1, p.count("/") + 1)}

    def wanted(self, path: str, is_dir: bool) -> bool:
        """Whether a walk takes ``path``: it is held, or a directory on the way to a listed path."""
        return (is_dir and path in self._above) or self.holds(path)

    def holds(self, path: str) -> bool:
        """Whether ``path`` is listed or lies under a listed directory."""
        return bool(self._listed_at(path))

    def missing(self, present: Iterable[str]) -> list[str]:
        """The listed paths that are neither among ``present`` nor a directory above one of them."""
        return self.select(present, str)[1]

    def select(self, items: Iterable[T], path_of: Callable[[T], str]) -> tuple[list[T], list[str]]:
        """The ``items`` whose path the list holds, and (as :meth:`missing`) the listed paths
        none of them is or lies under: one pass, keeping no more than the list's own paths."""
        kept, found = [], set()
        for item in items:
            if listed := self._listed_at(path_of(item)):
                kept.append(item)
                found.update(listed)
        return kept, sorted(self.paths - found)

    def _listed_at(self, path: str) -> list[str]:
        """The listed paths among ``path`` and the directories above it."""
        parts = path.split("/")
        return [above for above in ("/".join(parts[:i]) for i in range(1, len(parts) + 1)) if above in self.paths]


def read_path_list(text: str) -> list[str]:
    """The paths of a ``--files-from`` file: one a line, relative to the tree's root (``./`` and
    ``/`` in front and ``/`` behind are dropped); blank lines and lines that start with ``#``
    are skipped. BadRequest for a line that is no path within the tree (``..``)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        path = line.strip("/")
        while path.startswith("./"):
            path = path[2:].lstrip("/")
        try:
            out.append(check_path(path))
        except BadRequest as exc:
            raise BadRequest(f"--files-from line {number} ({line!r}): {exc}") from None
    return out
