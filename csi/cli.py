"""``fabric csi``: the Kubernetes CSI driver, and ``fabric csi mounter``."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from fabric.cli.context import handle_errors

CSI_HELP = """Run the Kubernetes CSI driver for fabric volumes (driver name csi.fabric.dev).

\b
  fabric csi --endpoint unix:///csi/csi.sock --node-id $NODE_NAME --node
  fabric csi --endpoint unix:///csi/csi.sock --node-id $NODE_NAME --controller
  fabric csi mounter --socket /run/fabric-csi-mounter/mounter.sock

Volumes are NFS-CSI-style: a PV's volumeAttributes name a server (hub or spoke
URL, or a comma-separated list) and a share (REPO@REF[/subdir]); a StorageClass's
parameters name server, share, subDir (with ${pvc.metadata.namespace},
${pvc.metadata.name}, ${pv.metadata.name}) and onDelete (retain, delete,
archive). Mount options: ro, durability=local|replicated|hub, cache-size=SIZE,
commit-interval=SECONDS, commit-on-unmount, writeback. Tokens come from the CSI secrets
(key "token"), never from command lines or logs.

With --local-spoke URL=DIR, a volume whose nearest server is the spoke on this
node reads the chunks that spoke holds straight from its cache directory. With
--local-spoke-copies URL=DIR (the spoke's --seed-copies), such a volume's node
copies are the spoke's: a passthrough volume restores what any machine wrote
through that spoke with the kernel reading the spoke's plain copies.

Each published volume is served by its own `fabric mount` process in a session
of its own, recorded under --state-dir: a restarted driver adopts its mounts.
With --mounter-socket the mount processes belong to `fabric csi mounter` (a
DaemonSet of its own in Kubernetes), so restarting or upgrading the driver
leaves pods' volumes mounted.
"""


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    return stop


def _logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group("csi", invoke_without_command=True, help=CSI_HELP)
@click.option("--endpoint", default="unix:///csi/csi.sock", show_default=True, help="The unix socket kubelet or the sidecars call.")
@click.option("--node-id", envvar="NODE_NAME", help="This node's name (NodeGetInfo). Env: NODE_NAME.")
@click.option("--controller", is_flag=True, help="Serve the Controller service (CreateVolume, DeleteVolume).")
@click.option("--node", is_flag=True, help="Serve the Node service (NodePublishVolume, NodeUnpublishVolume).")
@click.option("--state-dir", default="/var/lib/fabric-csi", show_default=True, type=click.Path(file_okay=False), help="Records of published and created volumes (survives restarts).")
@click.option("--mounter-socket", type=click.Path(dir_okay=False), help="Ask `fabric csi mounter` on this socket to mount and unmount (it owns the mount processes).")
@click.option(
    "--local-spoke",
    "local_spokes",
    multiple=True,
    metavar="URL=DIR",
    help="A spoke on this node: volumes whose nearest server is URL read the chunks it holds from its cache directory DIR (mounted read-only here and in the mounter), each checked against its id, instead of over HTTP. Repeatable.",
)
@click.option(
    "--local-spoke-copies",
    "local_spoke_copies",
    multiple=True,
    metavar="URL=DIR",
    help="The spoke at URL on this node keeps plain copies of the files written through it in DIR (its --seed-copies): "
    "volumes whose nearest server is URL use DIR as the node's copies (a passthrough volume's kernel reads them, a "
    "writeback volume leaves its own there) instead of the driver's copies of each repository. Repeatable.",
)
@click.option("--driver-name", default="csi.fabric.dev", show_default=True, help="The CSI driver name (the CSIDriver object's and StorageClass provisioner's).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@click.pass_context
@handle_errors
def csi(
    ctx: click.Context,
    endpoint: str,
    node_id: str | None,
    controller: bool,
    node: bool,
    state_dir: str,
    mounter_socket: str | None,
    local_spokes: tuple[str, ...],
    local_spoke_copies: tuple[str, ...],
    driver_name: str,
    log_level: str,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if not (controller or node):
        raise click.UsageError("give --controller, --node or both")
    if node and not node_id:
        raise click.UsageError("--node needs --node-id (or NODE_NAME)")
    from csi.server import serve, unix_socket_path
    from csi.volumes import VolumeError, parse_local_spoke

    try:
        unix_socket_path(endpoint)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--endpoint") from None
    try:
        spokes = dict(parse_local_spoke(value) for value in local_spokes)
    except VolumeError as exc:
        raise click.BadParameter(str(exc), param_hint="--local-spoke") from None
    try:
        copies = dict(parse_local_spoke(value, "--local-spoke-copies") for value in local_spoke_copies)
    except VolumeError as exc:
        raise click.BadParameter(str(exc), param_hint="--local-spoke-copies") from None
    _logging(log_level)
    serve(endpoint, node_id or "", state_dir, controller, node, _stop_event(), mounter_socket, driver_name, spokes, copies)


@csi.command("mounter")
@click.option("--socket", "socket_path", required=True, type=click.Path(dir_okay=False), help="The unix socket the driver calls (created mode 0600).")
@click.option("--state-dir", default="/var/lib/fabric-csi", show_default=True, type=click.Path(file_okay=False), help="The driver's state directory (shared with it).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@handle_errors
def mounter(socket_path: str, state_dir: str, log_level: str) -> None:
    """Own the node's mount processes for the driver (restarting the driver leaves them)."""
    from csi.mounter import serve_mounter
    from csi.mounts import Mounts

    _logging(log_level)
    serve_mounter(socket_path, Mounts(state_dir), _stop_event())
