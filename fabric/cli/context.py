"""What every command shares: where the data is, output format, error handling."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import TYPE_CHECKING, Any

import click

from fabric.errors import FabricError

if TYPE_CHECKING:  # the plane and its client are imported when a command first uses them (cheap start-up)
    from fabric.client.bandwidth import Bandwidth
    from fabric.plane.dataplane import DataPlane
    from fabric.util.progress import TqdmProgress

DEFAULT_DATA = os.path.join(".fabric", "hub")


@dataclass
class Ctx:
    data: str
    db: str | None
    store: str | None
    server: str | None
    token: str | None
    json: bool
    quiet: bool
    #: ``--bwlimit``: the caps on the traffic with --server (None: none).
    bwlimit: str | None = None
    _plane: Any = field(default=None, repr=False)

    def bandwidth(self) -> Bandwidth | None:
        """The caps of ``--bwlimit``; a usage error when there is no --server for them to limit."""
        if not self.bwlimit:
            return None
        if not self.server:
            raise click.UsageError("--bwlimit limits the traffic with a --server; without one, commands work on --data directly")
        from fabric.client.bandwidth import parse_bwlimit

        return parse_bwlimit(self.bwlimit)

    @property
    def plane(self) -> DataPlane:
        """What commands act on: the server at --server (or the nearest healthy one of a list), else the local data directory."""
        if self._plane is None:
            if self.server:
                from fabric.client.http import HttpPlane

                self._plane = HttpPlane(self.server, self.token, bandwidth=self.bandwidth())
            else:
                self.bandwidth()  # refused without a server
                from fabric.engine.engine import Engine

                self._plane = Engine.open(self.data, self.db, self.store)
        return self._plane

    def remote(self):  # noqa: ANN201 - HttpPlane, imported lazily
        """The server client; a usage error when no --server is given."""
        if not self.server:
            raise click.UsageError("this command talks to a server: give --server URL (or set FABRIC_SERVER)")
        return self.plane

    def progress(self) -> TqdmProgress:
        from fabric.util.progress import TqdmProgress

        return TqdmProgress(False if self.quiet else None)

    def emit(self, data: Any, human: Callable[[Any], str] | str | None = None) -> None:
        """Print ``data`` as JSON with --json, else its human rendering."""
        if self.json:
            import json

            click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        elif human is not None:
            text = human(data) if callable(human) else human
            if text:
                click.echo(text)


pass_ctx = click.make_pass_decorator(Ctx)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Ctx).json = True


json_option = click.option(
    "--json", is_flag=True, expose_value=False, is_eager=True, callback=_set_json, help="Print machine-readable JSON."
)


def handle_errors(fn: Callable) -> Callable:
    """Turn engine errors into a one-line message and the error's exit code.

    Also gives the command a ``--json`` flag (same as the global one).
    """

    @json_option
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FabricError as exc:
            ctx = click.get_current_context().find_object(Ctx)
            if ctx is not None and ctx.json:
                import json

                click.echo(json.dumps({"error": exc.to_dict()}, indent=2), err=True)
            else:
                click.echo(f"error: {exc.message}", err=True)
                for c in exc.details.get("conflicts", [])[:50]:
                    click.echo(f"  conflict: {c}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
