"""Committing what S3 clients write: S3 has no commits, so the gateway can make them."""

from __future__ import annotations

import logging
import threading

from fabric.errors import BadRequest, FabricError
from fabric.plane.dataplane import DataPlane

log = logging.getLogger("fabric.s3")


class AutoCommitter:
    """Commits branches written through S3: after each write, or every ``interval`` seconds."""

    def __init__(self, plane: DataPlane, interval: float) -> None:
        self.plane = plane
        self.interval = interval
        self._dirty: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval > 0:
            self._thread = threading.Thread(target=self._loop, name="s3-autocommit", daemon=True)
            self._thread.start()

    def wrote(self, repo: str, branch: str, who: str) -> None:
        if self.interval <= 0:
            self._commit(repo, branch, who)
            return
        with self._lock:
            self._dirty[(repo, branch)] = who

    def _commit(self, repo: str, branch: str, who: str) -> None:
        try:
            self.plane.commit(repo, branch, "S3 writes", author=who, meta={"source": "s3-gateway"})
        except BadRequest:
            pass  # nothing to commit
        except FabricError as exc:
            log.warning("autocommit of %s@%s failed: %s", repo, branch, exc.message)

    def flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        for (repo, branch), who in dirty.items():
            self._commit(repo, branch, who)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
