"""The driver's gRPC server on a unix socket, and its request log (secrets left out)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import text_format

from csi.controller import Controller
from csi.identity import Identity
from csi.mounts import Mounts
from csi.node import Node
from csi.proto import services

log = logging.getLogger("fabric.csi")

DRIVER_NAME = "csi.fabric.dev"
WORKERS = 8  # kubelet and the provisioner call a few RPCs at once; each volume one at a time


def redacted(request) -> str:
    """The request as one line of text, with the values of ``secrets`` left out."""
    copy = type(request)()
    copy.CopyFrom(request)
    keys = []
    if "secrets" in copy.DESCRIPTOR.fields_by_name:
        keys = sorted(copy.secrets)
        copy.ClearField("secrets")
    text = text_format.MessageToString(copy, as_one_line=True)
    return text + (f" secrets=<{','.join(keys)}>" if keys else "")


class RequestLog(grpc.ServerInterceptor):
    """Logs each call: method, request without secrets, outcome, duration."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary

        def logged(request, context):
            start = time.monotonic()
            try:
                response = inner(request, context)
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                log.info("%s %s -> %s: %s (%.3f s)", method, redacted(request), code.name, context.details(), time.monotonic() - start)
                raise
            log.info("%s %s -> OK (%.3f s)", method, redacted(request), time.monotonic() - start)
            return response

        return grpc.unary_unary_rpc_method_handler(logged, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def unix_socket_path(endpoint: str) -> str:
    """``unix:///csi/csi.sock`` (or a plain path) -> ``/csi/csi.sock``."""
    if endpoint.startswith("unix://"):
        endpoint = endpoint[len("unix://") :]
    if not endpoint.startswith("/"):
        raise ValueError(f"endpoint {endpoint!r}: give unix:///ABSOLUTE/PATH (kubelet talks to CSI drivers over unix sockets)")
    return endpoint


def serve(
    endpoint: str,
    node_id: str,
    state_dir: str,
    controller: bool,
    node: bool,
    stop: threading.Event,
    mounter_socket: str | None = None,
    driver_name: str = DRIVER_NAME,
    local_spokes: dict[str, str] | None = None,
    local_spoke_copies: dict[str, str] | None = None,
) -> None:
    """Serve Identity, and Controller and/or Node, on ``endpoint`` until ``stop`` is set."""
    path = unix_socket_path(endpoint)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by an earlier driver process
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS), interceptors=[RequestLog()])
    services.add_IdentityServicer_to_server(Identity(driver_name, controller, mounter_socket if node else None), server)
    if controller:
        services.add_ControllerServicer_to_server(Controller(os.path.join(state_dir, "controller")), server)
    if node:
        if mounter_socket:
            from csi.mounter import RemoteMounts

            mounts: Mounts = RemoteMounts(state_dir, mounter_socket)
        else:
            mounts = Mounts(state_dir)
        services.add_NodeServicer_to_server(Node(node_id, mounts, local_spokes, local_spoke_copies), server)
    old = os.umask(0o177)  # the socket: root only
    try:
        server.add_insecure_port("unix://" + path)
        server.start()
    finally:
        os.umask(old)
    roles = " and ".join(r for r, on in (("controller", controller), ("node", node)) if on)
    log.info("%s %s serving %s on %s (node %s, state %s)", driver_name, roles, "identity, " + roles, path, node_id, state_dir)
    stop.wait()
    server.stop(grace=5).wait()
    log.info("stopped")
