"""Helpers of the FUSE tests: real mounts through the real ``fabric mount`` command.

``mounted(hub_url, token, "repo@ref", mountpoint, *options)`` is a context
manager that runs ``fabric mount`` (background, returns when ready) and
always unmounts in its exit (``fabric umount``, then ``fusermount3 -u -z``
and a kill of the mount process if needed), so a failing test never leaves
a stale mount behind. :class:`RestartableHub` is a hub that can be stopped
and started again on the same port and data directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fabric.util.net import free_port
from fabric.util.processes import process_alive
from tests.ci_requirements import requires
from tests.hubserver import ROOT, _wait_healthy, hub_env, stop
from tests.spokeserver import wait_for

FABRIC = [sys.executable, "-m", "fabric.cli.main"]


def fuse_unavailable_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "fusermount3 is not installed (make deps / scripts/install-system-deps.sh)"
    try:
        import fuse.libfuse  # noqa: F401 - mfusepy, loading libfuse 3 also where libfuse 2 is installed (fuse/__init__.py)
    except (ImportError, OSError, AttributeError) as exc:
        return f"mfusepy cannot load libfuse: {exc}"
    return None


#: FUSE tests: skipped without FUSE, failed under CI (tests/ci_requirements.py).
needs_fuse = requires(fuse_unavailable_reason())


def env(token: str | None = None, **extra: str) -> dict:
    e = hub_env(extra)
    if token:
        e["FABRIC_TOKEN"] = token
    return e


def fabric(*args: str, token: str | None = None, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([*FABRIC, *args], env=env(token), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"fabric {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}\n{proc.stdout}")
    return proc


def _listed_as_mount(mountpoint: str) -> bool:
    """In the mount table (also a FUSE mount whose process died: ``os.path.ismount`` then
    fails with ENOTCONN and says False)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def force_unmount(mountpoint: str) -> None:
    for cmd in (["fusermount3", "-u", "-z", mountpoint], ["umount", "-l", mountpoint]):
        if not _listed_as_mount(mountpoint):
            return
        subprocess.run(cmd, capture_output=True)


@contextlib.contextmanager
def mounted(server: str, token: str | None, target: str, mountpoint: str | os.PathLike, *options: str) -> Iterator[str]:
    mp = str(mountpoint)
    os.makedirs(mp, exist_ok=True)
    log = mp.rstrip("/") + ".mount.log"
    fabric("mount", server, target, mp, "--log-file", log, *options, token=token)
    state = _state(mp)
    try:
        assert os.path.ismount(mp), f"{mp} is not a mount point after fabric mount returned"
        yield mp
    finally:
        try:
            proc = fabric("umount", mp, "--timeout", "60", check=False, timeout=90)
            if proc.returncode != 0:
                print(f"fabric umount {mp} failed: {proc.stderr}", file=sys.stderr)
        finally:
            force_unmount(mp)
            pid = (state or {}).get("pid")
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        os.kill(pid, 0)
                        time.sleep(0.1)
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def mount_to_kill(server: str, token: str, target: str, mp: str, opts: tuple[str, ...]) -> Iterator[int]:
    """``fabric mount`` of ``target`` in the background, for a test that kills it: yields its
    pid; at the end the mount point is unmounted and the process gone."""
    os.makedirs(mp, exist_ok=True)
    fabric("mount", server, target, mp, *opts, token=token)
    pid = _state(mp)["pid"]
    try:
        yield pid
    finally:
        force_unmount(mp)
    wait_for(lambda: not process_alive(pid), timeout=10, interval=0.1)


def _state(mp: str) -> dict | None:
    from fuse.mount import read_state

    return read_state(mp)


def mount_log(mountpoint: str) -> str:
    try:
        return Path(str(mountpoint).rstrip("/") + ".mount.log").read_text(errors="replace")
    except OSError:
        return ""


