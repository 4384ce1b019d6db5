"""Hints: the order a job will read files in, sent to the server so a spoke fetches them
ahead of the reads (``POST /api/v1/repos/{repo}/hints``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from fabric.client.http import HttpPlane
from fabric.fsspec import FabricFileSystem

log = logging.getLogger("fabric.torch")


class Hinter:
    """Sends a dataset's read orders; a failure is logged (once per hinter) and never raised,
    so a server that refuses hints slows a training job down but does not stop it."""

    def __init__(self) -> None:
        self._warned = False

    def send(self, fs: FabricFileSystem, paths: Sequence[str]) -> dict[str, Any] | None:
        """Replace the job's order with ``paths`` (``REPO@REF/key``); the server's summed answer
        (a long order goes in several requests: :meth:`~fabric.client.http.HttpPlane.hint`), or
        None if it failed."""
        try:
            return fs.hint(list(paths))
        except Exception as exc:  # noqa: BLE001 - a hint is advice: reads go on without it
            if not self._warned:
                self._warned = True
                log.warning("fabric.torch: the server did not take a read-order hint (reads go on without prefetch): %s", exc)
            return None


def hint(
    server: str,
    repo: str,
    ref: str,
    paths: Sequence[str],
    token: str | None = None,
    job: str | None = None,
) -> dict[str, Any]:
    """Tell ``server`` (a spoke, usually) that job ``job`` (default ``$FABRIC_JOB``) will
    read the files ``paths`` of ``repo@ref`` in this order, replacing the order it had; a
    file may appear more than once. Returns the server's answer (``paths``, ``bytes``,
    ``window_bytes``: how far ahead the spoke fetches); a long order goes in several
    requests. Errors are raised: ValueError without a job id, :mod:`fabric.errors` for a refusal (a path that is not a file at
    ``ref``, a token that cannot read ``repo``).

    For a job that reads through ``fabric mount SERVER REPO@REF MOUNTPOINT``: a path under
    the mount point is the repository path after it — ``os.path.relpath(p, MOUNTPOINT)``
    gives ``train/0001.bin`` for ``MOUNTPOINT/train/0001.bin`` — and the job id must be the
    one the mount sends, so start the mount with the same ``FABRIC_JOB`` in its
    environment, e.g.::

        order = [os.path.relpath(dataset.files[i], "/mnt/d") for i in sampler]
        fabric.torch.hint("http://spoke:8700", "datasets", "v1", order, job=os.environ["FABRIC_JOB"])
    """
    job = job or os.environ.get("FABRIC_JOB")
    if not job:
        raise ValueError("a hint names a job: pass job= or set FABRIC_JOB (the id the reading process sends)")
    plane = HttpPlane(server, token if token is not None else os.environ.get("FABRIC_TOKEN"), job=job)
    try:
        return plane.hint(repo, ref, list(paths), job)
    finally:
        plane.close()
