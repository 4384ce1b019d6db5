"""The refs role of the data plane: branches, tags, and resolving ref expressions.

Refs are expressions (``main``, ``v1``, a commit id or prefix, ``main~2``).
A ref dict is ``{name, commit_id}``. Branch and tag names share one namespace
per repository. Every ref change is a compare-and-swap at the hub: visible to
every reader of the hub once it returns, and to a spoke's readers once the
spoke hears of it: at once for changes made through that spoke, otherwise by
the hub's watch stream, or within the spoke's lease while that stream is down.
"""

from __future__ import annotations

import abc


class Refs(abc.ABC):
    @abc.abstractmethod
    def resolve_commit(self, repo: str, ref: str) -> str:
        """The commit id (64 hex digits) a ref expression points at now.

        Raises NotFound if the repository, branch, tag or commit does not exist or
        ``~N`` goes back past the first commit; BadRequest if the expression is
        malformed or a commit id prefix is ambiguous. Read-only, safe to retry. A
        spoke cut off from its hub answers from what it last saw (see
        :meth:`~fabric.plane.reads.Reads.is_stale`)."""

    @abc.abstractmethod
    def list_branches(self, repo: str) -> list[dict]:
        """Every branch of ``repo`` as ``{name, commit_id}``, by name.

        Raises NotFound if the repository does not exist. Read-only, safe to retry.
        A spoke cut off from its hub answers with the branches it last saw of a
        repository it knows (Unavailable for one it does not)."""

    @abc.abstractmethod
    def create_branch(self, repo: str, name: str, source: str) -> dict:
        """Create branch ``name`` at the commit ref expression ``source`` resolves to;
        ``{name, commit_id}``.

        Raises InvalidName for a bad name, NotFound if the repository or ``source``
        does not exist, Conflict if a branch or tag named ``name`` exists. Not
        idempotent: a retry of a call that did land answers Conflict."""

    @abc.abstractmethod
    def delete_branch(self, repo: str, name: str) -> None:
        """Delete a branch and its uncommitted changes.

        Raises NotFound if the repository or branch does not exist, BadRequest for
        the repository's default branch. Not idempotent: a retry of a call that did
        land answers NotFound."""

    @abc.abstractmethod
    def reset_branch(self, repo: str, name: str, ref: str) -> dict:
        """Point a branch at ``ref`` and drop its uncommitted changes; ``{name, commit_id}``.

        Raises NotFound if the repository, branch or ``ref`` does not exist, Conflict
        if the branch moved while it was being reset. Repeating it with a commit id
        leaves the same state (safe to retry); a ``ref`` that names a branch is
        resolved again on each call."""

    @abc.abstractmethod
    def list_tags(self, repo: str) -> list[dict]:
        """Every tag of ``repo`` as ``{name, commit_id}``, by name.

        Raises NotFound if the repository does not exist. Read-only, safe to retry.
        A spoke cut off from its hub answers as :meth:`list_branches` does."""

    @abc.abstractmethod
    def create_tag(self, repo: str, name: str, ref: str) -> dict:
        """Create tag ``name`` at the commit ``ref`` resolves to; ``{name, commit_id}``.

        A tag at a branch points at its head commit (never at uncommitted changes).
        Raises InvalidName for a bad name, NotFound if the repository or ``ref``
        does not exist, Conflict if a tag or branch named ``name`` exists. Not
        idempotent: a retry of a call that did land answers Conflict."""

    @abc.abstractmethod
    def delete_tag(self, repo: str, name: str) -> None:
        """Delete a tag (the commits stay while anything else reaches them).

        Raises NotFound if the repository or tag does not exist. Not idempotent: a
        retry of a call that did land answers NotFound."""
