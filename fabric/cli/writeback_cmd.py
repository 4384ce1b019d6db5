"""``fabric writeback list|retry|drop`` (against a spoke): writes its hub refused for good."""

from __future__ import annotations

from typing import Any

import click

from fabric.cli.context import Ctx, handle_errors, pass_ctx
from fabric.errors import Unavailable


def _call(ctx: Ctx, method: str, path: str) -> Any:
    """One call of the spoke's ``/api/v1/writeback`` routes; its JSON answer."""
    import httpx

    from fabric.client.http import raise_for_error

    plane = ctx.remote()
    try:
        response = plane.http.request(method, "/writeback" + path)
    except httpx.TransportError as exc:
        raise Unavailable(f"cannot reach {plane.url}: {exc}") from exc
    raise_for_error(response)
    return response.json()


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


@click.group("writeback")
def writeback() -> None:
    """Parked writes of a spoke's write-back queue (needs --server SPOKE and an admin token).

    A write accepted with local durability that the hub refuses for good (its branch
    was deleted, the spoke's token may no longer write there, a bad request) is parked:
    kept with its error, and the later writes of its branch wait behind it."""


@writeback.command("list")
@pass_ctx
@handle_errors
def list_(ctx: Ctx) -> None:
    """List parked writes: id, age, repository@branch, path, error."""

    def human(rows: list[dict]) -> str:
        lines = []
        for p in rows:
            held = f" ({p['held']} held behind)" if p["held"] else ""
            what = f"{p['path']} (delete)" if p["delete"] else p["path"]
            lines.append(f"{p['id']}\t{_age(p['age'])}\t{p['repo']}@{p['branch']}\t{what}\t{p['error']}{held}")
        return "\n".join(lines) or "no parked writes"

    ctx.emit(_call(ctx, "GET", "/parked"), human)


def _target(op_id: int | None, all_: bool) -> str:
    if (op_id is None) == (not all_):
        raise click.UsageError("give one parked write's ID, or --all")
    return "/parked" if all_ else f"/parked/{op_id}"


@writeback.command("retry")
@click.argument("op_id", metavar="ID", type=int, required=False)
@click.option("--all", "all_", is_flag=True, help="Every parked write.")
@pass_ctx
@handle_errors
def retry(ctx: Ctx, op_id: int | None, all_: bool) -> None:
    """Queue parked write ID (or --all) again, e.g. after recreating its branch."""
    path = _target(op_id, all_)
    moved = _call(ctx, "POST", path + "/retry")
    ctx.emit(moved, f"queued {moved['count']} parked write(s) again")


@writeback.command("drop")
@click.argument("op_id", metavar="ID", type=int, required=False)
@click.option("--all", "all_", is_flag=True, help="Every parked write.")
@pass_ctx
@handle_errors
def drop(ctx: Ctx, op_id: int | None, all_: bool) -> None:
    """Delete parked write ID (or --all) for good: it never reaches the hub."""
    moved = _call(ctx, "DELETE", _target(op_id, all_))
    ctx.emit(moved, f"dropped {moved['count']} parked write(s)")


def register(cli: click.Group) -> None:
    cli.add_command(writeback)
