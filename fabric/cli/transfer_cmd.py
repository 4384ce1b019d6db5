"""``fabric import`` and ``fabric export``."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import click

from fabric.cli.context import Ctx, handle_errors, human_size, pass_ctx
from fabric.errors import BadRequest

if TYPE_CHECKING:
    from fabric.client.filters import FileList, Filters
    from fabric.plane.dataplane import DataPlane


def repo_branch(spec: str) -> tuple[str, str]:
    from fabric.engine.refs import split_repo_ref

    repo, branch = split_repo_ref(spec)
    if branch is None:
        raise BadRequest(f"give a branch: {spec}@BRANCH")
    return repo, branch


class OrderedOptions(click.Command):
    """A command that keeps the order in which its options were given (``ctx.meta[OPTION_ORDER]``,
    one name per use): ``--include`` and ``--exclude`` apply in that order, as rsync's do."""

    def make_parser(self, ctx: click.Context) -> Any:  # click's parser class is private
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_in_order(args: list[str]) -> tuple[dict[str, Any], list[str], list[click.Parameter]]:
            opts, rest, order = parse(args)
            ctx.meta[OPTION_ORDER] = [param.name for param in order]
            return opts, rest, order

        parser.parse_args = parse_in_order
        return parser


OPTION_ORDER = "fabric.option_order"
#: The options that give rules; a ``_from`` one names files of patterns.
_RULE_OPTIONS = ("include", "include_from", "exclude", "exclude_from")


def filter_options(source: str, target: str) -> Callable[[Callable], Callable]:
    """``--include``, ``--exclude``, their ``-from`` files and ``--delete-excluded`` of a command
    copying ``source`` to ``target`` (made with ``cls=OrderedOptions``)."""

    def apply(command: Callable) -> Callable:
        for option in reversed(
            [
                click.option(
                    "--exclude",
                    "exclude",
                    multiple=True,
                    metavar="PATTERN",
                    help=f"Leave out paths of {source} matching PATTERN (repeatable): '*.tmp' or '.git' matches a name at any "
                    f"depth, '/build' or 'data/raw/*.csv' a path from {source}'s root, a trailing '/' directories only, '**' any "
                    f"run of directories. Excluded paths already in {target} are kept (see --delete-excluded).",
                ),
                click.option(
                    "--include",
                    "include",
                    multiple=True,
                    metavar="PATTERN",
                    help="Keep paths matching PATTERN (repeatable). --include and --exclude apply in the order given and the "
                    "first that matches a path decides, as rsync's: --include '*/' --include '*.csv' --exclude '*' keeps the "
                    "CSV files at any depth and nothing else. A directory left out is not entered.",
                ),
                _patterns_file("exclude", "blank lines and '#' comments skipped"),
                _patterns_file("include", "as --exclude-from"),
                click.option("--delete-excluded", is_flag=True, help=f"Also remove from {target} what the rules leave out."),
            ]
        ):
            command = option(command)
        return command

    return apply


def _patterns_file(kind: str, how: str) -> Callable[[Callable], Callable]:
    """``--exclude-from`` or ``--include-from``."""
    return click.option(
        f"--{kind}-from",
        f"{kind}_from",
        type=click.File("r", encoding="utf-8"),
        multiple=True,
        metavar="FILE",
        help=f"Read --{kind} patterns from FILE, one a line, {how}.",
    )


def files_from_option(verb: str, root: str, refusal: str) -> Callable[[Callable], Callable]:
    """``--files-from FILE`` of a command that copies only the paths a list names."""
    return click.option(
        "--files-from",
        type=click.File("r", encoding="utf-8"),
        metavar="FILE",
        help=f"{verb} only the paths FILE lists, one a line, relative to {root}; a directory listed comes with "
        f"everything under it; '-' reads the list from stdin. Any path not in {refusal} (exit 3). For a manifest "
        "of a training split.",
    )


def read_file_list(files_from: TextIO | None) -> FileList | None:
    from fabric.client.filters import FileList, read_path_list

    return None if files_from is None else FileList(read_path_list(files_from.read()))


def read_filters(ctx: click.Context, delete_excluded: bool, deletes: bool, no_delete_flag: str) -> Filters:
    """The rules of ``--include``/``--exclude`` and their ``-from`` files, in the order given;
    usage errors for ``--delete-excluded`` without rules or where nothing is deleted
    (``deletes`` False: ``no_delete_flag`` given or implied)."""
    from fabric.client.filters import Filters, read_patterns

    if delete_excluded and not deletes:
        raise click.UsageError(f"--delete-excluded removes paths, {no_delete_flag}")
    given = {name: list(ctx.params[name]) for name in _RULE_OPTIONS}
    rules: list[tuple[str, str]] = []
    for name in ctx.meta.get(OPTION_ORDER, []):
        if name in _RULE_OPTIONS:
            value = given[name].pop(0)
            patterns = read_patterns(value.read()) if name.endswith("_from") else [value]
            rules.extend((name.removesuffix("_from"), p) for p in patterns)
    filters = Filters(rules)
    if delete_excluded and filters.leaves_out_nothing:
        raise click.UsageError("--delete-excluded needs an --exclude or --exclude-from rule")
    if filters and filters.leaves_out_nothing:
        click.echo("warning: no --exclude rule follows --include, so nothing is left out (add --exclude '*' to leave out the rest)", err=True)
    return filters


