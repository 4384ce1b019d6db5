"""``fabric://`` beside its spoke (``spoke_cache=``): chunks read from the spoke's cache files.

A loader or a restore on the spoke's own machine (a node's spoke, as the CSI driver runs
one) reads the chunks the spoke holds from its files, as ``fabric mount --spoke-cache`` does
(:mod:`fabric.client.spoke_files`), instead of having the spoke read and send them over HTTP;
what they lack still comes from the spoke. The reads are reported to the spoke for each
repository (:mod:`fabric.client.local_reads`), so it counts them as reads of its cache and
as the job's. A batch's files are read through the page cache, all asked of the disk at once
(:meth:`~fabric.client.spoke_files.SpokeFiles.read_many`).
"""

from __future__ import annotations

import os

from fabric.client.http import HttpPlane
from fabric.client.local_reads import LocalReadReports
from fabric.client.spoke_files import SpokeFiles


class SpokeBeside:
    def __init__(self, cache_dir: str, plane: HttpPlane) -> None:
        """``cache_dir``: the spoke's ``--cache`` directory (BadRequest unless it is one)."""
        SpokeFiles(cache_dir)
        self.cache_dir = cache_dir
        self._plane = plane
        self._readers: dict[str, SpokeFiles] = {}
        self._pid = os.getpid()

    def files(self, repo: str) -> SpokeFiles:
        """The reader of the spoke's files whose reads are reported as reads of ``repo``. A
        process forked from the one that made it (a DataLoader worker) gets readers of its
        own: the reports' thread did not come with the fork."""
        if self._pid != os.getpid():
            self._readers, self._pid = {}, os.getpid()
        reader = self._readers.get(repo)
        if reader is None:
            reports = LocalReadReports(self._plane, repo)
            reader = self._readers[repo] = SpokeFiles(self.cache_dir, reports.read)
        return reader
