"""The history role of the data plane: commits and what tells them apart.

Commits are immutable and addressed by id. Every method that makes a commit
moves its branch by compare-and-swap: Conflict (its details carry ``head``,
the branch's current head) when the branch moved meanwhile.
A new commit is visible to every reader of the hub once the call returns.
None of them is idempotent: a call whose answer was lost may have landed, so
pass ``expected_head`` (where offered) to make a repeat fail with Conflict
instead of committing twice.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping

from fabric.format.listing import Change
from fabric.format.model import Commit, Entry


class History(abc.ABC):
    @abc.abstractmethod
    def get_commit(self, repo: str, commit_id: str) -> Commit:
        """The commit with full id ``commit_id`` (as :meth:`~fabric.plane.refs.Refs.resolve_commit` returns).

        Raises NotFound if no such commit is stored. Only a remote plane checks that
        the commit belongs to ``repo`` (the hub and a spoke read it by id), so pass
        ids learnt from ``repo``. Read-only, safe to retry."""

    @abc.abstractmethod
    def log(self, repo: str, ref: str, path: str | None = None, limit: int = 100, after: str | None = None) -> list[Commit]:
        """Newest first; ``path`` keeps commits that changed it; ``after`` continues a page.

        At most ``limit`` commits reachable from ``ref`` (all parents followed, by
        commit time). ``after`` is the last commit id of the previous page; an id not
        in the history gives an empty page. Raises NotFound if the repository or
        ``ref`` does not exist, InvalidPath for a bad ``path``. Read-only, safe to retry."""

    @abc.abstractmethod
    def commit(
        self,
        repo: str,
        branch: str,
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Fold the branch's staging into a commit; Conflict if the head is not ``expected_head``.

        Returns the new commit (the branch's new head). Exactly the changes staged
        when the commit began are folded in; changes staged meanwhile stay staged.
        A spoke first pushes its queued ``local`` writes of the branch (Unavailable
        while the hub is away), so they are in the commit. Raises NotFound if the
        repository or branch does not exist; BadRequest for an empty message, when
        nothing changed (unless ``allow_empty``), or when a staged entry's chunks are
        not stored; Conflict if the branch moved meanwhile. Not idempotent (see the
        module notes)."""

    @abc.abstractmethod
    def commit_changes(
        self,
        repo: str,
        branch: str,
        changes: Mapping[str, Entry | None],
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Commit explicit entries (``None`` deletes) whose chunks are stored, bypassing staging.

        Returns the new commit; the branch's staged changes are left alone (and stay
        visible over the new head). Raises as :meth:`commit` does, and InvalidPath
        for a bad path; ``expected_head`` is checked before anything else. Not
        idempotent (see the module notes)."""

    @abc.abstractmethod
    def diff(self, repo: str, left: str, right: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        """What changed from ref ``left`` to ref ``right`` under ``prefix``, one
        :class:`Change` per path, in path order; with ``after``, only the paths
        after it (a page resumes there, without the work of the pages before).

        Compares committed trees: a branch's uncommitted changes are left out (see
        :meth:`uncommitted`). Remote planes return changes without their entries
        (``old`` and ``new`` are None). Raises NotFound if the repository or a ref
        does not exist, InvalidPath for a bad prefix; the iterator may raise them
        only when it is first advanced. Read-only, safe to retry."""

    @abc.abstractmethod
    def uncommitted(self, repo: str, branch: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        """A branch's staged changes under ``prefix`` against its head, in path order;
        with ``after``, only the paths after it.

        Staged deletes of paths that do not exist are left out. Remote planes return
        changes without their entries. Raises NotFound if the repository or branch
        does not exist, BadRequest if ``branch`` names a tag or commit; the iterator
        may raise them only when it is first advanced. Read-only, safe to retry."""

    @abc.abstractmethod
    def merge(
        self, repo: str, source: str, dest: str, strategy: str | None = None, message: str | None = None, author: str | None = None
    ) -> Commit:
        """Three-way merge into branch ``dest``; MergeConflict lists conflicting paths.

        Merges the committed state of ref ``source`` at file granularity into a
        commit with parents ``[dest head, source]``; ``strategy`` ``ours`` or
        ``theirs`` settles paths changed on both sides. ``dest``'s staged changes are
        left alone. Raises NotFound if the repository, ``dest`` or ``source`` does
        not exist; BadRequest for an unknown strategy or when ``source`` is already
        merged; MergeConflict (a Conflict, ``.conflicts`` lists the paths) without a
        strategy when paths conflict; Conflict if ``dest`` moved meanwhile. Not
        idempotent: a repeat of a merge that landed answers BadRequest (already merged)."""

    @abc.abstractmethod
    def revert(self, repo: str, branch: str, commit_ref: str, parent: int = 1, author: str | None = None) -> Commit:
        """Undo the changes ``commit_ref`` made against its ``parent``-th parent, as a
        new commit on ``branch``.

        Raises NotFound if the repository, branch or commit does not exist;
        BadRequest for the first commit of a repository or a ``parent`` out of
        range; MergeConflict if a path it changed has changed again on the branch
        since; Conflict if the branch moved meanwhile. Not idempotent: a repeat of a
        revert that landed answers MergeConflict or BadRequest (nothing to commit)."""
