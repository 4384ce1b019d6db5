"""Copies a spoke keeps of another machine's parked files: ``--writeback`` at ``replicated``.

A ``fabric mount --writeback --durability replicated`` returns from fsync once the file is
on the mount's own disk (its write-back journal, ``fuse/journal.py``) *and* on the disk of a
peer spoke of its spoke's group: this store, on that peer. So losing the mount's machine
(and the spoke beside it) loses no file whose fsync returned, while fsync costs a copy over
the LAN instead of the chunking and upload it waits for without write-back.

Layout, in ``<cache-dir>/mirrors/<mount id>/``:

- ``owner``: the name of the token that sent the first file; only it may change the rest;
- ``lease``: its modification time is the mount's last word (it renews it every
  :data:`fuse.mirror.RENEW_EVERY` seconds);
- ``<id>.data``, ``<id>.json``: one parked file, its bytes and where it goes (``repo``,
  ``branch``, ``path``, ``mode``, ``mtime_ns``, ``meta``), as in the mount's journal. The data
  is written to ``<id>.data.tmp``, synced and renamed, then the record is written durably:
  a ``.data`` without its ``.json`` is an upload that never completed. A file fsynced again
  after it only grew is sent as its new bytes, appended in place to ``<id>.data`` (synced, then
  the record rewritten); an append cut short is cut off again, and a spoke killed during one
  keeps the bytes of it that reached its disk (more than the last fsync returned for, never less).

The mount drops a file's copy here once it has staged the file on its branch (its own
spoke then holds it at ``replicated``), and ends its lease at a clean unmount. When a
lease is older than ``promote_after`` seconds, the mount is taken for lost: its files are
*promoted*, written here as if a client had written them (queued in this spoke's own
write-back for the hub, :meth:`spoke.plane.SpokePlane.put_object`), the newest of each path
only, then dropped. A copy is not written over a version of its path on the branch whose
mtime is as late or later (the mount staged a newer version before it was lost; its
versions' times all come from its own clock). A spoke that starts again gives every mount a
whole ``promote_after`` to renew its lease (its renewals could not reach a stopped spoke).

Known limit (as for :mod:`spoke.replicas`): a mount that comes back after its lease ran out
stages its own journal too (the same bytes), and a version written elsewhere with an older
mtime (another machine's clock) is overwritten.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from fabric.errors import BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge
from fabric.util.jsonfile import fsync_dir, write_json

log = logging.getLogger("fabric.spoke.mirrors")

#: Seconds a mount may go without renewing its lease before its files are staged from here.
PROMOTE_AFTER = 30.0
#: Seconds between two looks at the leases.
LOOK_EVERY = 2.0
#: Bytes all mounts may keep here at once (beyond, a copy is refused and the mount stages inline).
CAPACITY = 8 * 1024**3

_ID = re.compile(r"^[0-9a-f]{32}$")
_FIELDS = {"repo": str, "branch": str, "path": str, "mode": int, "mtime_ns": int, "meta": dict}

#: ``stage(repo, branch, path, file, mode, mtime_ns, meta)``: write one promoted file; False
#: when it was not written because the branch holds a later version of the path.
Stage = Callable[[str, str, str, IO[bytes], int, int, Mapping[str, str]], bool]


def check_id(value: str, what: str) -> str:
    if not _ID.match(value):
        raise BadRequest(f"{what} is 32 lowercase hex digits, not {value[:40]!r}")
    return value


def check_record(record: Any) -> dict[str, Any]:
    """The record of a parked file, its fields checked (BadRequest names the first wrong one)."""
    if not isinstance(record, dict):
        raise BadRequest("a mirrored file's record is a JSON object")
    for name, kind in _FIELDS.items():
        if not isinstance(record.get(name), kind) or isinstance(record.get(name), bool):
            raise BadRequest(f"a mirrored file's record needs {name!r} ({kind.__name__})")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in record["meta"].items()):
        raise BadRequest("a mirrored file's meta maps strings to strings")
    return {name: record[name] for name in _FIELDS}


class MirrorStore:
    """The parked files other machines' mounts keep on this spoke."""

    def __init__(self, directory: str, capacity: int = CAPACITY, promote_after: float = PROMOTE_AFTER) -> None:
        self.dir = directory
        self.capacity = capacity
        self.promote_after = promote_after
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._reserved = 0  # bytes of uploads in progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.promoted = 0
        self.superseded = 0  # copies not written: the branch had a later version
        self._clean_partial()

    # -- what a mount sends ----------------------------------------------------------
    def begin(self, mount: str, owner: str, rid: str, record: Any, size: int, offset: int = 0) -> Upload:
        """Make room for ``size`` bytes of file ``rid``: the whole file (``offset`` 0), or what it
        grew by since the copy kept here, ``offset`` bytes long (Conflict when no copy of ``rid``
        of that length is here: the mount sends the file whole instead). The caller writes the
        bytes to the upload's :attr:`~Upload.path` from ``offset`` on and syncs them, then calls
        :meth:`Upload.finish` or :meth:`Upload.abort`. PayloadTooLarge when the store is full."""
        check_id(rid, "a mirrored file's id")
        record = check_record(record)
        if size < 0:
            raise BadRequest("a mirrored file needs its size (Content-Length)")
        if offset:
            directory = self._owned(mount, owner)
            try:
                length = os.stat(os.path.join(directory, rid + ".data")).st_size
            except FileNotFoundError:
                raise Conflict(f"no copy of {rid} is kept here: send the file whole") from None
            if length != offset:
                raise Conflict(f"the copy of {rid} kept here holds {length} bytes, not {offset}: send the file whole")
        else:
            directory = self._claim(mount, owner)
        with self._lock:
            held = self._usage()[1] + self._reserved
            if held + size > self.capacity:
                raise PayloadTooLarge(f"this spoke keeps at most {self.capacity} bytes of parked files for mounts, "
                                      f"{held} are taken: stage the file instead")
            self._reserved += size
        return Upload(self, directory, rid, record, size, offset)

    def _release(self, size: int) -> None:
        with self._lock:
            self._reserved -= size

    def rename(self, mount: str, owner: str, rid: str, record: Any) -> None:
        """File ``rid`` now goes where ``record`` says (renamed, or its attributes changed)."""
        check_id(rid, "a mirrored file's id")
        record = check_record(record)
        directory = self._owned(mount, owner)
        if not os.path.exists(os.path.join(directory, rid + ".data")):
            raise NotFound(f"no mirrored file {rid} of mount {mount}")
        write_json(os.path.join(directory, rid + ".json"), record, durable=True)

    def drop(self, mount: str, owner: str, rid: str) -> bool:
        """Forget file ``rid`` (staged by its mount, or replaced); whether it was here."""
        check_id(rid, "a mirrored file's id")
        return _forget(self._owned(mount, owner), rid)

    def renew(self, mount: str, owner: str) -> None:
        """The mount is alive: its files stay here, unstaged."""
        self._touch(self._owned(mount, owner))

    def end(self, mount: str, owner: str) -> None:
        """The mount ended cleanly with nothing parked: forget it."""
        shutil.rmtree(self._owned(mount, owner), ignore_errors=True)

    # -- state ---------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        with self._lock:
            files, held = self._usage()
            return {"mirrors_mounts": len(self._mounts()), "mirrors_files": files, "mirrors_bytes": held,
                    "mirrors_promoted": self.promoted, "mirrors_superseded": self.superseded}

    def _mounts(self) -> list[str]:
        return [m for m in os.listdir(self.dir) if _ID.match(m)]

    def _usage(self) -> tuple[int, int]:
        """The complete copies kept here: how many, and their bytes (one walk of the directory)."""
        files = held = 0
        for mount in self._mounts():
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(os.path.join(self.dir, mount)):
                    if entry.name.endswith(".data"):
                        with contextlib.suppress(FileNotFoundError):
                            held += entry.stat().st_size
                            files += 1
        return files, held

    def _claim(self, mount: str, owner: str) -> str:
        """The directory of ``mount``, made for ``owner`` if new."""
        check_id(mount, "a mount's id")
        directory = os.path.join(self.dir, mount)
        with self._lock:
            if not os.path.isdir(directory):
                os.makedirs(directory)
                with open(os.path.join(directory, "owner"), "w") as f:
                    f.write(owner)
                self._touch(directory)
                fsync_dir(self.dir)
        return self._owned(mount, owner)

    def _owned(self, mount: str, owner: str) -> str:
        check_id(mount, "a mount's id")
        directory = os.path.join(self.dir, mount)
        try:
            with open(os.path.join(directory, "owner")) as f:
                kept_for = f.read()
        except FileNotFoundError:
            raise NotFound(f"this spoke keeps nothing for mount {mount}") from None
        if kept_for != owner:
            raise Forbidden(f"mount {mount}'s files here were sent with another token")
        return directory

    @staticmethod
    def _touch(directory: str) -> None:
        lease = os.path.join(directory, "lease")
        with open(lease, "a"):
            pass
        os.utime(lease)

    def _clean_partial(self) -> None:
        """Uploads a stopped spoke never finished are removed, and every lease starts again
        (a mount's renewals could not reach it while it was down)."""
        for mount in self._mounts():
            directory = os.path.join(self.dir, mount)
            for name in os.listdir(directory):
                if name.endswith(".tmp"):
                    os.unlink(os.path.join(directory, name))
            self._touch(directory)

    # -- lost mounts ---------------------------------------------------------------------
    def start(self, stage: Stage) -> None:
        """Watch the leases; ``stage`` writes a lost mount's files (into this spoke's write-back)."""
        self._thread = threading.Thread(target=self._run, args=(stage,), name="mirrors", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, stage: Stage) -> None:
        while not self._stop.wait(LOOK_EVERY):
            try:
                self.promote_lost(stage)
            except Exception:  # never let the watcher die; try again next round
                log.exception("mirrors: staging the files of lost mounts failed")

    def promote_lost(self, stage: Stage) -> int:
        """Stage the files of every mount whose lease ran out with ``stage``; how many files."""
        now = time.time()
        done = 0
        for mount in self._mounts():
            directory = os.path.join(self.dir, mount)
            try:
                renewed = os.stat(os.path.join(directory, "lease")).st_mtime
            except FileNotFoundError:
                continue
            if now - renewed >= self.promote_after:
                done += self._promote(stage, mount, directory, now - renewed)
        return done

    def _promote(self, stage: Stage, mount: str, directory: str, silent_for: float) -> int:
        records = self._latest(directory)
        done = superseded = 0
        for rid, record in records:
            data = os.path.join(directory, rid + ".data")
            try:
                with open(data, "rb") as f:
                    written = stage(record["repo"], record["branch"], record["path"], f, record["mode"], record["mtime_ns"], record["meta"])
            except Exception as exc:  # noqa: BLE001 - kept, and tried again next round
                log.error("mirrors: cannot stage %s of lost mount %s at %s@%s (tried again in %.0f s): %s",
                          record["path"], mount, record["repo"], record["branch"], LOOK_EVERY, exc)
                continue
            _forget(directory, rid)
            if written:
                done += 1
            else:
                superseded += 1
                log.info("mirrors: %s of lost mount %s not written: %s@%s holds a later version", record["path"], mount,
                         record["repo"], record["branch"])
        with self._lock:
            self.promoted += done
            self.superseded += superseded
        if not any(n.endswith(".json") for n in os.listdir(directory)):
            shutil.rmtree(directory, ignore_errors=True)
        if done:
            log.warning("mirrors: mount %s has not renewed its lease for %.0f s: %d of its parked file(s) queued here for the hub",
                        mount, silent_for, done)
        return done

    @staticmethod
    def _latest(directory: str) -> list[tuple[str, dict[str, Any]]]:
        """The complete records, of two of one path the later only (the earlier dropped)."""
        found: list[tuple[float, str, dict[str, Any]]] = []
        for name in os.listdir(directory):
            if not name.endswith(".json"):
                continue
            rid = name[: -len(".json")]
            path = os.path.join(directory, name)
            try:
                with open(path) as f:
                    record = check_record(json.load(f))
                found.append((os.stat(path).st_mtime, rid, record))
            except (OSError, ValueError, BadRequest) as exc:
                log.error("mirrors: %s is unreadable (%s); left in place", path, exc)
        latest: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
        for _, rid, record in sorted(found, key=lambda t: t[0]):
            key = (record["repo"], record["branch"], record["path"])
            older = latest.pop(key, None)
            if older is not None:
                _forget(directory, older[0])
            latest[key] = (rid, record)
        return list(latest.values())