class RestartableHub:
    """``fabric hub`` on a fixed port and data directory that can be stopped and started again."""

    def __init__(self, data: str | os.PathLike) -> None:
        self.data = str(data)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data.rstrip("/") + ".log"
        self.token: str | None = None

    def start(self) -> None:
        argv = [*FABRIC, "hub", "--data", self.data, "--listen", f"127.0.0.1:{self.port}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=hub_env(), cwd=ROOT)
        _wait_healthy(self.url, self.proc, self.log_path)
        self.token = (Path(self.data) / "admin.token").read_text().strip()

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
            self.proc.wait(10)
        else:
            stop(self.proc)
        self.proc = None

    def plane(self):
        from fabric.client.http import HttpPlane

        return HttpPlane(self.url, self.token)

    def __enter__(self) -> RestartableHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- trees -----------------------------------------------------------------------------
def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            h.update(piece)
    return h.hexdigest()


_SLOW_DIGEST = """
import hashlib, sys, time
path, slow_for = sys.argv[1], float(sys.argv[2])
h = hashlib.sha256()
t0 = time.monotonic()
with open(path, "rb", buffering=0) as f:
    while piece := f.read(1 << 20):
        h.update(piece)
        if time.monotonic() - t0 < slow_for:
            time.sleep(0.03)
print(h.hexdigest())
"""


def slow_digest(path: str, slow_for: float) -> str:
    """SHA-256 of a file read sequentially in 1 MiB reads, pausing 30 ms between reads for
    the first ``slow_for`` seconds (so that a server restart lands in the middle of the read).

    The read runs in a child process: a server the test restarts meanwhile is started by a
    fork of the test's process, whose copy of an open descriptor on the mount would be closed
    at exec, a FUSE flush that waits for a mount thread, and every thread of the mount may be
    waiting for that very server."""
    done = subprocess.run([sys.executable, "-c", _SLOW_DIGEST, path, str(slow_for)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise OSError(f"reading {path} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return done.stdout.strip()


def snapshot(root: str, content: bool = True, mtimes: bool = True, dirs: bool = True) -> dict[str, tuple]:
    """``relative path -> (kind, mode, size, mtime_ns, digest/target)`` of everything under ``root``."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            relp = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                if dirs:
                    out[relp] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISLNK(st.st_mode):
                out[relp] = ("symlink", os.readlink(full))
            else:
                out[relp] = (
                    "file",
                    stat.S_IMODE(st.st_mode),
                    st.st_size,
                    st.st_mtime_ns if mtimes else 0,
                    file_digest(full) if content else "",
                )
    return out


def diff_snapshots(a: dict, b: dict, limit: int = 20) -> list[str]:
    problems = []
    for k in sorted(a.keys() | b.keys()):
        if a.get(k) != b.get(k):
            problems.append(f"{k}: {a.get(k)} != {b.get(k)}")
            if len(problems) >= limit:
                break
    return problems


def ls_lines(root: str) -> list[str]:
    """`ls -lR` lines of regular files and symlinks (mode, links, size, mtime, name), and the
    directory headers; directory lines differ between file systems and are left out."""
    out = subprocess.run(["ls", "-lR", "--time-style=+%s", "-n", root], capture_output=True, text=True, check=True).stdout
    lines = []
    for line in out.replace(root, "ROOT").splitlines():
        if line.startswith(("-", "l")):
            parts = line.split(None, 6)
            lines.append(" ".join([parts[0], parts[1], parts[4], parts[5], parts[6]]))
        elif line.startswith("ROOT"):
            lines.append(line)
    return lines


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1, default=str)[:4000]


def mount_stats(mp: str, part: str, until=lambda s: True, timeout: float = 30.0) -> dict:
    """The mount's counters of ``part`` (a key of its stats file, written every second), once
    ``until`` holds of them."""
    from fuse.mount import read_stats

    deadline = time.monotonic() + timeout
    while True:
        try:
            stats = read_stats(mp)[part]
        except (OSError, ValueError, KeyError):
            stats = None
        if stats is not None and until(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"the mount's {part} counters did not get there: {stats}")
        time.sleep(0.2)
