"""The administration role of the data plane: statistics, verification, garbage collection."""

from __future__ import annotations

import abc

from fabric.util.progress import Progress


class Admin(abc.ABC):
    """Remote planes ignore ``progress`` (the server reports nothing while it works);
    over HTTP fsck and gc need a global admin token (Forbidden otherwise)."""

    @abc.abstractmethod
    def stats(self) -> dict:
        """Sizes and counters of this plane, by name.

        The keys depend on the implementation: a hub reports repositories, chunks,
        packs and bytes; a spoke its cache, traffic to the hub and queued writes.
        Read-only, safe to retry."""

    @abc.abstractmethod
    def fsck(self, deep: bool = True, progress: Progress | None = None) -> dict:
        """Verify everything reachable; ``{"ok", "problems", ...}``.

        ``problems`` lists what is missing or corrupt, in words; problems are
        reported, not raised. ``deep`` decodes and hashes every chunk (else chunks
        are only looked up). A spoke verifies its own cache instead, dropping the
        corrupt frames it finds. Safe to retry."""

    @abc.abstractmethod
    def gc(self, grace: float | None = None, dry_run: bool = False, progress: Progress | None = None) -> dict:
        """Remove what no ref reaches, keeping anything younger than ``grace`` seconds.

        Returns what was (with ``dry_run``: would be) removed. Nothing reachable from
        a ref or a staged entry is removed, nor anything stored less than ``grace``
        seconds ago (None: the hub's default), nor a chunk that
        :meth:`~fabric.plane.exchange.ChunkExchange.missing_chunks` reported present
        less than ``grace / 2`` seconds ago. Raises Corruption, removing
        nothing, if objects are missing or corrupt (run :meth:`fsck`). A spoke
        forwards it to its hub. Safe to retry: a repeat finds less to remove."""
