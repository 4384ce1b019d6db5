"""History: ``commit``, ``log``, ``diff``, ``merge``, ``revert``, ``branch``, ``tag``."""

from __future__ import annotations

import time

import click

from fabric.cli.context import Ctx, handle_errors, pass_ctx
from fabric.cli.objects_cmd import repo_ref
from fabric.cli.transfer_cmd import repo_branch


def _commit_line(c: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["time"]))
    return f"{c['id'][:12]}  {when}  {c['author']}  {c['message'].splitlines()[0] if c['message'] else ''}"


@click.command("commit")
@click.argument("target", metavar="REPO@BRANCH")
@click.option("-m", "--message", required=True, help="Commit message.")
@click.option("--meta", multiple=True, metavar="KEY=VALUE", help="Commit metadata (repeatable).")
@click.option("--expect-head", metavar="COMMIT", help="Fail with a conflict unless the branch is at COMMIT.")
@click.option("--allow-empty", is_flag=True, help="Commit even when nothing is staged.")
@click.option("--author", help="Commit author.")
@pass_ctx
@handle_errors
def commit(ctx: Ctx, target: str, message: str, meta: tuple[str, ...], expect_head: str | None, allow_empty: bool, author: str | None) -> None:
    """Commit the uncommitted changes of a branch. Prints the new commit id."""
    repo, branch = repo_branch(target)
    metadata = dict(_kv(m) for m in meta)
    c = ctx.plane.commit(repo, branch, message, author, metadata, expect_head, allow_empty)
    ctx.emit(c.describe(), c.id)


def _kv(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise click.BadParameter(f"{text!r} is not KEY=VALUE")
    k, v = text.split("=", 1)
    return k, v


@click.command("log")
@click.argument("source", metavar="REPO@REF")
@click.option("--path", help="Only commits that changed this path (file or directory).")
@click.option("-n", "--limit", type=click.IntRange(1), default=100, show_default=True, help="At most this many commits.")
@click.option("--after", metavar="COMMIT", help="Continue after this commit (pagination).")
@pass_ctx
@handle_errors
def log(ctx: Ctx, source: str, path: str | None, limit: int, after: str | None) -> None:
    """Show the history of REPO@REF, newest first."""
    repo, ref = repo_ref(ctx, source)
    commits = [c.describe() for c in ctx.plane.log(repo, ref, path, limit, after)]
    ctx.emit(commits, lambda cs: "\n".join(_commit_line(c) for c in cs))


@click.command("diff")
@click.argument("repo")
@click.argument("left")
@click.argument("right")
@click.option("--prefix", default="", help="Only paths under this prefix.")
@pass_ctx
@handle_errors
def diff(ctx: Ctx, repo: str, left: str, right: str, prefix: str) -> None:
    """Show the paths that differ between refs LEFT and RIGHT of REPO."""
    changes = [c.describe() for c in ctx.plane.diff(repo, left, right, prefix)]
    marks = {"added": "+", "removed": "-", "changed": "~"}
    ctx.emit(changes, lambda cs: "\n".join(f"{marks[c['type']]} {c['path']}" for c in cs))


@click.command("merge")
@click.argument("repo")
@click.argument("source")
@click.argument("dest")
@click.option("--strategy", type=click.Choice(["ours", "theirs"]), help="Resolve conflicts with the destination's (ours) or source's (theirs) version.")
@click.option("-m", "--message", help="Merge commit message.")
@pass_ctx
@handle_errors
def merge(ctx: Ctx, repo: str, source: str, dest: str, strategy: str | None, message: str | None) -> None:
    """Merge ref SOURCE into branch DEST (three-way, per file). Prints the merge commit id."""
    c = ctx.plane.merge(repo, source, dest, strategy, message)
    ctx.emit(c.describe(), c.id)


@click.command("revert")
@click.argument("target", metavar="REPO@BRANCH")
@click.argument("commit_ref", metavar="COMMIT")
@click.option("--parent", type=int, default=1, show_default=True, help="For a merge commit: the parent to revert to.")
@pass_ctx
@handle_errors
def revert(ctx: Ctx, target: str, commit_ref: str, parent: int) -> None:
    """Commit the inverse of COMMIT's changes on a branch."""
    repo, branch = repo_branch(target)
    c = ctx.plane.revert(repo, branch, commit_ref, parent)
    ctx.emit(c.describe(), c.id)


@click.group("branch")
def branch() -> None:
    """Create, list, delete and reset branches."""


@branch.command("create")
@click.argument("repo")
@click.argument("name")
@click.option("--from", "source", required=True, metavar="REF", help="Branch, tag or commit to start from.")
@pass_ctx
@handle_errors
def branch_create(ctx: Ctx, repo: str, name: str, source: str) -> None:
    """Create branch NAME of REPO at REF."""
    info = ctx.plane.create_branch(repo, name, source)
    ctx.emit(info, f"created branch {name} at {info['commit_id'][:12]}")


@branch.command("list")
@click.argument("repo")
@pass_ctx
@handle_errors
def branch_list(ctx: Ctx, repo: str) -> None:
    """List the branches of REPO."""
    ctx.emit(ctx.plane.list_branches(repo), lambda bs: "\n".join(f"{b['name']}\t{b['commit_id'][:12]}" for b in bs))


@branch.command("delete")
@click.argument("repo")
@click.argument("name")
@pass_ctx
@handle_errors
def branch_delete(ctx: Ctx, repo: str, name: str) -> None:
    """Delete branch NAME (and its uncommitted changes)."""
    ctx.plane.delete_branch(repo, name)
    ctx.emit({"deleted": name}, f"deleted branch {name}")


@branch.command("reset")
@click.argument("repo")
@click.argument("name")
@click.option("--to", "ref", required=True, metavar="REF", help="Commit, tag or branch to point NAME at.")
@pass_ctx
@handle_errors
def branch_reset(ctx: Ctx, repo: str, name: str, ref: str) -> None:
    """Point branch NAME at REF and discard its uncommitted changes."""
    info = ctx.plane.reset_branch(repo, name, ref)
    ctx.emit(info, f"branch {name} is now at {info['commit_id'][:12]}")


@click.group("tag")
def tag() -> None:
    """Create, list and delete tags (immutable names for commits)."""


@tag.command("create")
@click.argument("repo")
@click.argument("name")
@click.argument("ref")
@pass_ctx
@handle_errors
def tag_create(ctx: Ctx, repo: str, name: str, ref: str) -> None:
    """Create tag NAME of REPO pointing at REF."""
    info = ctx.plane.create_tag(repo, name, ref)
    ctx.emit(info, f"created tag {name} at {info['commit_id'][:12]}")


@tag.command("list")
@click.argument("repo")
@pass_ctx
@handle_errors
def tag_list(ctx: Ctx, repo: str) -> None:
    """List the tags of REPO."""
    ctx.emit(ctx.plane.list_tags(repo), lambda ts: "\n".join(f"{t['name']}\t{t['commit_id'][:12]}" for t in ts))


@tag.command("delete")
@click.argument("repo")
@click.argument("name")
@pass_ctx
@handle_errors
def tag_delete(ctx: Ctx, repo: str, name: str) -> None:
    """Delete tag NAME."""
    ctx.plane.delete_tag(repo, name)
    ctx.emit({"deleted": name}, f"deleted tag {name}")


def register(cli: click.Group) -> None:
    for cmd in (commit, log, diff, merge, revert, branch, tag):
        cli.add_command(cmd)
