"""Background work of a ``--rw`` mount: staging files whose staging failed at close, and
commits (every ``--commit-interval``, and at unmount with ``--commit-on-unmount``)."""

from __future__ import annotations

import logging
import threading

from fabric.errors import BadRequest
from fuse.state import MountState
from fuse.write_path import WritePath

log = logging.getLogger("fabric.fuse")

#: How often files that could not be staged at close are tried again.
FLUSH_RETRY = 5.0


class Committer:
    """The mount's background threads, and what it stages and commits when it ends."""

    def __init__(self, state: MountState, writes: WritePath) -> None:
        self.state = state
        self.writes = writes
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the background threads a writable mount needs (at INIT)."""
        st = self.state
        if st.writable:
            threading.Thread(target=self._flush_loop, name="fabric-flush", daemon=True).start()
        if st.writable and st.cfg.commit_interval > 0:
            threading.Thread(target=self._commit_loop, name="fabric-commit", daemon=True).start()

    def stop(self) -> None:
        """At unmount: stop the threads, stage every file, and commit if asked to."""
        self._stop.set()
        if self.state.writable:
            failed = self.flush_all()
            if self.state.cfg.commit_on_unmount:
                try:
                    if failed:
                        raise RuntimeError(f"{len(failed)} file(s) could not be staged, first {failed[0]}")
                    self.commit_now("unmount")
                except Exception as exc:  # noqa: BLE001 - the changes stay staged on the branch
                    log.error("commit at unmount failed (changes stay staged on the branch): %s", exc)

    def flush_all(self, closed_only: bool = False) -> list[str]:
        """Stage every file with unstaged changes (``closed_only``: not those still open for
        writing, which may be half written); return the paths that failed."""
        failed = []
        for wf in list(self.state.files.values()):
            if closed_only and wf.opens > 0:
                continue
            try:
                self.writes.sync(wf)
            except Exception as exc:  # noqa: BLE001
                log.error("cannot stage %s: %s", wf.path, exc)
                failed.append(wf.path or "?")
            self.writes.maybe_drop(wf)
        return failed

    def commit_now(self, why: str) -> str | None:
        """Commit what is staged on the branch; the commit id, or None if nothing was staged."""
        st = self.state
        assert st.branch is not None
        try:
            c = st.plane.commit(st.repo, st.branch, f"{st.cfg.commit_message} ({why})")
        except BadRequest as exc:
            if "nothing to commit" in exc.message:
                return None
            raise
        log.info("committed %s on %s@%s (%s)", c.id[:12], st.repo, st.branch, why)
        return c.id

    def _flush_loop(self) -> None:
        """Stage files whose staging failed at close (server away) once the server is back."""
        while not self._stop.wait(FLUSH_RETRY):
            for wf in list(self.state.files.values()):
                if wf.opens == 0 and wf.dirty and not wf.unlinked:
                    try:
                        self.writes.sync(wf)
                        log.info("staged %s after an earlier failure", wf.path)
                    except Exception as exc:  # noqa: BLE001 - next round
                        log.debug("still cannot stage %s: %s", wf.path, exc)
                    self.writes.maybe_drop(wf)

    def _commit_loop(self) -> None:
        while not self._stop.wait(self.state.cfg.commit_interval):
            try:
                self.flush_all(closed_only=True)  # files still being written wait for their close
                self.commit_now("interval")
            except Exception as exc:  # noqa: BLE001 - try again next interval
                log.error("interval commit failed: %s", exc)
