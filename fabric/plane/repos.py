"""The repositories role of the data plane: create, look up, list and delete repositories."""

from __future__ import annotations

import abc


class Repositories(abc.ABC):
    """Repositories by name. A repository dict is ``{name, default_branch, created}``
    (``created``: seconds since the epoch).

    A spoke reuses answers about repositories for up to 30 seconds without asking
    the hub (it forgets them at once when it creates or deletes one itself)."""

    @abc.abstractmethod
    def create_repo(self, name: str, default_branch: str = "main", owner: str | None = None) -> dict:
        """Create a repository with one empty commit on its default branch; its repository dict.

        ``owner``: the id of the token it is created for. The hub grants that token
        ``admin`` on it (``hub/owners.py``); a spoke passes it on to its hub; the bare
        engine knows no tokens and ignores it.

        Raises InvalidName (a BadRequest) for a bad repository or branch name, Conflict
        if the repository exists. Not idempotent: a retry of a call that did land
        answers Conflict. The repository, its branch and its first commit are visible
        to every reader once this returns."""

    @abc.abstractmethod
    def get_repo(self, name: str) -> dict:
        """``{name, default_branch, created}``; NotFound if absent.

        Raises InvalidName for a bad name. Read-only, safe to retry."""

    @abc.abstractmethod
    def list_repos(self) -> list[dict]:
        """Every repository dict, by name (over HTTP: those the caller may read).

        Read-only, safe to retry."""

    @abc.abstractmethod
    def delete_repo(self, name: str) -> None:
        """Delete a repository: its branches, tags, staged changes and bucket bindings.

        Raises NotFound if it does not exist, InvalidName for a bad name. Data no
        other repository reaches is removed by a later :meth:`~fabric.plane.admin.Admin.gc`.
        Not idempotent: a retry of a call that did land answers NotFound."""