class Upload:
    """A copy being received (:meth:`MirrorStore.begin`): the whole file, written to a temporary
    name and renamed into place, or (``offset``) what it grew by, appended to the data kept."""

    def __init__(self, store: MirrorStore, directory: str, rid: str, record: dict[str, Any], size: int, offset: int) -> None:
        self._store, self._directory, self._rid = store, directory, rid
        self.record, self.size, self.offset = record, size, offset
        self._data = os.path.join(directory, rid + ".data")
        #: Where the bytes go, from :attr:`offset` on.
        self.path = self._data if offset else self._data + ".tmp"

    def finish(self, written: int) -> None:
        """The body is written (``written`` bytes of it) and synced: keep the copy and its record."""
        try:
            if written != self.size:
                self._undo()
                raise BadRequest(f"the body held {written} bytes, not the {self.size} its Content-Length gave")
            if not self.offset:
                os.replace(self.path, self._data)
            write_json(os.path.join(self._directory, self._rid + ".json"), self.record, durable=True)
            if not self.offset:
                fsync_dir(self._directory)
            self._store._touch(self._directory)
        finally:
            if not self.offset:
                self._undo()  # (the temporary name, if the rename did not take it)
            self._store._release(self.size)

    def abort(self) -> None:
        try:
            self._undo()
        finally:
            self._store._release(self.size)

    def _undo(self) -> None:
        """Whatever this upload wrote is gone: the temporary file, or the bytes appended."""
        with contextlib.suppress(FileNotFoundError):
            if self.offset:
                os.truncate(self._data, self.offset)
            else:
                os.unlink(self.path)


def _forget(directory: str, rid: str) -> bool:
    """Remove copy ``rid`` (its record first: data without one is never staged); whether any of it was there."""
    found = False
    for suffix in (".json", ".data"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, rid + suffix))
            found = True
    return found
