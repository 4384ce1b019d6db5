"""``fabric token create|list|revoke|whoami`` (against a hub)."""

from __future__ import annotations

import time

import click

from fabric.cli.context import Ctx, handle_errors, pass_ctx


@click.group("token")
def token() -> None:
    """Manage API tokens (needs --server and an admin token)."""


@token.command("create")
@click.option("--name", default=None, help="A label for the token (default: derived from the roles).")
@click.option("--repo", "repos", multiple=True, metavar="REPO", help="Repository the role applies to ('*' for all); repeatable.")
@click.option("--role", type=click.Choice(["read", "write", "admin"]), help="Role on each --repo.")
@click.option("--admin", is_flag=True, help="A global administrator token.")
@click.option("--create-repos", is_flag=True, help="May create repositories (and S3 buckets); owns each one it creates.")
@click.option(
    "--spoke",
    is_flag=True,
    help="The token of a spoke: may verify S3 signatures for the repositories its --repo roles cover (never more), "
    "and create repositories for callers that hold --create-repos.",
)
@pass_ctx
@handle_errors
def create(
    ctx: Ctx, name: str | None, repos: tuple[str, ...], role: str | None, admin: bool, create_repos: bool, spoke: bool
) -> None:
    """Create a token. Prints it once (with --json also its S3 access key pair).

    \b
    Examples:
      fabric token create --repo datasets --role read
      fabric token create --repo '*' --role write --name ci
      fabric token create --admin --name ops
      fabric token create --create-repos --name alice
      fabric token create --spoke --repo '*' --role write --name spoke-eu
    """
    if repos and not role:
        raise click.UsageError("--repo needs --role")
    if role and not repos:
        raise click.UsageError("--role needs at least one --repo")
    roles = {r: role for r in repos} if role else {}
    rights = [r for r, on in (("create-repos", create_repos), ("spoke", spoke)) if on]
    label = name or ("admin" if admin else ",".join([f"{r}:{role}" for r in repos] + rights))
    info = ctx.remote().create_token(label, admin, roles, rights)
    ctx.emit(info, lambda d: d["token"])


@token.command("list")
@pass_ctx
@handle_errors
def list_(ctx: Ctx) -> None:
    """List tokens (never their secrets)."""

    def human(rows: list[dict]) -> str:
        lines = []
        for t in rows:
            roles = "admin" if t["admin"] else ",".join([f"{k}:{v}" for k, v in t["roles"].items()] + t.get("rights", []))
            state = "revoked" if t["revoked"] else "active"
            when = time.strftime("%Y-%m-%d", time.localtime(t["created"]))
            lines.append(f"{t['id']}\t{state}\t{when}\t{t['name']}\t{roles}")
        return "\n".join(lines)

    ctx.emit(ctx.remote().list_tokens(), human)


@token.command("revoke")
@click.argument("token_id")
@pass_ctx
@handle_errors
def revoke(ctx: Ctx, token_id: str) -> None:
    """Revoke token TOKEN_ID (see `fabric token list`)."""
    ctx.remote().revoke_token(token_id)
    ctx.emit({"revoked": token_id}, f"revoked token {token_id}")


@token.command("whoami")
@pass_ctx
@handle_errors
def whoami(ctx: Ctx) -> None:
    """Show which token you are using, its roles and its rights."""
    ctx.emit(ctx.remote().whoami(), lambda d: "\n".join(f"{k}: {v}" for k, v in d.items()))


def register(cli: click.Group) -> None:
    cli.add_command(token)
