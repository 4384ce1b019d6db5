"""The deployment a soak runs against: server processes that can be killed, paused and restarted
on the same port and data, WAN links in front of the hub, FUSE mounts, a small disk for a cache.

Everything is a real process on loopback; nothing here knows about faults or the ledger.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from fabric.util.net import free_port
from testbed.wanproxy import WanProxy
from tests.hubserver import ROOT, hub_env

FABRIC = [sys.executable, "-m", "fabric.cli.main"]
START_TIMEOUT = 60.0


class Proc:
    """One server process (hub or spoke) on a fixed port; killable, pausable, restartable."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: str, env: dict | None = None) -> None:
        self.name, self.argv, self.port, self.log_path, self.env = name, argv, port, log_path, env
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.started_at = 0.0
        self.incarnation = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=hub_env(self.env), cwd=ROOT)
        self.paused = False
        # The fd baseline is taken 5 s after the process answers, not after it was forked (a
        # process still importing on a busy machine has 3 fds, which would make the bound tiny).
        self.started_at = float("inf")
        self.incarnation += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; log {self.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2.0).status_code == 200:
                    self.started_at = time.monotonic()
                    return
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"{self.name} was not healthy within {timeout:.0f}s; log {self.log_path}")

    def kill(self) -> None:
        """kill -9 (also of a paused process)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def pause(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


class Mount:
    """A ``fabric mount`` process; the writer reaches it only through a directory fd of one
    session, so a killed mount gives ENOTCONN instead of writes into the bare mount point."""

    def __init__(self, name: str, server: str, target: str, mountpoint: str, token: str, options: list[str]) -> None:
        self.name, self.server, self.target, self.mountpoint = name, server, target, mountpoint
        self.token, self.options = token, options
        self.log_path = mountpoint.rstrip("/") + ".mount.log"
        self.generation = 0
        self.up = False
        self.pid: int | None = None
        self.incarnation = 0
        self.started_at = 0.0
        self.lock = threading.Lock()
        os.makedirs(mountpoint, exist_ok=True)

    def start(self) -> None:
        env = hub_env({"FABRIC_TOKEN": self.token})
        r = subprocess.run(
            [*FABRIC, "mount", self.server, self.target, self.mountpoint, "--log-file", self.log_path, *self.options],
            env=env, capture_output=True, text=True, timeout=90, cwd=ROOT,
        )
        if r.returncode != 0:
            raise RuntimeError(f"fabric mount {self.target} failed: {r.stderr[-2000:]}")
        from fuse.mount import read_state

        state = read_state(self.mountpoint) or {}
        with self.lock:
            self.pid = state.get("pid")
            self.generation += 1
            self.incarnation += 1
            self.started_at = time.monotonic()
            self.up = True

    def open_root(self) -> tuple[int, int] | None:
        """(generation, O_DIRECTORY fd of the mounted root), or None while the mount is down."""
        with self.lock:
            if not self.up:
                return None
            gen = self.generation
            fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        parent = os.stat(os.path.dirname(self.mountpoint.rstrip("/")))
        if os.fstat(fd).st_dev == parent.st_dev:  # not the FUSE file system: the bare directory
            os.close(fd)
            return None
        return gen, fd

    def kill(self) -> None:
        with self.lock:
            self.up = False
            pid = self.pid
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _running(pid):
                time.sleep(0.05)
        self.force_unmount()

    def mounted(self) -> bool:
        """Whether the kernel still has a mount here. Not os.path.ismount: on a FUSE mount whose
        process is dead, stat fails with ENOTCONN and ismount answers False."""
        mp = os.path.realpath(self.mountpoint)
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == mp for line in f if len(line.split()) > 1)

    def force_unmount(self) -> None:
        for cmd in (["fusermount3", "-u", "-z", self.mountpoint], ["umount", "-l", self.mountpoint]):
            if self.mounted():
                subprocess.run(cmd, capture_output=True, timeout=30)
        if os.path.exists(self.mountpoint):  # drop the state a dead mount left (fabric umount cleans it)
            subprocess.run([*FABRIC, "umount", self.mountpoint, "--timeout", "5"], capture_output=True, timeout=60,
                           env=hub_env(), cwd=ROOT)

    def stop(self) -> None:
        with self.lock:
            self.up = False
        if self.mounted():
            subprocess.run([*FABRIC, "umount", self.mountpoint, "--timeout", "30"], capture_output=True, timeout=60,
                           env=hub_env(), cwd=ROOT)
        self.force_unmount()
        if self.pid and _running(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


class SmallDisk:
    """A size-limited file system for one spoke's cache: a tmpfs when we may mount one (root),
    else None (the disk-full fault is then not drawn). ``fill()`` takes every free byte,
    ``free()`` gives them back."""

    def __init__(self, path: str, size_mib: int) -> None:
        self.path = path
        self.fill_path = os.path.join(path, ".chaos-fill")
        os.makedirs(path, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", path], capture_output=True)
        self.mounted = r.returncode == 0

    def fill(self) -> int:
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize
        fd = os.open(self.fill_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, 0, max(free, 4096))
        finally:
            os.close(fd)
        return free

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.fill_path)

    def release(self) -> None:
        self.free()
        if self.mounted:
            subprocess.run(["umount", "-l", self.path], capture_output=True)
            self.mounted = False


@dataclass
class SpokeNode:
    name: str
    proc: Proc
    links: list[WanProxy]  # one per hub process, each the spoke's way to it
    cache: str
    s3_url: str
    disk: SmallDisk | None = None


@dataclass
class Deployment:
    hubs: list[Proc]
    spokes: list[SpokeNode]
    admin_token: str
    hub_data: list[str]
    db: str | None = None
    store: str | None = None
    mounts: dict[str, Mount] = field(default_factory=dict)

    def hub_url(self) -> str:
        return self.hubs[0].url

    def processes(self) -> dict[str, object]:
        out: dict[str, object] = {h.name: h for h in self.hubs}
        out.update({s.name: s.proc for s in self.spokes})
        out.update(self.mounts)
        return out


def hub_proc(name: str, data: str, db: str | None, store: str | None, s3: bool = False) -> Proc:
    port = free_port()
    argv = [*FABRIC, "hub", "--data", data, "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
    if db:
        argv += ["--db", db]
    if store:
        argv += ["--store", store]
    os.makedirs(os.path.dirname(data), exist_ok=True)
    return Proc(name, argv, port, data.rstrip("/") + ".log")


def spoke_node(name: str, workdir: str, hubs: list[Proc], token: str, group: str, small_disk: bool,
               rtt_ms: float = 10.0) -> SpokeNode:
    links = [WanProxy("127.0.0.1", h.port, delay_ms_up=rtt_ms / 2, delay_ms_down=rtt_ms / 2).start() for h in hubs]
    cache = os.path.join(workdir, f"{name}-cache")
    disk = SmallDisk(cache, 192) if small_disk else None
    if disk is not None and not disk.mounted:
        disk = None
    port, s3_port = free_port(), free_port()
    argv = [
        *FABRIC, "spoke", "--hub", ",".join(link.url_for() for link in links), "--cache", cache,
        "--cache-size", "64MiB", "--listen", f"127.0.0.1:{port}", "--s3-listen", f"127.0.0.1:{s3_port}",
        "--token", token, "--durability", "local", "--lease", "1",
        "--hub-timeout", "connect=3,read=5,write=20,pool=5,slow=30", "--full-wait", "3",
        "--group", group, "--advertise", f"http://127.0.0.1:{port}", "--log-level", "warning",
    ]
    proc = Proc(name, argv, port, os.path.join(workdir, f"{name}.log"))
    return SpokeNode(name, proc, links, cache, f"http://127.0.0.1:{s3_port}", disk)
