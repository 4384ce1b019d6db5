"""A node's volume mounts: a FUSE mount process per publication, bound at the pod's path.

Publishing a volume at a pod's target path starts ``fabric mount`` (detached, in a
session of its own, so it outlives the driver) at a private directory under the
state directory, then bind-mounts the share's sub-directory at the target path, so
a pod sees only its sub-directory. Each publication is a JSON record in
``STATE/publications/``; a restarted driver reads them back (it adopts its mounts)
and can always unpublish, also when the mount process died ("Transport endpoint is
not connected"): the bind mount and the FUSE mount are then detached lazily.

Tokens reach the mount process in its environment (``FABRIC_TOKEN``), never its
command line, and are not written to the records.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from csi import flush
from csi.volumes import MountOptions, Volume
from fabric.cache.spoke_layout import holds_chunk_cache
from fabric.util.dirlock import DirectoryInUse, DirLock
from fabric.util.jsonfile import write_json
from fabric.util.processes import end_process, process_alive

log = logging.getLogger("fabric.csi")

MOUNT_TIMEOUT = 150.0  # `fabric mount` waits up to 120 s for the mount to be ready
UNMOUNT_TIMEOUT = 60.0
#: Write-back directories per volume and node (one per live writeback mount of it).
WRITE_DIRS = 64
#: Seconds a publish waits for a write directory's holder that is not a live mount to let go.
TAKE_WAIT = 2.0


class MountFailed(Exception):
    """The volume could not be mounted; the message says why, in the mount's words."""


class SourceMissing(MountFailed):
    """The share's sub-directory does not exist (or is not a directory) in a read-only volume."""


@dataclass(frozen=True)
class PublishRequest:
    """``volume`` (named ``volume_id`` by the CO) at ``target``, writable or not, with ``options``.

    ``spoke_cache``: the cache directory of the spoke on this node that the volume's nearest
    server is (``fabric csi --local-spoke``); the mount reads the chunks it holds from its files.
    ``spoke_copies``: that spoke's copies directory (``--local-spoke-copies``), the mount's copies
    instead of the node's own of the repository. Node settings, not part of what the CO asked:
    a publish repeated with others is the same publish."""

    volume_id: str
    volume: Volume
    target: str
    writable: bool
    options: MountOptions
    spoke_cache: str = field(default="", compare=False)
    spoke_copies: str = field(default="", compare=False)

    def to_json(self) -> dict:
        return {**asdict(self), "volume": asdict(self.volume), "options": asdict(self.options)}

    @classmethod
    def from_json(cls, d: dict) -> PublishRequest:
        options = MountOptions(**d["options"])
        return cls(str(d["volume_id"]), Volume(**d["volume"]), d["target"], bool(d["writable"]), options,
                   str(d.get("spoke_cache", "")), str(d.get("spoke_copies", "")))


@dataclass(frozen=True)
class Publication:
    """A volume published at ``target``; its FUSE mount is at ``private`` (process ``pid``)."""

    request: PublishRequest
    private: str
    pid: int
    write_dir: str = ""  # a writeback publication's write directory on this node

    @property
    def target(self) -> str:
        return self.request.target

    @property
    def volume_id(self) -> str:
        return self.request.volume_id


