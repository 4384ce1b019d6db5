"""The opens a mount tells its server of, so that a spoke learns what a job reads.

A spoke learns a job's working set and order from the files the job opens
(``spoke/learned.py``: the entry requests of mounts and fsspec, tagged with the
job's ``X-Fabric-Job``). An immutable mount has the kernel skip opens and reads
by path, with the entries its listing gave: for a small file it asks the server
nothing, so a job reading small files through a mount taught nothing and got
nothing predicted. A mount that reads for a job (``FABRIC_JOB`` in its
environment) therefore asks for the entry of each file at its first read in the
session (its open, as far as the mount can tell), from one background thread, in
the order the reads came: the read itself never waits for it. It is advice: at most
:data:`QUEUED` reports wait (more are dropped), at most :data:`MAX_PATHS` files
are reported per session, and a report that fails is not retried.
"""

from __future__ import annotations

from fabric.client.advice import Advice
from fabric.plane.dataplane import DataPlane

#: Reports waiting to be sent, at most.
QUEUED = 4096
#: Files reported in one mount session, at most (a set of their paths is kept).
MAX_PATHS = 1_000_000


class OpenReports(Advice[str]):
    """Tells ``plane`` (the server, not retried) of the first open of each file of ``repo@commit``."""

    def __init__(self, plane: DataPlane, repo: str, commit: str) -> None:
        self._plane, self._repo, self._commit = plane, repo, commit
        self._told: set[str] = set()
        super().__init__(QUEUED, "fuse-open-reports")

    def opened(self, path: str) -> None:
        if path in self._told or len(self._told) >= MAX_PATHS:
            return
        self._told.add(path)
        self.offer(path)

    def send(self, path: str) -> None:
        self._plane.stat_chunks(self._repo, self._commit, path)
