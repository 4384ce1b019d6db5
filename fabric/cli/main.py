"""Entry point of the ``fabric`` command.

The core commands live in this package, one module per group (``*_cmd.py``).
Commands of the service packages (``fabric hub``, ``fabric spoke``, ``fabric
mount``, ``fabric wan-proxy``...) are declared as entry points of the group
``fabric.commands`` in ``pyproject.toml`` and loaded only when used, so the
core library never imports a service and a short command does not pay for
importing every service.

Start-up is kept cheap: importing this module (and every ``*_cmd.py``) loads
only what parsing and ``--help`` need (click and a few small fabric modules).
httpx, the engine, the client, the compressors and hashes are imported inside
the command functions when they run; the version is a constant
(``fabric.__version__``), not looked up in the package metadata; the entry
points, whose lookup (``importlib.metadata``) alone costs tens of
milliseconds, are read only when a service command is invoked, and ``fabric
--help`` lists the service commands from :data:`SERVICE_COMMANDS`.
``tests/test_cli_startup.py`` fails when a heavy module is imported at start
again.
"""

from __future__ import annotations

import sys

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


#: The short help of each command that the service packages declare in
#: pyproject.toml's ``fabric.commands`` group (the first sentence of its
#: help), so that ``fabric --help`` lists them without reading the entry points
#: or importing the services. tests/test_cli_startup.py keeps it equal to the
#: entry points and to each command's own help.
SERVICE_COMMANDS = {
    "csi": "Run the Kubernetes CSI driver for fabric volumes (driver name csi.fabric.dev).",
    "hub": "Run a hub: the authoritative, versioned store that spokes and clients talk to.",
    "mount": "Mount REPO@REF from the hub or spoke at SERVER_URL on MOUNTPOINT.",
    "mount-flush": "Stage the files a killed --writeback mount parked in WRITE_DIR, without mounting.",
    "spoke": "Run a spoke: the hub's API next to the GPUs, served from a local cache.",
    "umount": "Unmount a fabric mount and wait until its process has finished (staged writes, unmount commit).",
    "wan-proxy": "Forward TCP from --listen to --target through an emulated WAN link, until Ctrl-C.",
}


def service_command(name: str) -> click.Command | None:
    """The command ``name`` of the ``fabric.commands`` entry points, loaded (imports its service); None if none."""
    from importlib.metadata import entry_points  # tens of ms: only when a service command runs

    for ep in entry_points(group=COMMAND_GROUP, name=name):
        return ep.load()
    return None


class FabricGroup(click.Group):
    """The core commands plus those of the installed service packages, loaded on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SERVICE_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None:
            command = service_command(name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The list of ``fabric --help``; service commands from :data:`SERVICE_COMMANDS`, not loaded."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name) or click.Command(name, help=SERVICE_COMMANDS[name])
            if not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in rows])


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
@click.option(
    "--bwlimit",
    envvar="FABRIC_BWLIMIT",
    metavar="RATE|UP:DOWN",
    help="With --server: move at most RATE bytes a second each way (K, M, G: binary units; e.g. 50M), or UP:DOWN "
    "(e.g. 10M:100M; 'off' for no cap one way), so an import or export leaves room on a shared link. Env: FABRIC_BWLIMIT.",
)
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
    bwlimit: str | None,
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
    ctx.obj = Ctx(data, db, store, server, token, as_json, quiet, bwlimit=bwlimit)


for module in (repo_cmd, transfer_cmd, objects_cmd, refs_cmd, checkpoint_cmd, maint_cmd, token_cmd, up_cmd, bucket_cmd, writeback_cmd):
    module.register(cli)


def main() -> None:
    # httpx imports its own command line (httpx._main: rich and pygments, ~40 ms) whenever
    # they are installed (dev and test environments), though fabric never uses it; a None
    # entry makes that import fail, as it does where they are not installed, and httpx
    # falls back to a stub. Only in the `fabric` process, never when fabric is a library.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    cli(prog_name="fabric")


if __name__ == "__main__":
    main()
