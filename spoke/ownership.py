"""Which cached chunks this spoke knows to be chunks of which repository.

The spoke's cache holds chunks of every repository it serves, fetched with its
own token; its callers hold tokens for some repositories only. A caller who
names repository R may fetch, or build on, only chunks of R
(:mod:`fabric.plane.exchange`), so the spoke answers from what it has learnt:
chunks uploaded to it for R, chunks of files of R it has listed, and what the
hub said when asked (one batched question per unknown set). The knowledge is
kept in memory, bounded; what is forgotten is asked again.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence

from fabric.errors import NotFound

#: How many (repository, chunk) pairs are remembered (~100 bytes each).
DEFAULT_LIMIT = 500_000

#: ``ask(repo, ids) -> the ids that are not chunks of repo`` (the hub's ``missing_chunks``).
AskHub = Callable[[str, Sequence[bytes]], list[bytes]]


class ChunkOwnership:
    def __init__(self, ask_hub: AskHub, limit: int = DEFAULT_LIMIT) -> None:
        self._ask_hub = ask_hub
        self._limit = limit
        self._known: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(repo: str, cid: bytes) -> bytes:
        return hashlib.blake2b(repo.encode() + b"\0" + cid, digest_size=16).digest()

    def learn(self, repo: str, ids: Iterable[bytes]) -> None:
        """Remember ``ids`` as chunks of ``repo``."""
        with self._lock:
            for cid in ids:
                key = self._key(repo, cid)
                self._known[key] = None
                self._known.move_to_end(key)
            while len(self._known) > self._limit:
                self._known.popitem(last=False)

    def unknown(self, repo: str, ids: Iterable[bytes]) -> list[bytes]:
        """The ids (without repeats) not known to be chunks of ``repo``."""
        with self._lock:
            return [cid for cid in dict.fromkeys(ids) if self._key(repo, cid) not in self._known]

    def require(self, repo: str, ids: Sequence[bytes]) -> None:
        """NotFound unless every id is a chunk of ``repo`` (asking the hub about those not
        known here; Unavailable if it must be asked and cannot be)."""
        unknown = self.unknown(repo, ids)
        if not unknown:
            return
        foreign = self._ask_hub(repo, unknown)
        if foreign:
            raise NotFound(f"chunk {foreign[0].hex()} is not in repository {repo!r} ({len(foreign)} such)")
        self.learn(repo, unknown)
