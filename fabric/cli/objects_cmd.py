"""Reading and writing paths: ``ls``, ``cat``, ``stat``, ``put``, ``rm``, ``status``."""

from __future__ import annotations

import sys
import time

import click

from fabric.cli.context import Ctx, handle_errors, human_size, pass_ctx
from fabric.cli.transfer_cmd import repo_branch


def repo_ref(ctx: Ctx, spec: str) -> tuple[str, str]:
    from fabric.engine.refs import split_repo_ref

    repo, ref = split_repo_ref(spec)
    return repo, ref or ctx.plane.get_repo(repo)["default_branch"]


@click.command("ls")
@click.argument("source", metavar="REPO@REF")
@click.argument("path", default="")
@click.option("-r", "--recursive", is_flag=True, help="List every path below, not just one level.")
@click.option("--after", default="", help="Start after this path (pagination).")
@click.option("-n", "--limit", type=click.IntRange(1), default=None, help="At most this many lines.")
@pass_ctx
@handle_errors
def ls(ctx: Ctx, source: str, path: str, recursive: bool, after: str, limit: int | None) -> None:
    """List the files and directories of PATH at REPO@REF."""
    repo, ref = repo_ref(ctx, source)
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    rows: list[dict] = []
    page_after = after
    while True:
        want = min(1000, limit - len(rows)) if limit else 1000
        page = ctx.plane.list(repo, ref, prefix, "" if recursive else "/", page_after, want)
        rows.extend({"path": p, "type": "dir"} for p in page.prefixes)
        rows.extend({"path": p, **e.describe()} for p, e in page.entries)
        if page.next_after is None or (limit and len(rows) >= limit):
            break
        page_after = page.next_after
    rows.sort(key=lambda r: r["path"])

    def human(rs: list[dict]) -> str:
        lines = []
        for r in rs:
            if r["type"] == "dir" and "size" not in r:
                lines.append(f"{'':>10}  {'':16}  {r['path']}")
            else:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["mtime"]))
                suffix = f" -> {r['target']}" if r["type"] == "symlink" else ("/" if r["type"] == "dir" else "")
                lines.append(f"{r['size']:>10}  {when}  {r['path']}{suffix}")
        return "\n".join(lines)

    ctx.emit(rows, human)


@click.command("cat")
@click.argument("source", metavar="REPO@REF")
@click.argument("path")
@pass_ctx
@handle_errors
def cat(ctx: Ctx, source: str, path: str) -> None:
    """Write the content of file PATH at REPO@REF to standard output."""
    repo, ref = repo_ref(ctx, source)
    out = sys.stdout.buffer
    for piece in ctx.plane.read_stream(repo, ref, path):
        out.write(piece)
    out.flush()


@click.command("stat")
@click.argument("source", metavar="REPO@REF")
@click.argument("path")
@pass_ctx
@handle_errors
def stat(ctx: Ctx, source: str, path: str) -> None:
    """Show the entry of PATH at REPO@REF (type, size, mode, mtime, ETag)."""
    repo, ref = repo_ref(ctx, source)
    info = {"path": path, **ctx.plane.stat(repo, ref, path).describe()}
    ctx.emit(info, lambda d: "\n".join(f"{k}: {v}" for k, v in d.items()))


@click.command("put")
@click.argument("target", metavar="REPO@BRANCH")
@click.argument("path")
@click.argument("file", type=click.File("rb"))
@pass_ctx
@handle_errors
def put(ctx: Ctx, target: str, path: str, file) -> None:
    """Upload FILE ('-' for stdin) to PATH on a branch (uncommitted until `fabric commit`)."""
    repo, branch = repo_branch(target)
    entry = ctx.plane.put_object(repo, branch, path, file)
    ctx.emit({"path": path, **entry.describe()}, f"staged {path} ({human_size(entry.size)})")


@click.command("rm")
@click.argument("target", metavar="REPO@BRANCH")
@click.argument("paths", nargs=-1, required=True)
@pass_ctx
@handle_errors
def rm(ctx: Ctx, target: str, paths: tuple[str, ...]) -> None:
    """Delete PATHS on a branch (uncommitted until `fabric commit`)."""
    repo, branch = repo_branch(target)
    for path in paths:
        ctx.plane.delete_object(repo, branch, path)
    ctx.emit({"deleted": list(paths)}, f"staged deletion of {len(paths)} path(s)")


@click.command("status")
@click.argument("target", metavar="REPO@BRANCH")
@pass_ctx
@handle_errors
def status(ctx: Ctx, target: str) -> None:
    """Show the uncommitted changes of a branch."""
    repo, branch = repo_branch(target)
    changes = [c.describe() for c in ctx.plane.uncommitted(repo, branch)]
    ctx.emit(changes, lambda cs: "\n".join(f"{c['type'][0].upper()} {c['path']}" for c in cs) or "nothing to commit")


def register(cli: click.Group) -> None:
    for cmd in (ls, cat, stat, put, rm, status):
        cli.add_command(cmd)
