"""Mounting and unmounting: the mount process, readiness, background serving.

``fabric mount`` validates its arguments against the server, then starts
the mount process (the same command with ``--foreground --ready-fd N``) in
its own session and waits until that process reports the mount ready (the
kernel answered FUSE INIT and the mount point can be stat'ed) or failed.
The mount process records itself in a state file (pid, log, target) that
``fabric umount`` uses to wait for it to finish: a mount that commits at
unmount has committed when ``fabric umount`` returns.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from fabric.cache.files import FILES, INCOMING
from fabric.errors import BadRequest, FabricError
from fabric.util.jsonfile import write_json
from fabric.util.limits import raise_open_files_limit
from fabric.util.processes import process_alive
from fuse.config import MountConfig
from fuse.fs import FabricFS
from fuse.libfuse import MAX_THREADS, FabricFUSE

if TYPE_CHECKING:
    from fuse.kernel.immutable import ImmutableMount

log = logging.getLogger("fabric.fuse")

READY_TIMEOUT = 120.0


def state_dir() -> str:
    base = os.environ.get("FABRIC_MOUNT_STATE") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache"), "fabric", "mounts"
    )
    os.makedirs(base, exist_ok=True)
    return base


def _key(mountpoint: str) -> str:
    return hashlib.sha1(os.path.realpath(mountpoint).encode()).hexdigest()[:16]


def state_path(mountpoint: str) -> str:
    return os.path.join(state_dir(), _key(mountpoint) + ".json")


def default_log_path(mountpoint: str) -> str:
    return os.path.join(state_dir(), _key(mountpoint) + ".log")


def read_state(mountpoint: str) -> dict | None:
    try:
        with open(state_path(mountpoint)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def open_plane(server: str, token: str | None, durability: str, bwlimit: str | None = None):
    from fabric.client.bandwidth import parse_bwlimit
    from fabric.client.http import HttpPlane

    # Spokes acknowledge writes once durable at this level; a hub is always at "hub".
    return HttpPlane(server, token, durability=durability, bandwidth=parse_bwlimit(bwlimit) if bwlimit else None)


def resolve_target(plane, repo: str, ref: str, writable: bool) -> tuple[bool, str, float]:
    """``(is_branch, commit_id, commit_time)`` of REPO@REF; errors a person can act on."""
    is_branch = any(b["name"] == ref for b in plane.list_branches(repo))  # NotFound for an unknown repository
    if writable and not is_branch:
        raise BadRequest(f"--rw needs a branch: {ref!r} is not a branch of {repo!r} (commits and tags are read-only)")
    commit_id = plane.resolve_commit(repo, ref)
    return is_branch, commit_id, plane.get_commit(repo, commit_id).time


def check_passthrough(cfg: MountConfig, is_branch: bool, fuse_options: dict | None = None) -> None:
    """Errors a person can act on for ``--passthrough`` (:mod:`fuse.kernel`)."""
    if not cfg.passthrough:
        if not cfg.check_copies:
            raise BadRequest("--no-passthrough-check needs --passthrough")
        if cfg.copies_dir:
            raise BadRequest("--copies-dir needs --passthrough: it is where a passthrough mount's copies are")
        return
    if is_branch:
        raise BadRequest(f"--passthrough serves a commit or tag (immutable): {cfg.ref!r} is a branch")
    if not cfg.cache_dir:
        raise BadRequest("--passthrough needs --cache-dir: the kernel reads plain copies of the files kept there")
    if os.geteuid() != 0:
        raise BadRequest("--passthrough needs root: only CAP_SYS_ADMIN may mount without fusermount and hand the kernel backing files")
    if fuse_options:
        raise BadRequest("--passthrough takes no -o options (they are libfuse's, which it does without)")


def check_write_dirs(cfg: MountConfig) -> None:
    """Errors a person can act on for the directories a writable mount writes files to
    (``--write-dir``, ``--seed-copies``: :mod:`fabric.cache.seeds`), which it creates."""
    if cfg.seed_copies and not cfg.writable:
        raise BadRequest("--seed-copies needs --rw: it keeps copies of the files this mount writes")
    if cfg.seed_copies and cfg.cache_dir and os.path.realpath(cfg.cache_dir) == os.path.realpath(cfg.seed_copies):
        raise BadRequest("--seed-copies must not be this mount's own --cache-dir: the --passthrough mount that reads "
                         "the copies needs that directory for itself; give it a directory of its own")
    wanted = {"--write-dir": cfg.write_dir, "--seed-copies": cfg.seed_copies and os.path.join(cfg.seed_copies, FILES, INCOMING)}
    for option, path in wanted.items():
        if not cfg.writable or not path:
            continue
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise BadRequest(f"cannot keep files in {option} {path!r}: {exc.strerror}") from None


def check_mountpoint(mountpoint: str) -> str:
    mp = os.path.realpath(mountpoint)
    if _stale(mp):
        raise BadRequest(f"{mountpoint!r} is a mount whose process has gone; clean it up with: fabric umount {mountpoint}")
    if not os.path.isdir(mp):
        raise BadRequest(f"mount point {mountpoint!r} is not a directory; create it first (mkdir -p {mountpoint})")
    if os.path.ismount(mp):
        raise BadRequest(f"{mountpoint!r} is already a mount point; unmount it first (fabric umount {mountpoint})")
    return mp


def _tune_readahead(mountpoint: str, readahead: int) -> None:
    """Let the kernel read ahead ``readahead`` bytes on this mount (root only; FUSE caps it at 128 KiB)."""
    if readahead <= 0 or os.geteuid() != 0:
        return
    dev = os.stat(mountpoint).st_dev
    path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(max(readahead // 1024, 128)))
    except OSError as exc:
        log.info("cannot raise the kernel readahead (%s): %s", path, exc)


def run_foreground(
    server: str,
    token: str | None,
    cfg: MountConfig,
    mountpoint: str,
    allow_other: bool = False,
    fuse_options: dict | None = None,
    ready_fd: int | None = None,
    stats_interval: float = 60.0,
) -> None:
    """Mount and serve until unmounted (blocks). Reports readiness on ``ready_fd``."""

    def report(text: str) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            try:
                os.write(ready_fd, text.encode() + b"\n")
                os.close(ready_fd)
            except OSError:
                pass
            ready_fd = None

    raise_open_files_limit()
    try:
        mp = check_mountpoint(mountpoint)
        plane = open_plane(server, token, cfg.durability, cfg.bwlimit)
        is_branch, commit_id, commit_time = resolve_target(plane, cfg.repo, cfg.ref, cfg.writable)
        check_passthrough(cfg, is_branch, fuse_options)
        check_write_dirs(cfg)
        # Opens the cache directory too: one held by another mount is refused here, with its pid.
        fs = FabricFS(plane, cfg, branch=is_branch, commit_id=commit_id, commit_time=commit_time)
        if fs.writes.writeback is not None:
            # Files an earlier mount parked and never staged (it was killed): this mount's own now.
            adopted = fs.writes.writeback.adopt()
            if adopted:
                log.info("took over %d parked file(s) left in the write-back journal by an earlier mount; staging them in the background", adopted)
    except FabricError as exc:
        report(f"error: {exc.message}")
        raise
    state = {
        "pid": os.getpid(),
        "mountpoint": mp,
        "server": server,
        "target": f"{cfg.repo}@{cfg.ref}",
        "commit": commit_id,
        "writable": fs.state.writable,
        "log": _log_file(),
        "config": {k: v for k, v in asdict(cfg).items()},
    }

    def ready() -> None:
        try:
            _tune_readahead(mp, cfg.readahead)
            with open(state_path(mp), "w") as f:
                json.dump(state, f)
            what = "read-write branch" if fs.state.writable else "branch (read-only)" if is_branch else f"commit {commit_id[:12]}"
            log.info("mounted %s@%s (%s) at %s from %s", cfg.repo, cfg.ref, what, mp, server)
            report("ok")
        except Exception as exc:  # noqa: BLE001
            report(f"error: {exc}")

    fs.on_ready = ready
    with contextlib.suppress(OSError):
        os.unlink(stats_path(mp))  # an earlier mount's at this mount point
    stop = threading.Event()
    kernel: list = []  # the mount served on the kernel's protocol (--passthrough), once made

    def stats_loop() -> None:
        # Every second: a JSON snapshot next to the state file; every stats_interval: a log report.
        last = time.monotonic()
        while not stop.wait(1.0):
            try:
                write_stats(mp, fs, kernel[0] if kernel else None)
            except OSError:
                pass
            if stats_interval > 0 and time.monotonic() - last >= stats_interval:
                last = time.monotonic()
                log.info("operation latencies:\n%s", fs.stats.report())

    threading.Thread(target=stats_loop, name="fabric-stats", daemon=True).start()
    options = {
        "fsname": f"fabric:{cfg.repo}@{cfg.ref}",
        "subtype": "fabric",
        "default_permissions": True,
        "ro": not fs.state.writable,
        "max_threads": MAX_THREADS,
    }
    if allow_other:
        options["allow_other"] = True
    options.update(fuse_options or {})
    try:
        if cfg.passthrough:
            from fuse.kernel.immutable import serve

            serve(fs, mp, options["fsname"], allow_other=allow_other, serving=kernel.append)
        else:
            FabricFUSE(fs, mp, raw_fi=True, foreground=True, **options)
    except (RuntimeError, OSError) as exc:
        report(f"error: the kernel refused the mount at {mp} ({exc}); see the log {_log_file() or ''}")
        raise BadRequest(f"mount at {mp} failed ({exc})") from None
    finally:
        stop.set()
        report("error: the mount process stopped before the mount was ready")
        try:
            write_stats(mp, fs, kernel[0] if kernel else None)
            if (read_state(mp) or {}).get("pid") == os.getpid():
                os.unlink(state_path(mp))
        except OSError:
            pass


def stats_path(mountpoint: str) -> str:
    return os.path.join(state_dir(), _key(mountpoint) + ".stats.json")


def write_stats(mountpoint: str, fs: FabricFS, kernel: ImmutableMount | None = None) -> None:
    """The mount's counters as JSON beside its state file (``kernel``: the mount served on the
    kernel's protocol, with its passthrough counters)."""
    data = {
        "ops": fs.stats.snapshot(),
        "read_bytes": fs.reads.read_bytes,
        "fetched_chunks": fs.reads.fetcher.fetched_chunks,
        "fetched_bytes": fs.reads.fetcher.fetched_bytes,
        "frame_requests": fs.reads.fetcher.requests,
        "siblings_window_bytes": fs.reads.siblings_window,
        "listings": fs.state.ns.lists,
        "memory_cache_bytes": fs.reads.memory.size,
        "server_outages": fs.health.outages,
        "server_retries": fs.health.retries,
        "server_waits_refused": fs.health.refused,  # failed at once: no thread left to wait (fuse.outage)
        "unstaged_files": sum(1 for w in list(fs.state.files.values()) if w.dirty),
        "streamed_writes": fs.state.streams.snapshot() if fs.state.streams is not None else None,
        "writeback": fs.writes.writeback.snapshot() if fs.writes.writeback is not None else None,
        "kernel": kernel.snapshot() if kernel is not None else None,
        "seeded_copies": fs.writes.seeds.snapshot() if fs.writes.seeds is not None else None,
        "checkpoint_commits": fs.checkpoints.snapshot() if fs.checkpoints is not None else None,
    }
    write_json(stats_path(mountpoint), data)


