"""A real CSI driver for tests: ``fabric csi`` (and ``fabric csi mounter``) on unix sockets.

Usage::

    with CsiDriver(tmp_path) as d:                   # controller + node, state in tmp_path/state
        d.node.NodeGetInfo(pb.NodeGetInfoRequest())  # stubs: d.identity, d.controller, d.node
        d.kill(); d.start()                          # kill -9 and restart (mounts stay)

``CsiDriver(tmp_path, mounter=True)`` also runs ``fabric csi mounter`` and the driver
hands it every mount. On exit every volume still published is unmounted, so a failing
test leaves no mount behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc

from csi.mounts import Mounts
from csi.proto import services
from tests.fuse_helpers import FABRIC, env
from tests.hubserver import ROOT

START_TIMEOUT = 60.0


def _wait_for_socket(path: str, proc: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear; log:\n{Path(log_path).read_text()[-3000:]}")
        time.sleep(0.05)


class CsiDriver:
    def __init__(
        self, tmp: Path, mounter: bool = False, node_id: str = "node-1", local_spokes: tuple[str, ...] = (),
        local_spoke_copies: tuple[str, ...] = (),
    ):
        self.tmp = tmp
        os.makedirs(tmp, exist_ok=True)
        self.socket = str(tmp / "plugin" / "csi.sock")
        self.state = str(tmp / "state")
        self.log_path = str(tmp / "csi.log")
        self.node_id = node_id
        self.local_spokes = local_spokes  # --local-spoke URL=DIR values
        self.local_spoke_copies = local_spoke_copies  # --local-spoke-copies URL=DIR values
        self.mounter_socket = str(tmp / "mounter" / "mounter.sock") if mounter else None
        self.mounter_log = str(tmp / "mounter.log")
        self.proc: subprocess.Popen | None = None
        self.mounter_proc: subprocess.Popen | None = None
        self.channel: grpc.Channel | None = None

    def _spawn(self, args: list[str], log_path: str) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen([*FABRIC, *args], env=env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> None:
        if self.mounter_socket and (self.mounter_proc is None or self.mounter_proc.poll() is not None):
            self.mounter_proc = self._spawn(["csi", "mounter", "--socket", self.mounter_socket, "--state-dir", self.state], self.mounter_log)
            _wait_for_socket(self.mounter_socket, self.mounter_proc, self.mounter_log)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        args = ["csi", "--endpoint", "unix://" + self.socket, "--node-id", self.node_id, "--controller", "--node", "--state-dir", self.state]
        if self.mounter_socket:
            args += ["--mounter-socket", self.mounter_socket]
        for value in self.local_spokes:
            args += ["--local-spoke", value]
        for value in self.local_spoke_copies:
            args += ["--local-spoke-copies", value]
        self.proc = self._spawn(args, self.log_path)
        _wait_for_socket(self.socket, self.proc, self.log_path)
        self.channel = grpc.insecure_channel("unix://" + self.socket)
        grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT)
        self.identity = services.IdentityStub(self.channel)
        self.controller = services.ControllerStub(self.channel)
        self.node = services.NodeStub(self.channel)

    def kill(self) -> None:
        """kill -9 the driver process (not the mounter, not the mount processes)."""
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def all_logs(self) -> str:
        """The driver's, the mounter's and every mount process's log."""
        texts = [self.log()]
        paths = [self.mounter_log, *(str(p) for p in Path(self.state, "logs").glob("*.log"))]
        texts += [Path(p).read_text(errors="replace") for p in paths if os.path.exists(p)]
        return "\n".join(texts)

    def __enter__(self) -> CsiDriver:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        if self.mounter_proc is not None and self.mounter_proc.poll() is None:
            self.mounter_proc.terminate()
            self.mounter_proc.wait(30)
        mounts = Mounts(self.state)
        for pub in mounts.all():
            mounts.unpublish(pub.target)
