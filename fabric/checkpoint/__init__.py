"""Atomic training checkpoints in a repository: save a step, list, find the latest, load,
and drop old ones by a retention policy (``fabric.checkpoint``).

**Layout.** The checkpoints of one run live in a repository under ``step-N/``, on the run's
branch ``ckpt.RUN`` (or a branch of the caller's). The branch is only a staging area: every
checkpoint is a commit of its own whose tree holds just its ``step-N/`` and whose parent is
the repository's first (empty) commit, and the tag ``BRANCH.step-N`` marks it complete.

**Atomicity.** A save points the branch at that empty base and drops anything staged there
(:meth:`Checkpoints.begin`), stages the step's files, then commits them with a
compare-and-swap against the base and tags the commit (:meth:`Checkpoints.finish`). For DCP
the trigger is the writer's ``finish``, right after ``.metadata`` is renamed into place
(:class:`~fabric.checkpoint.dcp.CommittingWriter`). :meth:`Checkpoints.list` and
:meth:`Checkpoints.latest` read the repository's tags in one request, never directories, so
a reader sees a step only once it is complete, and reads it pinned to its commit. A writer
killed at any point leaves the previous complete checkpoint the latest: staged files, or a
commit not yet tagged, are never listed; the next save drops them (a save is not resumed —
DCP plans a save in memory — but the chunks it stored are still at the hub, so saving again
sends only their ids).

**Retention.** :class:`Retention` keeps the last N steps, every K-th step, and every step
whose commit also carries a tag of its own; :meth:`Checkpoints.prune` (run after every save
when the run has a policy) deletes the tags of the others. As no checkpoint commit is
another's ancestor, a dropped one is then reachable from nothing, and ``fabric gc`` frees
exactly its chunks that no kept checkpoint shares (unchanged tensors chunk alike and stay).

**Formats.** A mapping of names to bytes is stored one file per name (no torch needed);
anything else goes through torch Distributed Checkpoint (``FsspecWriter``/``FsspecReader``
on ``fabric://``), single-process or on every rank of an initialized process group, rank 0
beginning and finishing. A mount of the repository at a checkpoint's commit serves the same
directory to DCP's ``FileSystemReader``. One writer per run at a time: a second one's
commit fails its compare-and-swap. A plain DCP save into ``step-N/`` through a mount of the
run's branch with ``--commit-checkpoints`` is tagged the same way, so it is listed here too
(its commits form a chain on the branch, so retention does not free its chunks).

:mod:`.names` names the refs, :mod:`.retention` the policy, :mod:`.run` the save protocol
and reads, :mod:`.files` and :mod:`.dcp` the two formats. Importing this package never
imports torch: :mod:`.dcp` is imported only for a DCP save or load.

May import: :mod:`fabric.fsspec`, :mod:`fabric.client` and the layers below them; nothing
in :mod:`fabric` imports this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric.checkpoint.retention import Retention
from fabric.checkpoint.run import Checkpoint, Checkpoints

__all__ = ["Checkpoint", "Checkpoints", "Retention", "latest", "list_checkpoints", "load", "save"]


def save(state_dict: Mapping[str, Any], step: int, *, repo: str, run: str = "default", **kwargs: Any) -> Checkpoint:
    """Save one step of ``run`` in ``repo``; ``kwargs`` are :class:`Checkpoints`' options
    (``server``, ``token``, ``branch``, ``retention``, ``create_repo``, ``copies``,
    ``durability``) and the save's (``overwrite``, DCP writer options)."""
    names = ("branch", "server", "token", "retention", "create_repo", "copies", "durability")
    options = {k: kwargs.pop(k) for k in names if k in kwargs}
    return Checkpoints(repo, run, **options).save(state_dict, step, **kwargs)


def load(*, repo: str, run: str = "default", step: int | None = None, state_dict: Any = None, **options: Any) -> Any:
    """Load step ``step`` (None: the latest) of ``run``, as :meth:`Checkpoints.load` does."""
    return Checkpoints(repo, run, **options).load(step, state_dict)


def list_checkpoints(*, repo: str, run: str = "default", **options: Any) -> list[Checkpoint]:
    """The complete checkpoints of ``run``, oldest first."""
    return Checkpoints(repo, run, **options).list()


def latest(*, repo: str, run: str = "default", **options: Any) -> Checkpoint | None:
    """The newest complete checkpoint of ``run``, or None."""
    return Checkpoints(repo, run, **options).latest()
