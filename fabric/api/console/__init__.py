"""The web console at ``/ui``, served by every hub and spoke from the same process.

Pages are rendered on the server (Jinja2, autoescaped) over the process's data plane as
the signed-in token; plots are SVG drawn on the server from a bounded sampler of the
service's counters; the one stylesheet ships in this package. Nothing is loaded from
elsewhere at run time. See ``docs/console.md``.

- :mod:`.views`: the pages and their access checks;
- :mod:`.sessions`: sign-in sessions (the token stays in the process, never in a page,
  a URL or a log) and CSRF tokens;
- :mod:`.series`: the sampler behind the plots; :mod:`.charts`: SVG line charts;
- :mod:`.preview`: text, image, CSV and parquet previews.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from fastapi import FastAPI

from fabric.api.console.series import Sampler
from fabric.api.console.views import Console, add_console
from fabric.auth.principal import Principal
from fabric.plane.dataplane import DataPlane

__all__ = ["ConsoleSource", "install_console"]


@dataclass
class ConsoleSource:
    """What a service tells its console.

    ``verify_token``: a token's principal (Unauthorized when it is not valid), as the REST
    API checks it; None when authentication is off. ``sample``: the service's counters for
    the plots (numbers by name; the HTTP totals are added). ``health``: a spoke's stats for
    its health page. ``spokes``: a hub's view of its spokes. ``repo_usage``: a hub's
    ``{"stored_bytes", "chunks"}`` of one repository."""

    verify_token: Callable[[str], Principal] | None
    sample: Callable[[], Mapping[str, object]] | None = None
    health: Callable[[], dict] | None = None
    spokes: Callable[[], dict] | None = None
    repo_usage: Callable[[str], dict] | None = None


def install_console(
    app: FastAPI,
    role: str,
    get_plane: Callable[[], DataPlane],
    source: ConsoleSource,
    http_totals: Callable[[], Mapping[str, float]],
) -> Console:
    """Serve the console on ``app``; its sampler runs while the app is being served."""

    def sample() -> dict[str, object]:
        values: dict[str, object] = dict(http_totals())
        if source.sample is not None:
            values.update(source.sample())
        return values

    sampler = Sampler(sample)
    console = Console(role, get_plane, source.verify_token, sampler, source.health, source.spokes, source.repo_usage)
    add_console(app, console)

    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[object]:
        sampler.start()
        try:
            async with inner(a) as state:
                yield state
        finally:
            sampler.stop()

    app.router.lifespan_context = lifespan
    return console
