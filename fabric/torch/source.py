"""Where a dataset reads from: a server, a token and a job id, and the ``fabric://`` file
system each process opens for them on first use (a DataLoader worker opens its own)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from fabric.fsspec import FabricFileSystem
from fabric.fsspec.entries import CommitEntries
from fabric.fsspec.locations import parse

PROTOCOL = "fabric://"


class Source:
    """``server`` (default ``$FABRIC_SERVER``), ``token`` (default ``$FABRIC_TOKEN``) and the
    ``job`` every request names. Pickles without its connection: each process reconnects.

    The file systems of a process and of the DataLoader workers it forks share the entries
    kept at commit ids (the listing of :meth:`files` gives those of small files, chunk lists
    and all), so a worker reads a small file without asking for its entry first. A pickled
    source (a worker started by ``spawn``) starts without them."""

    def __init__(self, server: str | None, token: str | None, job: str) -> None:
        self.server = server or os.environ.get("FABRIC_SERVER")
        if not self.server:
            raise ValueError("no server: pass server=URL or set FABRIC_SERVER")
        self.token = token if token is not None else os.environ.get("FABRIC_TOKEN")
        self.job = job
        self._fs: FabricFileSystem | None = None
        self._pid = 0
        self._entries = CommitEntries()

    def with_job(self, job: str) -> Source:
        if job == self.job:
            return self
        other = Source(self.server, self.token, job)
        other._entries = self._entries
        return other

    @property
    def fs(self) -> FabricFileSystem:
        """This process's file system (a forked worker does not share its parent's connections)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs = FabricFileSystem(server=self.server, token=self.token, job=self.job, entries=self._entries,
                                        skip_instance_cache=True)
            self._pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": 0}

    def pin(self, urls: Iterable[str]) -> list[tuple[str, str]]:
        """``(REPO@COMMIT, key)`` of each URL (``fabric://REPO@REF/path``, ``REPO@REF/path`` or
        ``REPO/path``): each ref resolved once, so every process and epoch reads one version.
        ValueError for a malformed URL, FileNotFoundError for an unknown repository or ref."""
        commits: dict[tuple[str, str | None], str] = {}
        out = []
        for url in urls:
            path = url.removeprefix(PROTOCOL).strip("/")
            loc = parse(path)
            if loc is None:
                raise ValueError(f"{url!r}: name a repository (fabric://REPO@REF/prefix)")
            if (loc.repo, loc.ref) not in commits:
                commits[loc.repo, loc.ref] = self.fs.pin(path).partition("/")[0]  # REPO@COMMIT
            out.append((commits[loc.repo, loc.ref], loc.key))
        return out

    def files(self, url: str, suffixes: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """``(path, size)`` of every file under ``url`` (sorted by path; only those ending in
        one of ``suffixes`` when given), at the commit its ref names now. FileNotFoundError if none."""
        [(root, key)] = self.pin([url])
        ends = (suffixes,) if isinstance(suffixes, str) else tuple(suffixes) if suffixes is not None else None
        found = self.fs.find(f"{root}/{key}" if key else root, detail=True)
        out = [(name, info["size"]) for name, info in found.items() if info["type"] == "file" and (ends is None or name.endswith(ends))]
        if not out:
            which = f" ending in {', '.join(ends)}" if ends else ""
            raise FileNotFoundError(f"{url}: no files{which} under this prefix")
        return out
