"""The chunk-exchange role of the data plane: moving chunks and metadata objects
between a hub and its clients (importers, spokes, FUSE).

Chunks are addressed by id (the BLAKE3 hash of their bytes) and travel as
frames (:mod:`fabric.format.frames`). ``durability`` says where the chunks
must be stored: ``hub``, or ``local``, which lets a spoke keep them on its
own disk (pinned until the writes that use them reach the hub); ``None`` is
the plane's default. The hub's store is every level at once.

**Chunks belong to repositories.** A chunk is stored once however many
repositories use it (dedup on the hub's disk), but each repository has its own
set of chunks: those whose bytes were sent for it (a pack or a sink with that
``repo``), those its commits held when ownership was first recorded, and those
shared into it from a repository the caller may read (:meth:`share_chunks`).
With ``repo`` given, the exchange answers about that repository only: a chunk
stored for another repository is "missing" (send its bytes: they are stored
once more only in the index) and cannot be fetched (NotFound, the same answer
as for a chunk that exists nowhere). Entries staged or committed on a branch
may use only chunks of its repository. So a token for repository A learns
nothing about what repository B holds. ``repo=None`` answers about the whole
store: over HTTP it needs read access to every repository (spokes, admins).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not at run time: a client that only lists (`fabric repo list`) need not load the chunker and hashes
    from fabric.format.ingest import ChunkSink


class ChunkExchange(abc.ABC):
    @abc.abstractmethod
    def missing_chunks(
        self, ids: Sequence[bytes], durability: str | None = None, repo: str | None = None
    ) -> list[bytes]:
        """Which of ``ids`` are not stored (at the level ``durability`` asks; with ``repo``,
        not stored for that repository).

        In the order given, without repeats. The hub also refreshes the gc clock of
        the chunks it has, so a writer told a chunk is present has at least half the
        gc grace period to commit a reference to it. Safe to retry."""

    @abc.abstractmethod
    def receive_pack(self, data: bytes, durability: str | None = None, repo: str | None = None) -> tuple[int, int]:
        """Verify and store a pack of frames: ``(chunks, new chunks)``; refused whole if any frame is bad.
        With ``repo`` every chunk of the pack becomes a chunk of that repository.

        Every frame is checked against its checksum and id before anything is kept;
        a bad one raises Corruption (BadRequest over HTTP) and nothing is stored. The
        chunks are durable at the level asked when this returns. Idempotent: sending
        a pack again stores nothing new (``new`` is 0), so a retry is safe."""

    @abc.abstractmethod
    def frames(self, ids: Sequence[bytes], repo: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(id, frame)`` for each id, checksum-verified (with ``repo``: NotFound unless
        every id is a chunk of that repository, checked before the first record).

        A record for every id asked, in no guaranteed order (the hub sends an id
        asked twice once). Callers
        check a frame against its id when decoding it (:func:`fabric.format.frames.decode`).
        Raises NotFound if a chunk is not stored, Corruption if a stored frame fails
        its checksum; the hub raises them only as the iterator advances, and a remote
        plane raises Unavailable if the stream breaks. Read-only, safe to retry."""

    @abc.abstractmethod
    def share_chunks(self, source_repo: str, repo: str, ids: Sequence[bytes]) -> None:
        """Make chunks of ``source_repo`` chunks of ``repo`` too (a copy between
        repositories; over HTTP the caller needs read on the source and write on the
        target). NotFound, and nothing shared, unless every id is a chunk of the source.
        Idempotent."""

    @abc.abstractmethod
    def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        """Stored bytes of metadata objects (commits, trees, ranges, chunk lists) by id.

        Ids that do not exist are absent from the result. Callers verify the
        bytes against their ids (:func:`fabric.engine.metastore.decode_object`).
        Over HTTP it needs read access to every repository (Forbidden otherwise).
        Read-only, safe to retry."""

    @abc.abstractmethod
    def staging_snapshot(
        self, repo: str, branch: str, since_seq: int = 0
    ) -> tuple[str, int, list[tuple[str, bytes | None]]]:
        """``(head, staging_seq, [(path, encoded entry or None)])``: a branch's head and its
        staging area, consistent with each other (for caches of branch reads). With
        ``since_seq`` only rows written after that seq: apply them to an earlier snapshot
        of the same head, provided no branch event came in between (a commit or a
        discard removes rows, and both are branch events).

        Rows are in path order. Raises NotFound if the repository or branch does not
        exist. Read-only, safe to retry."""

    @abc.abstractmethod
    def chunk_sink(self, repo: str | None = None) -> ChunkSink:
        """Where an importer sends new chunks (close it before committing); with ``repo``,
        every chunk offered to it becomes a chunk of that repository.

        The sink takes only chunks not stored yet and stores them in packs as they
        fill; every chunk taken is stored (at the hub; a spoke also caches them) only
        once its ``close`` returns. A sink may be fed from many threads."""
