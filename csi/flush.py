"""Staging what a writeback volume's mount left parked on this node, without a mount.

A writeback publication's mount parks fsynced files in a write directory of the node's
(:meth:`csi.mounts.Mounts._write_dir`). A mount that dies, or that is stopped at unpublish
before it has staged them (its unmount waits :data:`csi.mounts.UNMOUNT_TIMEOUT`), leaves them
there. The next writeback mount of the volume on this node takes them over, but the pod may
never come back to this node. So at unpublish, and at the driver's start for any left, a
detached process (``python -m csi.flush STATE_DIR WRITE_DIR``) stages them with
``fabric mount-flush`` (``fuse/flush.py``). It uses what the publish recorded for that directory in
``STATE_DIR/flush/<name>.json``: server, token, durability, and whether to commit
(``commit-on-unmount``). The record is readable by root only, in the driver's root-only
state directory, and it goes once the directory holds no parked file, so the token stays on
the node's disk only while there is something to stage with it.

A publish that wants the directory back stops such a flush first (:func:`stop_if_flushing`):
a file leaves the journal only once staged, so the new mount takes over exactly what is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time

from fabric.util.dirlock import DirectoryInUse, DirLock, lock_holder
from fabric.util.jsonfile import write_json
from fabric.util.processes import end_process

log = logging.getLogger("fabric.csi")

FLUSH_DIR = "flush"
#: Where a ``--writeback`` mount keeps its journal in its write directory (``fuse/journal.py``
#: ``DIRNAME``; this service runs ``fabric mount`` and does not import it).
JOURNAL = "writeback"
#: The message of the commit a flush makes for a volume mounted with ``commit-on-unmount``.
COMMIT_MESSAGE = "fabric csi: files a stopped writeback mount left, staged after it"
#: How long a publish waits for a flush it stopped to let go of the directory.
STOP_WAIT = 10.0
#: How long :func:`start` waits for the flush it began to hold the directory.
START_WAIT = 10.0


def info_path(state_dir: str, write_dir: str) -> str:
    return os.path.join(state_dir, FLUSH_DIR, _name(write_dir) + ".json")


def _name(write_dir: str) -> str:
    return os.path.basename(os.path.normpath(write_dir))


def remember(state_dir: str, write_dir: str, server: str, token: str | None, durability: str, commit: bool) -> None:
    """Record how to stage what ``write_dir`` will hold (root-only: it holds the token)."""
    os.makedirs(os.path.join(state_dir, FLUSH_DIR), mode=0o700, exist_ok=True)
    old = os.umask(0o077)
    try:
        write_json(info_path(state_dir, write_dir), {"server": server, "token": token, "durability": durability, "commit": commit}, durable=True)
    finally:
        os.umask(old)


def forget(state_dir: str, write_dir: str) -> None:
    """Drop the record of ``write_dir`` (it parks nothing, and no mount uses it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(info_path(state_dir, write_dir))


def parked(write_dir: str) -> int:
    """How many files the journal of ``write_dir`` holds (0 if it has none)."""
    try:
        return sum(1 for name in os.listdir(os.path.join(write_dir, JOURNAL)) if name.endswith(".json"))
    except FileNotFoundError:
        return 0


def start(state_dir: str, write_dir: str) -> int | None:
    """Stage what ``write_dir`` holds in a detached process group; its leader's pid, or None
    without a record. Returns once the flush holds the directory (or has ended), so that a
    publish that comes next finds it there and stops it rather than racing it for the journal."""
    info = info_path(state_dir, write_dir)
    if not os.path.exists(info):
        log.warning("%s holds %d parked file(s) but no record of its server and token: they wait for the next writeback mount of its volume on this node",
                    write_dir, parked(write_dir))
        return None
    logfile = os.path.join(state_dir, "logs", f"flush-{_name(write_dir)}.log")
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    with open(logfile, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "csi.flush", state_dir, write_dir, _identity(info)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    log.info("staging %d parked file(s) of %s in the background (pid %d, log %s)", parked(write_dir), write_dir, proc.pid, logfile)
    d = os.stat(write_dir)
    deadline = time.monotonic() + START_WAIT
    while lock_holder(d.st_dev, d.st_ino) is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc.pid


def resume(state_dir: str) -> None:
    """At the driver's start: stage what write directories no process holds still park, and
    forget the records of those that park nothing."""
    folder = os.path.join(state_dir, FLUSH_DIR)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        write_dir = os.path.join(state_dir, "writes", name[: -len(".json")])
        try:
            DirLock(write_dir, "write-back directory").release()
        except DirectoryInUse:
            continue  # a mount or a flush has it
        if parked(write_dir):
            start(state_dir, write_dir)
        else:
            forget(state_dir, write_dir)


def stop_if_flushing(pid: int | None, write_dir: str) -> bool:
    """If process ``pid`` is a flush of ``write_dir`` that :func:`start` began, stop its whole
    process group and wait until it has let go of the directory; whether it was one."""
    if not pid:
        return False
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return False
    if not _is_flush_of(group, write_dir):
        return False
    end_process(pid, lambda sig: os.killpg(group, sig), STOP_WAIT, STOP_WAIT)
    log.info("stopped the flush of %s (pid %d): a new mount takes over what it had not staged", write_dir, group)
    return True


def _is_flush_of(pid: int, write_dir: str) -> bool:
    """Whether process ``pid`` is ``python -m csi.flush STATE_DIR write_dir ...``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"csi.flush" in argv and os.fsencode(write_dir) in argv


def main(argv: list[str]) -> int:
    """``python -m csi.flush STATE_DIR WRITE_DIR INODE:MTIME_NS``: stage what WRITE_DIR parks
    with ``fabric mount-flush``, then, if nothing is left, forget the directory's record (and
    token): the record :func:`start` saw, not one a publish wrote meanwhile; its status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    state_dir, write_dir, seen = argv
    with open(info_path(state_dir, write_dir)) as f:
        info = json.load(f)
    cmd = [sys.executable, "-m", "fabric.cli.main", "mount-flush", info["server"], write_dir, "--durability", info["durability"]]
    if info["commit"]:
        cmd += ["--commit-message", COMMIT_MESSAGE]
    env = {k: v for k, v in os.environ.items() if k != "FABRIC_TOKEN"}
    if info["token"]:
        env["FABRIC_TOKEN"] = info["token"]
    status = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode
    try:
        with DirLock(write_dir, "write-back directory"):  # (not while a new mount has it)
            if not parked(write_dir) and _identity(info_path(state_dir, write_dir)) == seen:
                forget(state_dir, write_dir)  # (not one a publish wrote meanwhile for its new mount)
    except DirectoryInUse:
        pass
    return status


def _identity(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ""
    return f"{st.st_ino}:{st.st_mtime_ns}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
