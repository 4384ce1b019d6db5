"""``fabric up``: run a hub (and the services beside it) on embedded defaults."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import click

from fabric.cli.context import handle_errors

if TYPE_CHECKING:
    import subprocess

BASE = ".fabric"


def _service_commands(base: str, host: str) -> list[tuple[str, str, list[str]]]:
    """``(name, url, argv)`` of each service `fabric up` starts."""
    hub_url = f"http://{host}:8600"
    hub = ["hub", "--data", os.path.join(base, "hub"), "--listen", f"{host}:8600", "--s3-listen", f"{host}:8601"]
    spoke = ["spoke", "--hub", hub_url, "--cache", os.path.join(base, "spoke"), "--cache-size", "2G"]
    return [
        ("hub", hub_url, hub),
        ("spoke", f"http://{host}:8700", [*spoke, "--listen", f"{host}:8700", "--s3-listen", f"{host}:8701"]),
    ]


def _require_free(url: str) -> None:
    """Refuse to start where something already listens (its health check would fool us)."""
    import socket

    host, port = url.split("://", 1)[1].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if s.connect_ex((host, int(port))) == 0:
            raise click.ClickException(f"{host}:{port} is already in use (another `fabric up`?); stop it first")


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"service at {url} exited with code {proc.returncode}; see the log above")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise click.ClickException(f"service at {url} did not become healthy within {timeout:.0f}s")


@click.command("up")
@click.option("--base", default=BASE, show_default=True, metavar="DIR", help="Where the services keep their data.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@handle_errors
def up(base: str, host: str) -> None:
    """Run a hub and a spoke on embedded defaults (SQLite, local store under DIR) until Ctrl-C.

    Prints the URLs and the admin token to use with --server/--token.
    """
    import signal
    import subprocess  # here, not at the top: `fabric --version` and the other commands do not need them

    procs: list[subprocess.Popen] = []

    def stop(*_: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    signal.signal(signal.SIGTERM, lambda *a: (stop(), sys.exit(0)))
    try:
        token = ""
        for name, url, argv in _service_commands(base, host):
            for address in (url, url[:-1] + "1"):  # the REST and S3 listeners
                _require_free(address)
            env = dict(os.environ, FABRIC_TOKEN=token)
            proc = subprocess.Popen([sys.executable, "-m", "fabric.cli.main", *argv], env=env)
            procs.append(proc)
            _wait_healthy(url, proc)
            click.echo(f"{name:5} {url}   S3 {url[:-1]}1")
            if name == "hub":
                with open(os.path.join(base, "hub", "admin.token")) as f:
                    token = f.read().strip()
        click.echo(f"\nexport FABRIC_SERVER=http://{host}:8600 FABRIC_TOKEN={token}")
        click.echo("Ctrl-C to stop.")
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop()


def register(cli: click.Group) -> None:
    cli.add_command(up)
