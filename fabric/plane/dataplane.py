"""The data plane: the one interface between storage and every protocol.

REST, S3, FUSE, fsspec and the CLI are written against :class:`DataPlane`.
The hub implements it with the versioning engine (:class:`fabric.engine.engine.Engine`),
a client implements it over HTTP (:class:`fabric.client.http.HttpPlane`), and a
spoke implements it as a cache in front of a hub. Errors are the
:mod:`fabric.errors` hierarchy on every implementation.

Refs are expressions (``main``, ``v1``, a commit id or prefix, ``main~2``).
Reads at a branch see its uncommitted changes; reads at a tag or commit see
committed data only.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO

from fabric.format.ingest import ChunkSink
from fabric.format.listing import Change, Listing
from fabric.format.model import Commit, Entry
from fabric.util.progress import Progress


class DataPlane(abc.ABC):
    # -- repositories --------------------------------------------------------
    @abc.abstractmethod
    def create_repo(self, name: str, default_branch: str = "main") -> dict:
        """Create a repository with one empty commit on its default branch. Conflict if it exists."""

    @abc.abstractmethod
    def get_repo(self, name: str) -> dict:
        """``{name, default_branch, created}``; NotFound if absent."""

    @abc.abstractmethod
    def list_repos(self) -> list[dict]: ...

    @abc.abstractmethod
    def delete_repo(self, name: str) -> None: ...

    # -- refs ----------------------------------------------------------------
    @abc.abstractmethod
    def resolve_commit(self, repo: str, ref: str) -> str:
        """The commit id a ref expression points at now."""

    @abc.abstractmethod
    def list_branches(self, repo: str) -> list[dict]: ...

    @abc.abstractmethod
    def create_branch(self, repo: str, name: str, source: str) -> dict: ...

    @abc.abstractmethod
    def delete_branch(self, repo: str, name: str) -> None: ...

    @abc.abstractmethod
    def reset_branch(self, repo: str, name: str, ref: str) -> dict:
        """Point a branch at ``ref`` and drop its uncommitted changes."""

    @abc.abstractmethod
    def list_tags(self, repo: str) -> list[dict]: ...

    @abc.abstractmethod
    def create_tag(self, repo: str, name: str, ref: str) -> dict: ...

    @abc.abstractmethod
    def delete_tag(self, repo: str, name: str) -> None: ...

    # -- commits -------------------------------------------------------------
    @abc.abstractmethod
    def get_commit(self, repo: str, commit_id: str) -> Commit: ...

    @abc.abstractmethod
    def log(self, repo: str, ref: str, path: str | None = None, limit: int = 100, after: str | None = None) -> list[Commit]:
        """Newest first; ``path`` keeps commits that changed it; ``after`` continues a page."""

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
        """Fold the branch's staging into a commit; Conflict if the head is not ``expected_head``."""

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
        """Commit explicit entries (``None`` deletes) whose chunks are stored, bypassing staging."""

    @abc.abstractmethod
    def diff(self, repo: str, left: str, right: str, prefix: str = "") -> Iterator[Change]: ...

    @abc.abstractmethod
    def uncommitted(self, repo: str, branch: str, prefix: str = "") -> Iterator[Change]: ...

    @abc.abstractmethod
    def merge(
        self, repo: str, source: str, dest: str, strategy: str | None = None, message: str | None = None, author: str | None = None
    ) -> Commit:
        """Three-way merge into branch ``dest``; MergeConflict lists conflicting paths."""

    @abc.abstractmethod
    def revert(self, repo: str, branch: str, commit_ref: str, parent: int = 1, author: str | None = None) -> Commit: ...

    # -- objects -------------------------------------------------------------
    @abc.abstractmethod
    def stat(self, repo: str, ref: str, path: str) -> Entry:
        """The entry at ``path``; its chunk list may be absent (remote planes)."""

    @abc.abstractmethod
    def stat_chunks(self, repo: str, ref: str, path: str) -> Entry:
        """The entry at ``path`` with its whole chunk list inline, for readers that fetch
        chunks themselves (FUSE, spokes) through :meth:`frames`."""

    @abc.abstractmethod
    def list(self, repo: str, ref: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> Listing:
        """One page of paths under ``prefix`` (S3-style grouping with ``delimiter='/'``)."""

    def walk(self, repo: str, ref: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
        """Every path under ``prefix``, all pages."""
        after = ""
        while True:
            page = self.list(repo, ref, prefix, "", after, 1000)
            yield from page.entries
            if page.next_after is None:
                return
            after = page.next_after

    @abc.abstractmethod
    def read_stream(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The bytes of a file, streamed; RangeNotSatisfiable outside the file."""

    def open_file(
        self, repo: str, ref: str, path: str, entry: Entry | None = None, offset: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        """Like :meth:`read_stream`; ``entry`` (from :meth:`stat`/:meth:`walk` at the same
        ref) pins the version read and may spare a lookup."""
        return self.read_stream(repo, ref, path, offset, length)

    def is_stale(self, repo: str, ref: str) -> bool:
        """Whether reads of ``ref`` may be behind the hub (a spoke cut off from it)."""
        return False

    def read(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> bytes:
        return b"".join(self.read_stream(repo, ref, path, offset, length))

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
        (a spoke may queue it on its own disk); ``None`` is the plane's default."""

    @abc.abstractmethod
    def stage(
        self, repo: str, branch: str, changes: Mapping[str, Entry | None], durability: str | None = None
    ) -> int | None:
        """Stage entries whose chunks are stored (``None`` deletes), durable at ``durability``
        (as in :meth:`put_object`). Returns the branch's staging seq that holds them (see
        :meth:`staging_snapshot`), or None where the write is not at the hub yet."""

    @abc.abstractmethod
    def delete_object(self, repo: str, branch: str, path: str, durability: str | None = None) -> None: ...

    @abc.abstractmethod
    def discard(self, repo: str, branch: str) -> None:
        """Drop a branch's uncommitted changes."""

    # -- chunk exchange ------------------------------------------------------
    # ``durability`` says where the chunks must be stored: ``local`` lets a spoke keep
    # them on its own disk (pinned until the writes that use them reach the hub).
    @abc.abstractmethod
    def missing_chunks(self, ids: Sequence[bytes], durability: str | None = None) -> list[bytes]:
        """Which of ``ids`` are not stored (at the level ``durability`` asks)."""

    @abc.abstractmethod
    def receive_pack(self, data: bytes, durability: str | None = None) -> tuple[int, int]:
        """Verify and store a pack of frames: ``(chunks, new chunks)``; refused whole if any frame is bad."""

    @abc.abstractmethod
    def frames(self, ids: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """``(id, frame)`` for each id, checksum-verified."""

    @abc.abstractmethod
    def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        """Stored bytes of metadata objects (commits, trees, ranges, chunk lists) by id.

        Ids that do not exist are absent from the result. Callers verify the
        bytes against their ids (:func:`fabric.engine.metastore.decode_object`)."""

    @abc.abstractmethod
    def staging_snapshot(
        self, repo: str, branch: str, since_seq: int = 0
    ) -> tuple[str, int, list[tuple[str, bytes | None]]]:
        """``(head, staging_seq, [(path, encoded entry or None)])``: a branch's head and its
        staging area, consistent with each other (for caches of branch reads). With
        ``since_seq`` only rows written after that seq: apply them to an earlier snapshot
        of the same head, provided no branch event came in between (a commit or a
        discard removes rows, and both are branch events)."""

    @abc.abstractmethod
    def chunk_sink(self) -> ChunkSink:
        """Where an importer sends new chunks (close it before committing)."""

    # -- administration ------------------------------------------------------
    @abc.abstractmethod
    def stats(self) -> dict: ...

    @abc.abstractmethod
    def fsck(self, deep: bool = True, progress: Progress | None = None) -> dict:
        """Verify everything reachable; ``{"ok", "problems", ...}``."""

    @abc.abstractmethod
    def gc(self, grace: float | None = None, dry_run: bool = False, progress: Progress | None = None) -> dict:
        """Remove what no ref reaches, keeping anything younger than ``grace`` seconds."""

    # -- S3 bucket bindings --------------------------------------------------
    # A bucket name bound to one branch or tag of a repository; the S3 gateway
    # serves it with plain keys. Every other bucket name is a repository whose
    # keys are REF/PATH. Bindings are dicts ``{name, repo, ref, created,
    # created_by_s3}``.
    @abc.abstractmethod
    def list_buckets(self) -> list[dict]:
        """Every bucket binding, by name."""

    @abc.abstractmethod
    def get_bucket(self, name: str) -> dict:
        """The binding of bucket ``name``; NotFound if the name is not bound."""

    @abc.abstractmethod
    def create_bucket(self, name: str, repo: str, ref: str, created_by_s3: bool = False) -> dict:
        """Bind bucket ``name`` to a branch or tag of ``repo``; Conflict if the name is taken
        (by a binding, or by another repository)."""

    @abc.abstractmethod
    def delete_bucket(self, name: str) -> None:
        """Remove a binding (the repository stays); NotFound if the name is not bound."""