def read_stats(mountpoint: str) -> dict:
    with open(stats_path(mountpoint)) as f:
        return json.load(f)


def _log_file() -> str | None:
    for h in logging.getLogger().handlers:
        name = getattr(h, "baseFilename", None)
        if name:
            return name
    return None


def spawn(argv: list[str], mountpoint: str, log_path: str, timeout: float = READY_TIMEOUT) -> int:
    """Start ``argv`` (the mount command in the foreground) detached; wait for it to be ready.

    Returns the pid; raises :class:`BadRequest` with the process's own words if it fails.
    """
    r, w = os.pipe()
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [*argv, "--ready-fd", str(w)],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            pass_fds=(w,),
            start_new_session=True,
            close_fds=True,
        )
    os.close(w)
    deadline = time.monotonic() + timeout
    buf = b""
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 0.5)
            if ready:
                piece = os.read(r, 4096)
                if not piece:
                    break
                buf += piece
                if buf.endswith(b"\n"):
                    break
            elif proc.poll() is not None:
                break
    finally:
        os.close(r)
    text = buf.decode(errors="replace").strip()
    if text == "ok":
        return proc.pid
    if not text:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # the pipe closed: the process is exiting, or crashed
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            text = f"the mount was not ready within {timeout:.0f}s"
        else:
            text = f"the mount process exited with code {proc.returncode}"
    raise BadRequest(f"{text.removeprefix('error: ')} (log: {log_path})")


