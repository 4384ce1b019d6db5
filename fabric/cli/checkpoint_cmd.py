"""``fabric checkpoints``: the complete checkpoints of a repository's runs (see :mod:`fabric.checkpoint`)."""

from __future__ import annotations

import time

import click

from fabric.cli.context import Ctx, handle_errors, pass_ctx
from fabric.format.checkpoint_names import run_branch, split_step_tag


@click.command("checkpoints")
@click.argument("repo")
@click.option("--run", help="Only this run (its branch ckpt.RUN).")
@click.option("--branch", help="Only the run saved through this branch (a run given its own branch).")
@click.option("--latest", is_flag=True, help="Only the newest complete checkpoint of each run.")
@pass_ctx
@handle_errors
def checkpoints(ctx: Ctx, repo: str, run: str | None, branch: str | None, latest: bool) -> None:
    """List the complete checkpoints of REPO, saved with fabric.checkpoint: each run's steps,
    oldest first, with the commit that holds each one (read it as fabric://REPO@COMMIT/step-N/).

    A step is listed once its save finished (its tag ``BRANCH.step-N`` exists); a save in
    progress or one that crashed is not.

    \b
    Examples:
      fabric checkpoints models
      fabric checkpoints models --run llama-ft --latest
    """
    if run is not None and branch is not None:
        raise click.UsageError("--run and --branch name the same thing: give one")
    only = None
    if run is not None or branch is not None:
        try:
            only = run_branch(run or "", branch)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    found: dict[str, list[dict]] = {}
    for tag in ctx.plane.list_tags(repo):
        parsed = split_step_tag(tag["name"])
        if parsed is None or (only is not None and parsed[0] != only):
            continue
        found.setdefault(parsed[0], []).append({"branch": parsed[0], "step": parsed[1], "commit": tag["commit_id"], "tag": tag["name"]})
    rows = []
    for name in sorted(found):
        steps = sorted(found[name], key=lambda r: r["step"])
        rows += steps[-1:] if latest else steps
    for row in rows:
        commit = ctx.plane.log(repo, row["commit"], limit=1)[0]
        row["time"] = commit.time
        row["path"] = f"fabric://{repo}@{row['commit']}/step-{row['step']}/"
    ctx.emit(rows, _table)


def _table(rows: list[dict]) -> str:
    if not rows:
        return "no complete checkpoints"
    width = max(len(r["branch"]) for r in rows)
    lines = [f"{'RUN BRANCH':<{width}}  {'STEP':>8}  COMMIT        SAVED"]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
        lines.append(f"{r['branch']:<{width}}  {r['step']:>8}  {r['commit'][:12]}  {when}")
    return "\n".join(lines)


def register(cli: click.Group) -> None:
    cli.add_command(checkpoints)
