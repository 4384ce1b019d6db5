"""Maintenance: ``fsck``, ``gc``, ``stats``."""

from __future__ import annotations

import sys

import click

from fabric.cli.context import Ctx, handle_errors, human_size, pass_ctx


@click.command("fsck")
@click.option("--fast", is_flag=True, help="Check that every chunk is indexed, without reading and hashing it.")
@pass_ctx
@handle_errors
def fsck(ctx: Ctx, fast: bool) -> None:
    """Verify every object reachable from a ref or a staged entry.

    Reads every commit, tree, range and chunk list and checks it against its
    id; reads and hashes every chunk (unless --fast). Exits 6 when anything is
    missing or corrupt.
    """
    report = ctx.plane.fsck(deep=not fast, progress=ctx.progress())

    def human(r: dict) -> str:
        head = f"checked {r['commits']} commits, {r['objects']} objects, {r['chunks']} chunks"
        if r["ok"]:
            return head + ": no problems"
        return head + f": {len(r['problems'])} problem(s)\n" + "\n".join(f"  {p}" for p in r["problems"])

    ctx.emit(report, human)
    if not report["ok"]:
        sys.exit(6)


@click.command("gc")
@click.option("--grace", type=float, default=None, metavar="SECONDS", help="Keep anything younger than this (default: $FABRIC_GC_GRACE or 6 hours).")
@click.option("--dry-run", is_flag=True, help="Report what would be removed, remove nothing.")
@pass_ctx
@handle_errors
def gc(ctx: Ctx, grace: float | None, dry_run: bool) -> None:
    """Remove chunks, packs and metadata that no ref, commit or staged entry reaches."""
    report = ctx.plane.gc(grace, dry_run, progress=ctx.progress())
    verb = "would remove" if dry_run else "removed"
    ctx.emit(
        report,
        lambda r: f"{verb} {r['chunks_deleted']} chunks, {r['packs_deleted']} packs, {r['objects_deleted']} objects; "
        f"rewrote {r['packs_rewritten']} packs; {human_size(r['bytes_freed'])} freed",
    )


@click.command("stats")
@pass_ctx
@handle_errors
def stats(ctx: Ctx) -> None:
    """Show storage statistics (logical bytes, stored bytes, dedup); at a spoke also its
    cache, prefetch and per-job figures (--json for the whole document)."""
    ctx.emit(ctx.plane.stats(), lambda d: "\n".join(_stat_lines(d)))


def _stat_lines(figures: dict, indent: str = "") -> list[str]:
    """``key: value`` lines, a nested section (a spoke's ``jobs``, ``prefetch``) indented under its key."""
    lines: list[str] = []
    for key, value in figures.items():
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{key}:")
            lines.extend(_stat_lines(value, indent + "  "))
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def register(cli: click.Group) -> None:
    for cmd in (fsck, gc, stats):
        cli.add_command(cmd)
