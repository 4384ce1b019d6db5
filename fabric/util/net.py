"""Small networking helpers shared by the services and their tests."""

from __future__ import annotations

import socket

from fabric.errors import BadRequest


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``) -> ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise BadRequest(f"invalid listen address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8600")
    return host.strip("[]") or "0.0.0.0", int(port)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