@click.command("import", cls=OrderedOptions)
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("target", metavar="REPO@BRANCH")
@click.option("-m", "--message", help="Commit message (required, except with --dry-run).")
@click.option("--prefix", default="", help="Import under this path of the repository.")
@click.option("--no-delete", is_flag=True, help="Only add and update; keep paths missing from SRC.")
@click.option("--rehash", is_flag=True, help="Read every file even if its size and mtime are unchanged.")
@click.option("--author", help="Commit author (default: $FABRIC_AUTHOR or your user name).")
@filter_options("SRC", "the branch")
@files_from_option("Import", "SRC; paths on the branch that no listed path holds are kept as they are", "SRC: nothing is committed")
@click.option(
    "-n", "--dry-run", is_flag=True, help="Read, store and commit nothing; print what would be added, changed and removed (one path a line, then a summary)."
)
@pass_ctx
@handle_errors
def import_(
    ctx: Ctx,
    src: str,
    target: str,
    message: str | None,
    prefix: str,
    no_delete: bool,
    rehash: bool,
    author: str | None,
    exclude: tuple[str, ...],
    include: tuple[str, ...],
    exclude_from: tuple,
    include_from: tuple,
    delete_excluded: bool,
    files_from: TextIO | None,
    dry_run: bool,
) -> None:
    """Make REPO@BRANCH (under --prefix) equal to directory SRC and commit.

    Only chunks the store lacks are stored; files whose size, mode and mtime
    match the branch are not read again. Prints the new commit id.

    \b
    Examples:
      fabric import ./imagenet datasets@main -m "v2" --exclude .git --exclude '*.tmp'
      fabric import ./imagenet datasets@main -m "v2" --dry-run
      fabric import ./lake datasets@main -m "parquet only" --include '*/' --include '*.parquet' --exclude '*'
    """
    from fabric.client.transfer import import_directory
    from fabric.util.heap import map_big_buffers

    if not message and not dry_run:
        raise click.UsageError("give a commit message: -m/--message TEXT")
    repo, branch = repo_branch(target)
    filters = read_filters(click.get_current_context(), delete_excluded, not no_delete, "--no-delete keeps them: give one of them")
    # An import makes a few objects per file and keeps most of them to the end (the walk,
    # the entries): the cyclic collector would go over all of them again and again and
    # find nothing to free (a quarter of the CPU time of 100,000 small files). This
    # process does nothing else meanwhile, so it is off for the import.
    gc.disable()
    map_big_buffers()  # packs and compressed batches are given back when freed, not kept
    try:
        result = import_directory(
            ctx.plane,
            src,
            repo,
            branch,
            message or "",
            prefix=prefix,
            delete=not no_delete,
            rehash=rehash,
            author=author,
            progress=ctx.progress(),
            filters=filters,
            delete_excluded=delete_excluded,
            dry_run=dry_run,
            files=read_file_list(files_from),
        )
    finally:
        gc.enable()
    for path in result.skipped:
        click.echo(f"warning: skipped {path} (not a file, directory or symlink)", err=True)

    def planned(r: dict) -> str:
        lines = [f"{what} {path}" for what in ("add", "change", "remove") for path in r["plan"][what]]
        click.echo(
            f"dry run: would add {r['added']}, change {r['changed']}, remove {r['removed']}; "
            f"read {human_size(r['bytes_hashed'])}; {len(r['excluded'])} excluded; nothing was changed",
            err=True,
        )
        return "\n".join(lines)

    def human(r: dict) -> str:
        if r["commit_id"] is None:
            return f"no changes: {repo}@{branch} already matches {src}"
        click.echo(
            f"{r['added']} added, {r['changed']} changed, {r['removed']} removed; "
            f"{human_size(r['bytes_hashed'])} read, {human_size(r['new_bytes'])} new, "
            f"{human_size(r['stored_bytes'])} stored" + (f"; {len(r['excluded'])} excluded" if r["excluded"] else ""),
            err=True,
        )
        return r["commit_id"]

    ctx.emit(result.describe(), planned if dry_run else human)


