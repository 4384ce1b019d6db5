"""Entry point of the ``fabric`` command.

The core commands live in this package, one module per group (``*_cmd.py``).
Commands of the service packages (``fabric hub``, ``fabric spoke``, ``fabric
mount``, ``fabric wan-proxy``...) are declared as entry points of the group
``fabric.commands`` in ``pyproject.toml`` and loaded only when used, so the
core library never imports a service and a short command does not pay for
importing every service.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import click

from fabric import __version__
from fabric.cli import (
    bucket_cmd,
    checkpoint_cmd,
    maint_cmd,
    objects_cmd,
    refs_cmd,
    repo_cmd,
    token_cmd,
    transfer_cmd,
    up_cmd,
    writeback_cmd,
)
from fabric.cli.context import DEFAULT_DATA, Ctx

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: The entry-point group through which service packages add their commands.
COMMAND_GROUP = "fabric.commands"


class FabricGroup(click.Group):
    """The core commands plus those of the installed service packages, loaded on demand."""

    def _service_commands(self) -> dict:
        return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._service_commands()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and (ep := self._service_commands().get(name)) is not None:
            command = ep.load()
        return command


@click.group(cls=FabricGroup, context_settings=CONTEXT)
@click.option(
    "--data",
    envvar="FABRIC_DATA",
    default=DEFAULT_DATA,
    show_default=True,
    metavar="DIR",
    help="Hub data directory to work on directly (catalog and store). Env: FABRIC_DATA.",
)
@click.option("--db", envvar="FABRIC_DB", metavar="URL", help="Catalog database: sqlite:///PATH or postgresql://… (default: DIR/catalog.db).")
@click.option("--store", envvar="FABRIC_STORE", metavar="URL", help="Object store for packs: a path, s3://bucket/prefix or an fsspec URL (default: DIR/store; remembered).")
@click.option("--server", envvar="FABRIC_SERVER", metavar="URL[,URL...]", help="Work against a hub or spoke at URL instead of --data. Several URLs, comma-separated (the spokes of your region, then the hub): the nearest healthy one is used, the next when it fails. Env: FABRIC_SERVER.")
@click.option("--token", envvar="FABRIC_TOKEN", metavar="TOKEN", help="API token for --server. Env: FABRIC_TOKEN.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.version_option(__version__, prog_name="fabric")
@click.pass_context
def cli(
    ctx: click.Context,
    data: str,
    db: str | None,
    store: str | None,
    server: str | None,
    token: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """fabric: versioned, deduplicated datasets and checkpoints for AI training.

    Repositories hold files under branches, tags and commits, addressed as
    REPO@REF (e.g. datasets@main, datasets@v1, datasets@3fa2c9e1, datasets@main~1).

    \b
    Typical session:
      fabric repo create datasets
      fabric import ./imagenet datasets@main -m "ImageNet train split"
      fabric ls datasets@main
      fabric branch create datasets exp --from main
      fabric diff datasets main exp

    Without --server, commands work directly on the hub data directory --data.
    """
    ctx.obj = Ctx(data, db, store, server, token, as_json, quiet)


for module in (repo_cmd, transfer_cmd, objects_cmd, refs_cmd, checkpoint_cmd, maint_cmd, token_cmd, up_cmd, bucket_cmd, writeback_cmd):
    module.register(cli)


def main() -> None:
    cli(prog_name="fabric")


if __name__ == "__main__":
    main()
