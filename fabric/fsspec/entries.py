"""The entries of files at a commit id, kept by a file system: a commit never changes, so
a dataset read epoch after epoch by commit (``fabric.torch`` pins its ref) asks the server
for each file's chunk list once, not once per read."""

from __future__ import annotations

import threading
from collections import OrderedDict

from fabric.format.model import Entry

#: Chunk references kept in all (an entry counts one plus its chunks): about 40 MB at most
#: (a chunk reference of a decoded entry takes about 160 bytes of Python objects).
MAX_CHUNK_REFS = 250_000


class CommitEntries:
    """A bounded LRU of ``(repo, commit, path) -> Entry`` for entries read at a commit id.
    Pickles empty (a copy for another process starts without the entries)."""

    def __init__(self, max_refs: int = MAX_CHUNK_REFS) -> None:
        self.max_refs = max_refs
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, str], Entry] = OrderedDict()
        self._refs = 0

    def __reduce__(self) -> tuple[type[CommitEntries], tuple[int]]:
        return CommitEntries, (self.max_refs,)

    def get(self, repo: str, commit: str, path: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get((repo, commit, path))
            if entry is not None:
                self._entries.move_to_end((repo, commit, path))
            return entry

    def put(self, repo: str, commit: str, path: str, entry: Entry) -> None:
        cost = 1 + len(entry.chunks)
        if cost > self.max_refs:
            return
        with self._lock:
            old = self._entries.pop((repo, commit, path), None)
            if old is not None:
                self._refs -= 1 + len(old.chunks)
            self._entries[(repo, commit, path)] = entry
            self._refs += cost
            while self._refs > self.max_refs:
                _, dropped = self._entries.popitem(last=False)
                self._refs -= 1 + len(dropped.chunks)