@click.command("export", cls=OrderedOptions)
@click.argument("source", metavar="REPO@REF")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--prefix", default="", help="Export only this path of the repository (as DEST's root).")
@click.option(
    "--rewrite",
    is_flag=True,
    help="Write every file, even one DEST already holds with the same size, mode and mtime (by default such files are left as they are).",
)
@click.option(
    "--delete",
    is_flag=True,
    help="Remove what DEST holds that REPO@REF does not (files, links and directories, before writing; as rsync --delete). Preview with --dry-run.",
)
@click.option(
    "-c",
    "--checksum",
    is_flag=True,
    help="A file DEST holds with the right size but another time or mode is read and compared chunk by chunk with "
    "REPO@REF's; if it is the same, only its time and mode are set, nothing is fetched (rsync --checksum). For a DEST "
    "whose times were lost (a copy without -p), where the quick check would fetch every file again.",
)
@filter_options("REPO@REF", "DEST (with --delete)")
@files_from_option("Export", "REPO@REF's root (or --prefix)", "REPO@REF: nothing is written")
@click.option("-n", "--dry-run", is_flag=True, help="Write and remove nothing; print what would be written and (with --delete) removed.")
@pass_ctx
@handle_errors
def export(
    ctx: Ctx,
    source: str,
    dest: str,
    prefix: str,
    rewrite: bool,
    delete: bool,
    checksum: bool,
    exclude: tuple[str, ...],
    include: tuple[str, ...],
    exclude_from: tuple,
    include_from: tuple,
    delete_excluded: bool,
    files_from: TextIO | None,
    dry_run: bool,
) -> None:
    """Write the files of REPO@REF into directory DEST (modes and mtimes kept).

    A file DEST already holds with the same size, mode and modification time
    (to the nanosecond) is not read again, as rsync's quick check; --rewrite
    writes every file. Nothing is written outside DEST and no symlink is
    followed: a symlink or file in DEST where REPO@REF has a directory is
    replaced by a directory. A file or symlink that has paths below it in the
    repository (S3 lets keys `a` and `a/b` coexist) is shadowed by the
    directory: it is skipped with a warning and listed under "shadowed" in
    --json output. Through a spoke, the order of the files to read is sent
    first as a loader hint (job $FABRIC_JOB, else a new `export:` id), so the
    spoke fetches ahead of the reads.

    \b
    Examples:
      fabric export datasets@v2 ./imagenet --delete --dry-run   # what a mirror of v2 would change
      fabric export datasets@v2 ./imagenet --delete             # DEST becomes exactly v2
      fabric export datasets@v2 ./val --files-from val.txt      # only the paths val.txt lists
    """
    from fabric.client.transfer import export_tree
    from fabric.engine.refs import split_repo_ref

    repo, ref = split_repo_ref(source, None)
    filters = read_filters(click.get_current_context(), delete_excluded, delete, "and only --delete removes any: add --delete")
    if files_from is not None and delete:
        raise click.UsageError("--delete removes what REPO@REF does not hold, --files-from leaves most of it out: give one of them")
    files = read_file_list(files_from)
    plane, job = _export_plane(ctx)
    if ref is None:
        ref = plane.get_repo(repo)["default_branch"]
    result = export_tree(
        plane,
        repo,
        ref,
        dest,
        prefix=prefix,
        progress=ctx.progress(),
        rewrite=rewrite,
        job=job,
        delete=delete,
        dry_run=dry_run,
        filters=filters,
        delete_excluded=delete_excluded,
        checksum=checksum,
        files=files,
    )
    for path in result.shadowed:
        click.echo(f"warning: skipped {path}: a directory of the same name shadows it (the tree has paths under {path}/)", err=True)
    for path in result.skipped:
        click.echo(f"warning: skipped {path}: making a device node needs root (CAP_MKNOD)", err=True)

    def planned(r: dict) -> str:
        click.echo(
            f"dry run: would write {len(r['to_write'])} of {r['files']} files and remove {len(r['deleted'])} paths in {dest}; nothing was changed",
            err=True,
        )
        return "\n".join([*(f"write {p}" for p in r["to_write"]), *(f"delete {p}" for p in r["deleted"])])

    def human(r: dict) -> str:
        line = f"exported {r['files']} files ({human_size(r['bytes'])}) to {dest}"
        if r["deleted"]:
            line += f"; removed {len(r['deleted'])} paths not in {repo}@{ref}"
        if r["unchanged"]:
            line += f"; {r['unchanged']} unchanged ({human_size(r['unchanged_bytes'])}) not written"
        if r["verified"]:
            line += f" ({r['verified']} of them read and found the same: times and modes set)"
        line += f"; skipped {len(r['shadowed'])} shadowed" if r["shadowed"] else ""
        return line + (f"; skipped {len(r['skipped'])} devices (not root)" if r["skipped"] else "")

    ctx.emit(result.__dict__, planned if dry_run else human)


def _export_plane(ctx: Ctx) -> tuple[DataPlane, str | None]:
    """The plane an export reads from, and the job its reads carry: a server's plane is opened
    with a job id (``$FABRIC_JOB``, else a new one) so the export can hint its read order."""
    if not ctx.server:
        return ctx.plane, None
    from fabric.client.http import HttpPlane
    from fabric.client.transfer import new_export_job
    from fabric.plane.jobs import JOB_ENV

    job = os.environ.get(JOB_ENV) or new_export_job()
    return HttpPlane(ctx.server, ctx.token, job=job, bandwidth=ctx.bandwidth()), job


def register(cli: click.Group) -> None:
    cli.add_command(import_)
    cli.add_command(export)
