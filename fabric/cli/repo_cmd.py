"""``fabric repo create|list|delete``."""

from __future__ import annotations

import time

import click

from fabric.cli.context import Ctx, handle_errors, pass_ctx


@click.group("repo")
def repo() -> None:
    """Create, list and delete repositories."""


@repo.command("create")
@click.argument("name")
@click.option("--default-branch", default="main", show_default=True, help="Name of the first branch.")
@pass_ctx
@handle_errors
def create(ctx: Ctx, name: str, default_branch: str) -> None:
    """Create repository NAME (3-63 of a-z, 0-9 and '-') with an empty first commit."""
    info = ctx.plane.create_repo(name, default_branch)
    ctx.emit(info, f"created repository {name} (default branch {default_branch})")


@repo.command("list")
@pass_ctx
@handle_errors
def list_(ctx: Ctx) -> None:
    """List repositories."""
    repos = ctx.plane.list_repos()
    ctx.emit(repos, lambda rs: "\n".join(f"{r['name']}\t{r['default_branch']}\t{time.strftime('%Y-%m-%d %H:%M', time.localtime(r['created']))}" for r in rs))


@repo.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_ctx
@handle_errors
def delete(ctx: Ctx, name: str, yes: bool) -> None:
    """Delete repository NAME with all its branches, tags and history.

    The data becomes garbage that `fabric gc` reclaims after its grace period.
    """
    ctx.plane.get_repo(name)
    if not yes and not ctx.json:
        click.confirm(f"Delete repository {name!r} and all its history?", abort=True)
    ctx.plane.delete_repo(name)
    ctx.emit({"deleted": name}, f"deleted repository {name}")


def register(cli: click.Group) -> None:
    cli.add_command(repo)
