"""``fabric bucket create|list|delete``: S3 buckets bound to one branch or tag."""

from __future__ import annotations

import time

import click

from fabric.cli.context import Ctx, handle_errors, pass_ctx


@click.group("bucket")
def bucket() -> None:
    """S3 buckets bound to one branch or tag of a repository.

    \b
    Every repository is also an S3 bucket whose keys are REF/PATH
    (s3://datasets/main/train/0001.jpg). A bound bucket serves one branch or
    tag with plain keys, for tools that expect an ordinary bucket:
      fabric bucket create imagenet datasets@main   ->  s3://imagenet/train/0001.jpg
    """


@bucket.command("create")
@click.argument("name")
@click.argument("target", metavar="REPO@REF")
@pass_ctx
@handle_errors
def create(ctx: Ctx, name: str, target: str) -> None:
    """Create bucket NAME serving branch or tag REF of REPO with plain keys."""
    from fabric.engine.refs import split_repo_ref

    repo, ref = split_repo_ref(target)
    if not ref:
        raise click.UsageError(f"give the branch or tag to bind: {target}@main, for example")
    info = ctx.plane.create_bucket(name, repo, ref)
    ctx.emit(info, f"created bucket {name} -> {repo}@{ref}")


@bucket.command("list")
@pass_ctx
@handle_errors
def list_(ctx: Ctx) -> None:
    """List bound buckets (every repository is a bucket too, with REF/PATH keys)."""

    def human(rows: list[dict]) -> str:
        return "\n".join(
            f"{b['name']}\t{b['repo']}@{b['ref']}\t{time.strftime('%Y-%m-%d %H:%M', time.localtime(b['created']))}"
            + ("\t(created over S3)" if b["created_by_s3"] else "")
            for b in rows
        )

    ctx.emit(ctx.plane.list_buckets(), human)


@bucket.command("delete")
@click.argument("name")
@pass_ctx
@handle_errors
def delete(ctx: Ctx, name: str) -> None:
    """Remove bucket NAME's binding (the repository and its data stay)."""
    ctx.plane.delete_bucket(name)
    ctx.emit({"deleted": name}, f"deleted bucket {name}")


def register(cli: click.Group) -> None:
    cli.add_command(bucket)
