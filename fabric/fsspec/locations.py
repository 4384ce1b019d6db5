"""Paths of ``fabric://``: ``REPO@REF/path``, or ``REPO/path`` for the repository's default branch."""

from __future__ import annotations

from dataclasses import dataclass

from fabric import errors
from fabric.format.paths import check_path, check_repo_name


@dataclass(frozen=True)
class Location:
    """A path parsed: ``root`` is its first component as the caller wrote it (``repo@ref`` or
    ``repo``), so names the file system returns keep the caller's form; ``ref`` None means the
    repository's default branch; ``key`` is the path in the tree ('' for its root)."""

    root: str
    repo: str
    ref: str | None
    key: str

    def name(self, key: str) -> str:
        """The file-system name of ``key`` in this location's repository and ref."""
        return f"{self.root}/{key}" if key else self.root

    def at(self, key: str) -> Location:
        return Location(self.root, self.repo, self.ref, key)


def parse(path: str) -> Location | None:
    """``path`` without protocol as a location; None for '' (the list of repositories).

    Raises ValueError for a bad repository name, an empty ref or a bad path."""
    path = path.strip("/")
    if not path:
        return None
    root, _, key = path.partition("/")
    repo, at, ref = root.partition("@")
    try:
        check_repo_name(repo)
        check_path(key, allow_empty=True)
    except errors.BadRequest as exc:
        raise ValueError(f"fabric://{path}: {exc.message}") from None
    if at and not ref:
        raise ValueError(f"fabric://{path}: empty ref after '@': write REPO@BRANCH/path, or REPO/path for the default branch")
    return Location(root, repo, ref or None, key)