def mounted_paths() -> set[str]:
    """Every mount point of this mount namespace (from /proc/self/mountinfo)."""
    paths = set()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw = line.split(b" ")[4]
            paths.add(raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape"))
    return paths


def is_mounted(path: str) -> bool:
    return os.path.normpath(path) in mounted_paths()


class Mounts:
    """The publications of one node, kept under ``state_dir``."""

    def __init__(self, state_dir: str):
        self.state_dir = os.path.abspath(state_dir)
        for sub in ("publications", "mnt", "cache", "logs", "fuse", "writes"):
            os.makedirs(os.path.join(self.state_dir, sub), mode=0o700, exist_ok=True)

    # -- records ---------------------------------------------------------------

    def _key(self, target: str) -> str:
        return _digest(os.path.normpath(target))

    def _record_path(self, target: str) -> str:
        return os.path.join(self.state_dir, "publications", self._key(target) + ".json")

    @staticmethod
    def _load(path: str) -> Publication | None:
        try:
            with open(path) as f:
                d = json.load(f)
            return Publication(PublishRequest.from_json(d["request"]), d["private"], int(d["pid"]), str(d.get("write_dir", "")))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def get(self, target: str) -> Publication | None:
        return self._load(self._record_path(target))

    def all(self) -> list[Publication]:
        folder = os.path.join(self.state_dir, "publications")
        loaded = (self._load(os.path.join(folder, name)) for name in sorted(os.listdir(folder)) if name.endswith(".json"))
        return [pub for pub in loaded if pub is not None]

    def _save(self, pub: Publication) -> None:
        record = {"request": pub.request.to_json(), "private": pub.private, "pid": pub.pid, "write_dir": pub.write_dir}
        write_json(self._record_path(pub.target), record, durable=True)

    def problem(self, pub: Publication) -> str | None:
        """Why a publication does not serve its pod (None: it does)."""
        if not process_alive(pub.pid):
            return f"the mount process (pid {pub.pid}) is not running"
        try:
            os.stat(pub.target)
        except OSError as exc:
            return f"{pub.target}: {os.strerror(exc.errno or errno.EIO)}"
        if not is_mounted(pub.target):
            return f"{pub.target} is not mounted"
        return None

    # -- publish and unpublish ---------------------------------------------------

    def publish(self, req: PublishRequest, token: str | None) -> Publication:
        """Mount ``req.volume`` at ``req.target``; MountFailed says why it could not."""
        key = self._key(req.target)
        private = os.path.join(self.state_dir, "mnt", key)
        os.makedirs(private, exist_ok=True)
        pub = Publication(req, private, 0)
        self._save(pub)  # first, so that a crash from here on can still be unpublished
        try:
            if is_mounted(private):  # left by a publish that died half-way
                _detach(private)
            write_dir = self._write_dir(req)
            if write_dir:
                flush.remember(self.state_dir, write_dir, req.volume.server, token, req.options.durability, req.options.commit_on_unmount)
            pid = self._start_mount(req, private, token, key, write_dir)
            pub = Publication(req, private, pid, write_dir or "")
            self._save(pub)
            source = _source_dir(private, req.volume.subdir, create=req.writable)
            os.makedirs(req.target, exist_ok=True)
            _run(["mount", "--bind", source, req.target])
            if not req.writable:
                _run(["mount", "-o", "remount,bind,ro", req.target])
        except BaseException:
            self.unpublish(req.target)
            raise
        return pub

    def _write_dir(self, req: PublishRequest) -> str | None:
        """For a writable publish with ``writeback``: the first of the volume's write
        directories on this node that no live mount holds. One a killed mount left holds its
        journal, which the new mount takes over and stages in the background (so a pod restarted on
        this node finds what its last checkpoint parked, at once); several pods of one volume get one each.
        A background flush of a directory (:mod:`csi.flush`) is stopped for this."""
        if not (req.options.writeback and req.writable):
            return None
        vol = req.volume
        base = _digest(vol.server, vol.share)
        for i in range(WRITE_DIRS):
            candidate = os.path.join(self.state_dir, "writes", f"{base}-{i}")
            if _no_mount_holds(candidate):
                return candidate
        raise MountFailed(f"{WRITE_DIRS} writeback mounts of {vol.share} already run on this node")

    def _start_mount(self, req: PublishRequest, private: str, token: str | None, key: str, write_dir: str | None) -> int:
        vol = req.volume
        argv = [sys.executable, "-m", "fabric.cli.main", "mount", vol.server, f"{vol.repo}@{vol.ref}", private, "--allow-other"]
        # The node's copies of the repository (its own: no other learns of it), or those of the spoke
        # serving it on this node, which keeps copies of every repository written through it.
        copies = req.spoke_copies or os.path.join(self.state_dir, "copies", _digest(vol.server, vol.repo))
        argv += req.options.mount_args(os.path.join(self.state_dir, "cache", key), write_dir, copies)
        argv += _spoke_cache_args(req)
        argv += ["--log-file", os.path.join(self.state_dir, "logs", key + ".log")]
        if req.writable:
            argv.append("--rw")
        env = {k: v for k, v in os.environ.items() if k != "FABRIC_TOKEN"}
        env["FABRIC_MOUNT_STATE"] = os.path.join(self.state_dir, "fuse")
        if token:
            env["FABRIC_TOKEN"] = token
        try:
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MOUNT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise MountFailed(f"mounting {vol.share} from {vol.server} took over {MOUNT_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip().splitlines()
            raise MountFailed(words[-1] if words else f"fabric mount exited with status {done.returncode}")
        pid = _mount_pid(private)
        if not pid:
            raise MountFailed(f"the mount process of {private} is gone right after it started")
        return pid

    def unpublish(self, target: str) -> None:
        """Unmount ``target`` and its FUSE mount, stop its process, remove what publish made.

        Idempotent; works when the mount process died or the record is missing."""
        target = os.path.normpath(target)
        pub = self.get(target)
        if is_mounted(target):
            _detach(target)
        if pub is not None:
            if is_mounted(pub.private):
                _unmount_fuse(pub.private, os.path.join(self.state_dir, "fuse"))
            _stop(pub.pid, pub.private)
            with contextlib.suppress(OSError):
                os.rmdir(pub.private)
            if pub.write_dir and flush.parked(pub.write_dir):  # its mount stopped before staging them
                flush.start(self.state_dir, pub.write_dir)
            elif pub.write_dir:
                flush.forget(self.state_dir, pub.write_dir)  # nothing left to stage: no token kept
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if not is_mounted(target):
                os.rmdir(target)  # the spec: the plugin removes the target path it created
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._record_path(target))


def _digest(*parts: str) -> str:
    """A short name for a node directory of ``parts`` (server, share or repository)."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _no_mount_holds(write_dir: str) -> bool:
    """Whether ``write_dir`` is free for a new mount: a flush of it is stopped, and a holder that
    is letting go is waited for, up to :data:`TAKE_WAIT` seconds (a flush that ends hands the
    directory from its ``fabric mount-flush`` to its own last look at it, one process after the
    other); False where a live mount holds it."""
    deadline = time.monotonic() + TAKE_WAIT
    while True:
        try:
            DirLock(write_dir, "write-back directory").release()
            return True
        except DirectoryInUse as exc:
            holder = exc.details.get("pid")
            if not flush.stop_if_flushing(holder, write_dir) and holder and process_alive(holder):
                return False  # (a live mount)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _spoke_cache_args(req: PublishRequest) -> list[str]:
    """``--spoke-cache DIR`` when the node's spoke has its cache there. A spoke not started
    yet (no ``chunks/`` directory) costs the mount its fast path, never the publish."""
    if not req.spoke_cache:
        return []
    if not holds_chunk_cache(req.spoke_cache):
        log.warning("%s is not a spoke's cache directory (no chunks/ in it): %s reads every chunk from %s over HTTP", req.spoke_cache, req.target, req.volume.server)
        return []
    return ["--spoke-cache", req.spoke_cache]


def _source_dir(private: str, subdir: str, create: bool) -> str:
    """``private/subdir``, checked one component at a time so that no link leads out of the mount."""
    path = private
    for part in [p for p in subdir.split("/") if p]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                raise SourceMissing(f"{subdir!r} does not exist in this read-only volume") from None
            os.mkdir(path, 0o777)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise SourceMissing(f"{subdir!r} is not a directory (a link or a file is at {part!r})")
    return path


def _mount_pid(private: str) -> int:
    """The pid of the ``fabric mount --foreground`` process serving ``private``."""
    want = os.fsencode(private)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"--foreground" in args and want in args and b"mount" in args:
            return int(name)
    return 0


def _run(argv: list[str], timeout: float = UNMOUNT_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MountFailed(f"{argv[0]} took over {timeout:.0f} s") from None
    if done.returncode != 0:
        raise MountFailed(f"{' '.join(argv[:2])}: {(done.stderr or done.stdout).strip() or 'exit ' + str(done.returncode)}")
    return done


def _detach(path: str) -> None:
    """Unmount ``path``; if it is busy or its server is gone, detach it lazily."""
    try:
        _run(["umount", path])
    except MountFailed:
        _run(["umount", "-l", path])


def _unmount_fuse(private: str, fuse_state: str) -> None:
    """Unmount a FUSE mount the way ``fabric umount`` does (waiting for its commits)."""
    env = dict(os.environ, FABRIC_MOUNT_STATE=fuse_state)
    argv = [sys.executable, "-m", "fabric.cli.main", "umount", private, "--timeout", str(UNMOUNT_TIMEOUT)]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=UNMOUNT_TIMEOUT + 10)
        if done.returncode == 0 and not is_mounted(private):
            return
    except subprocess.TimeoutExpired:
        pass
    log.warning("unmount of %s did not finish cleanly: detaching it", private)
    _detach(private)


def _stop(pid: int, private: str) -> None:
    """End the mount process if it is still there (it normally exits at unmount)."""
    if not pid or _mount_pid(private) != pid:
        return
    end_process(pid)