def unmount(mountpoint: str, lazy: bool = False, timeout: float = 120.0) -> None:
    """Unmount and wait for the mount process to finish (its unmount-time flush and commit)."""
    mp = os.path.realpath(mountpoint)
    state = read_state(mp)
    if not os.path.ismount(mp) and not _stale(mp):
        if state is None:
            raise BadRequest(f"{mountpoint!r} is not a mount point")
    else:
        fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
        if fusermount:
            cmd = [fusermount, "-u", *(["-z"] if lazy else []), mp]
        else:
            cmd = ["umount", *(["-l"] if lazy else []), mp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip()
            hint = " (files are open or a process has its working directory there; close them or use --lazy)" if "busy" in msg.lower() else ""
            raise BadRequest(f"cannot unmount {mountpoint}: {msg}{hint}")
    pid = (state or {}).get("pid")
    if pid:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process_alive(pid):
            time.sleep(0.05)
        if process_alive(pid):
            raise BadRequest(f"unmounted, but the mount process {pid} is still finishing after {timeout:.0f}s (see its log)")
    try:
        os.unlink(state_path(mp))
    except OSError:
        pass


def _stale(mp: str) -> bool:
    """A FUSE mount whose process is gone ("Transport endpoint is not connected")."""
    try:
        os.lstat(mp)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def setup_logging(log_file: str | None, level: str) -> None:
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    logging.getLogger("fuse").setLevel(logging.WARNING if level.lower() != "debug" else logging.DEBUG)
