"""The writes role of the data plane: a branch's uncommitted changes (its staging area).

Writes are staged on a branch: visible to reads of that branch at once, and
part of history only after a commit (:class:`~fabric.plane.history.History`).

``durability`` says where a write must be stored before the call returns:
``hub`` (at the hub) or ``local`` (a spoke may queue it on its own disk and
push it when the hub is reachable; its readers see it at once, the hub's once
it is pushed); ``None`` is the plane's default. The hub meets every level. A
spoke raises BadRequest for any other value, and Unavailable for a ``hub``
write while the hub is unreachable.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import BinaryIO

from fabric.format.model import Entry


class Writes(abc.ABC):
    @abc.abstractmethod
    def put_object(
        self,
        repo: str,
        branch: str,
        path: str,
        stream: BinaryIO,
        mode: int = 0o644,
        mtime_ns: int | None = None,
        meta: Mapping[str, str] | None = None,
        durability: str | None = None,
    ) -> Entry:
        """Store a stream as a file on a branch (uncommitted, visible to branch reads at once).

        ``durability``: ``hub`` (stored at the hub before this returns) or ``local``
        (a spoke may queue it on its own disk); ``None`` is the plane's default.

        Returns the file's entry (a remote plane's has no chunk list); ``mtime_ns``
        defaults to the time of the call. Raises NotFound if the repository or branch
        does not exist, InvalidPath for a bad path. The stream is read to its end:
        to retry, pass a fresh one. A repeat stores the same content again (chunks
        are deduplicated) and the last write of a path wins, so a retry is safe."""

    @abc.abstractmethod
    def stage(
        self, repo: str, branch: str, changes: Mapping[str, Entry | None], durability: str | None = None
    ) -> int | None:
        """Stage entries whose chunks are stored (``None`` deletes), durable at ``durability``
        (as in :meth:`put_object`). Returns the branch's staging seq that holds them (see
        :meth:`~fabric.plane.exchange.ChunkExchange.staging_snapshot`), or None where the
        write is not at the hub yet.

        All changes are staged together or none is. Raises NotFound if the repository
        or branch does not exist, InvalidPath for a bad path, BadRequest if a chunk an
        entry needs is not stored (for ``local``: neither at the spoke nor known to be
        at the hub). Staging the same changes again leaves the same staging area (at
        a new seq): safe to retry."""

    def stage_if(
        self,
        repo: str,
        branch: str,
        changes: Mapping[str, Entry | None],
        check: Callable[[], None],
        durability: str | None = None,
    ) -> int | None:
        """:meth:`stage` if ``check()`` returns (it raises to stage nothing), e.g. a condition
        on what the branch holds, read through this plane.

        A plane that can runs the check and the write atomically with every other write
        of the branch (the hub: in one catalog transaction, across hub processes and
        protocols). This default checks, then stages: the caller serializes its own
        conditional writes."""
        check()
        return self.stage(repo, branch, changes, durability)

    @abc.abstractmethod
    def delete_object(self, repo: str, branch: str, path: str, durability: str | None = None) -> None:
        """Stage the deletion of the file at ``path`` (durable as in :meth:`put_object`).

        Raises NotFound if nothing is at ``path`` as the branch reads it (or the
        repository or branch does not exist), BadRequest if ``branch`` is not a
        branch, InvalidPath for a bad path. Not idempotent: a retry of a call that
        did land answers NotFound."""

    @abc.abstractmethod
    def discard(self, repo: str, branch: str) -> None:
        """Drop a branch's uncommitted changes.

        Raises NotFound if the repository or branch does not exist, Conflict if the
        branch moved meanwhile. Idempotent, safe to retry. A spoke's queued ``local``
        writes that have not reached the hub are not dropped: they land later."""
