"""``fabric mount --rw --commit-checkpoints``: a torch Distributed Checkpoint saved through the
mount becomes a commit of its own, and a tag, once it is complete.

DCP's ``FileSystemWriter`` ends a save by renaming ``DIR/.metadata.tmp`` to ``DIR/.metadata``,
after every rank has written its shards, and no reader loads a DCP checkpoint without that
file. The mount takes that rename as the end of the checkpoint in ``DIR``. A thread of its own
then:

1. waits for the files under ``DIR`` still open to be released (the kernel releases a file
   after its ``close`` returns; at most :data:`RELEASE_WAIT` seconds);
2. stages every file under ``DIR`` still local (with ``--writeback``, the files parked
   there), at the mount's ``--durability``;
3. commits the branch, with the step (the last number in ``DIR``'s name) and the format in
   the commit's metadata, as :mod:`fabric.checkpoint` does. It commits even if something else
   (``--commit-interval``, ``fabric commit``) committed the files already, so each checkpoint
   has a commit of its own;
4. for a directory ``step-N`` at the branch's root (the helper's layout), tags that commit
   ``BRANCH.step-N``. ``fabric.checkpoint``'s ``list``/``latest``/``load`` for the branch then
   find it, as does ``fabric checkpoints``; a save of the same step again moves the tag.

The rename returns before any of this: training goes on while the thread works. A step that
fails (the server away) is tried again every :data:`RETRY_SECONDS` until it succeeds or the
mount ends; at unmount, pending checkpoints are tried once more. With ``--writeback``, a mount
killed before it staged a checkpoint's ``.metadata`` leaves it parked in its journal; the
mount that takes the journal over commits that checkpoint when it starts; one killed after
staging it, but before the commit, leaves ``.metadata`` among the branch's uncommitted changes,
and the next mount with ``--commit-checkpoints`` commits that checkpoint when it starts.

What readers see: a tag appears only once every file of its checkpoint is in the commit it
names. A save killed before its final rename is never tagged; its staged files go into the
next commit of the branch, as any staged file does, but no tag names them complete.

Unlike the helper's, these commits form a chain on the mounted branch: a checkpoint whose
tag retention deletes stays reachable from the commits after it, so ``fabric gc`` does not
free its chunks. The helper (a commit per step on the run's empty base) is the way to save
when old checkpoints must free their space.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import time

from fabric import errors
from fabric.format import checkpoint_names as names
from fuse.state import MountState
from fuse.write_path import WritePath

log = logging.getLogger("fabric.fuse")

#: DCP's last file: its rename into place ends a save.
METADATA = ".metadata"
#: How long the files of a finished checkpoint may stay open (their release is in flight).
RELEASE_WAIT = 30.0
#: How often a checkpoint that could not be committed is tried again.
RETRY_SECONDS = 5.0
_LAST_NUMBER = re.compile(r"([0-9]+)(?!.*[0-9])")


def checkpoint_step(directory: str) -> int | None:
    """The step of a checkpoint directory: the last number in its name (``step-900``,
    ``checkpoint-900``, ``global_step900``), or None."""
    m = _LAST_NUMBER.search(posixpath.basename(directory))
    if m is None:
        return None
    step = int(m.group(1))
    return step if step < names.MAX_STEP else None


def step_tag(branch: str, directory: str) -> str | None:
    """The tag that marks ``directory`` a complete checkpoint of ``branch`` for
    :mod:`fabric.checkpoint`: only ``step-N`` at the branch's root, on a branch the helper
    accepts; None otherwise."""
    step = checkpoint_step(directory)
    if step is None or directory != names.step_dir(step):
        return None
    try:
        names.run_branch("", branch)
    except ValueError:
        return None
    return names.step_tag(branch, step)


class CheckpointCommits:
    """The checkpoints whose final rename the mount saw, and the thread that commits them."""

    def __init__(self, state: MountState, writes: WritePath) -> None:
        self.state = state
        self.writes = writes
        self._pending: dict[str, None] = {}  # directories, in the order their saves ended
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.committed = 0
        self.failures = 0
        self.last_tag: str | None = None

    def start(self) -> None:
        """Start the thread (at INIT). A ``.metadata`` this mount took over from the write-back
        journal of one killed before it staged the file marks a checkpoint that mount never
        committed: it is committed now."""
        for p, wf in list(self.state.files.items()):
            if posixpath.basename(p) == METADATA and wf.dirty:
                self._pending[posixpath.dirname(p)] = None
        self._thread = threading.Thread(target=self._loop, name="fabric-checkpoints", daemon=True)
        self._thread.start()

    def renamed(self, dst: str) -> None:
        """A rename through the mount landed at ``dst``: the end of a DCP save if it is ``.metadata``."""
        if posixpath.basename(dst) != METADATA:
            return
        with self._cond:
            self._pending[posixpath.dirname(dst)] = None
            self._cond.notify()

    def stop(self) -> None:
        """At unmount, before the files are flushed: stop the thread; pending checkpoints are tried once more."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        for directory in self._take():
            self._try(directory)

    def snapshot(self) -> dict:
        with self._cond:
            pending = len(self._pending)
        return {"committed": self.committed, "pending": pending, "failures": self.failures, "last_tag": self.last_tag}

    def _take(self) -> list[str]:
        with self._cond:
            taken = list(self._pending)
            self._pending.clear()
            return taken

    def _loop(self) -> None:
        self._find_uncommitted()
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            failed = [d for d in self._take() if not self._try(d)]
            if failed:
                with self._cond:
                    for d in failed:
                        self._pending.setdefault(d, None)
                    self._cond.wait(RETRY_SECONDS)

    def _find_uncommitted(self) -> None:
        """A ``.metadata`` staged on the branch and not committed ends a save whose commit a
        mount killed after staging it never made: it is committed now (one listing of the
        branch's uncommitted changes, at the start)."""
        st = self.state
        assert st.branch is not None
        try:
            found = [posixpath.dirname(c.path) for c in st.plane.uncommitted(st.repo, st.branch)
                     if posixpath.basename(c.path) == METADATA and c.kind != "removed"]
        except Exception as exc:  # noqa: BLE001 - the server away: only what this mount sees is committed
            log.warning("checkpoints: cannot list the branch's uncommitted changes (%s); a save a killed mount staged "
                        "and never committed stays untagged", exc)
            return
        with self._cond:
            for directory in found:
                self._pending.setdefault(directory, None)

    def _try(self, directory: str) -> bool:
        try:
            self._commit(directory)
            return True
        except Exception as exc:  # noqa: BLE001 - tried again (the server may be away)
            self.failures += 1
            log.error("checkpoint %s not committed yet (%s); trying again", directory or "/", exc)
            return False

    def _commit(self, directory: str) -> None:
        st = self.state
        assert st.branch is not None
        local = self._released(directory)
        for wf in local:
            self.writes.sync(wf)
        step = checkpoint_step(directory)
        meta = {names.FORMAT_META: names.DCP, names.DIR_META: directory}
        if step is not None:
            meta[names.STEP_META] = str(step)
        commit = st.plane.commit(st.repo, st.branch, f"checkpoint {directory or '/'}", meta=meta, allow_empty=True)
        tag = step_tag(st.branch, directory)
        if tag is not None:
            try:
                st.plane.create_tag(st.repo, tag, commit.id)
            except errors.Conflict:  # the same step saved again: its tag moves
                st.plane.delete_tag(st.repo, tag)
                st.plane.create_tag(st.repo, tag, commit.id)
            self.last_tag = tag
        self.committed += 1
        log.info("checkpoint %s committed as %s%s", directory or "/", commit.id[:12], f", tagged {tag}" if tag else "")

    def _released(self, directory: str) -> list:
        """The local files under ``directory``, once none is open (or :data:`RELEASE_WAIT` passed)."""
        prefix = directory + "/" if directory else ""
        deadline = time.monotonic() + RELEASE_WAIT
        while True:
            local = [wf for p, wf in list(self.state.files.items()) if p.startswith(prefix)]
            if all(wf.opens == 0 for wf in local) or time.monotonic() >= deadline:
                return local
            time.sleep(0.02)
