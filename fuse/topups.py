"""Top-up hints: the files a reader skipping forward through a directory may open next.

A reader that goes through a directory's files in name order but opens only some of
them is most often a sync tool reading the files that changed (``rsync -a`` of a new
version onto a copy of the old one). Each such open is cold, and through a spoke it
costs a round trip to the hub for the few chunks that changed. The sibling readahead
(``fuse/read_path.py``) does not start, as the opens do not follow each other, and must
not: fetching every file ahead would read the whole tree for a reader that skips most of
it. The mount tells its server the files ahead instead, as a top-up hint
(``DataPlane.hint(..., top_up=True)``): a spoke fetches only what it lacks of the files it
holds in part (``spoke/topup.py``), which are the files that changed.

It is advice (``fabric/client/advice.py``), sent from one background thread so that no open waits
for it: at most :data:`QUEUED` hints wait, and a server that fetches nothing ahead (a hub
answers ``window_bytes: 0``) is not told again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from fabric.client.advice import Advice
from fabric.plane.dataplane import DataPlane

#: Hints waiting to be sent, at most.
QUEUED = 16


def new_scan_job() -> str:
    """The job id of a mount's top-up hints (its own, so they never replace a loader's order)."""
    return f"mount-scan:{uuid.uuid4().hex[:16]}"


class TopUps(Advice[list[str]]):
    """Sends top-up hints of files of ``repo@ref`` to ``plane`` (the server, not retried)."""

    def __init__(self, plane: DataPlane, repo: str, ref: str, job: str | None = None) -> None:
        self._plane, self._repo, self._ref = plane, repo, ref
        self.job = job or new_scan_job()
        self._useless = False  # the server fetches nothing ahead
        super().__init__(QUEUED, "fuse-top-ups")

    def ahead(self, paths: Sequence[str]) -> None:
        """Tell the server, in the background, that these files may be opened next."""
        if not self._useless and paths:
            self.offer(list(paths))

    def send(self, paths: list[str]) -> None:
        if not self._useless:
            reply = self._plane.hint(self._repo, self._ref, paths, self.job, top_up=True)
            self._useless = not reply.get("window_bytes")
