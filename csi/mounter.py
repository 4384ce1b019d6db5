"""The mounter: a long-lived process that owns a node's mount processes.

In Kubernetes, restarting or upgrading a container kills every process it
started. So the node plugin can hand mounting to ``fabric csi mounter``, which
runs as a DaemonSet of its own that is replaced only on a drained node
(``deploy/kubernetes/base/csi/mounter.yaml``): the mount processes are the
mounter's children, and restarting or upgrading the driver leaves pods' volumes
mounted. Both pods share the host's PID namespace, so the driver sees whether a
mount process is alive. The driver talks to it over a unix socket (mode 0600), one JSON request
per connection; both read the publication records in the shared state directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading

from csi.mounts import MountFailed, Mounts, PublishRequest, SourceMissing

log = logging.getLogger("fabric.csi")

MAX_REQUEST = 64 * 1024
CLIENT_TIMEOUT = 300.0  # a publish waits for `fabric mount` (at most 150 s) and an unmount


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        mounts: Mounts = self.server.mounts  # type: ignore[attr-defined]
        self.request.settimeout(30)
        try:
            line = self.rfile.readline(MAX_REQUEST + 1)
            if len(line) > MAX_REQUEST:
                raise ValueError("request too large")
            req = json.loads(line)
            if req.get("op") == "publish":
                pub = mounts.publish(PublishRequest.from_json(req["request"]), req.get("token"))
                answer = {"ok": True, "pid": pub.pid}
            elif req.get("op") == "unpublish":
                mounts.unpublish(str(req["target"]))
                answer = {"ok": True}
            else:
                answer = {"ok": False, "kind": "bad", "message": f"unknown operation {req.get('op')!r}"}
        except SourceMissing as exc:
            answer = {"ok": False, "kind": "missing", "message": str(exc)}
        except MountFailed as exc:
            answer = {"ok": False, "kind": "failed", "message": str(exc)}
        except (ValueError, KeyError, TypeError) as exc:
            answer = {"ok": False, "kind": "bad", "message": f"bad request: {exc}"}
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(answer).encode() + b"\n")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_mounter(socket_path: str, mounts: Mounts, stop: threading.Event) -> None:
    """Serve mount requests on ``socket_path`` until ``stop`` is set."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    os.makedirs(os.path.dirname(socket_path) or ".", exist_ok=True)
    old = os.umask(0o177)
    try:
        server = _Server(socket_path, _Handler)
    finally:
        os.umask(old)
    server.mounts = mounts  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="csi-mounter", daemon=True)
    thread.start()
    log.info("mounter serving on %s (%d publications on record)", socket_path, len(mounts.all()))
    stop.wait()
    server.shutdown()
    server.server_close()


class RemoteMounts(Mounts):
    """:class:`Mounts` whose publish and unpublish run in the mounter process."""

    def __init__(self, state_dir: str, socket_path: str):
        super().__init__(state_dir)
        self.socket_path = socket_path

    def _call(self, request: dict) -> dict:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(CLIENT_TIMEOUT)
                s.connect(self.socket_path)
                s.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(s.makefile("rb").readline(MAX_REQUEST))
        except (OSError, ValueError) as exc:
            raise MountFailed(f"the mounter at {self.socket_path} did not answer: {exc}") from None
        if not answer.get("ok"):
            kind = SourceMissing if answer.get("kind") == "missing" else MountFailed
            raise kind(answer.get("message") or "the mounter refused")
        return answer

    def publish(self, req: PublishRequest, token: str | None):
        self._call({"op": "publish", "request": req.to_json(), "token": token})
        pub = self.get(req.target)
        if pub is None:
            raise MountFailed(f"the mounter published {req.target} but left no record of it")
        return pub

    def unpublish(self, target: str) -> None:
        self._call({"op": "unpublish", "target": target})
