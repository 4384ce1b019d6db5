"""``fabric spoke``: run a spoke next to the GPUs."""

from __future__ import annotations

import logging

import click

from fabric.cli.context import handle_errors
from fabric.client.http import Timeouts
from fabric.errors import BadRequest
from fabric.util.dirlock import DirLock
from fabric.util.net import parse_listen
from fabric.util.sizes import parse_size

log = logging.getLogger("fabric.spoke")


def _hub_timeouts(ctx: click.Context, param: click.Parameter, value: str | None) -> Timeouts:
    from .plane import HUB_TIMEOUTS

    if value is None:
        return HUB_TIMEOUTS
    try:
        return Timeouts.parse(value, HUB_TIMEOUTS)
    except BadRequest as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


@click.command("spoke")
@click.option("--hub", "hub_url", required=True, metavar="URL[,URL...]", help="The hub this spoke caches, e.g. http://hub:8600. Several URLs, comma-separated, for hub processes that share one catalog and store: the nearest healthy one is used, the next when it fails.")
@click.option("--cache", "cache_dir", required=True, metavar="DIR", help="Cache directory (survives restarts).")
@click.option("--cache-size", required=True, metavar="SIZE", help="Cache budget, never exceeded: e.g. 50G, 512MiB.")
@click.option("--listen", default="127.0.0.1:8700", show_default=True, metavar="HOST:PORT", help="REST API address.")
@click.option("--s3-listen", metavar="HOST:PORT", help="Also serve the S3 API on this address. The spoke verifies S3 signatures with signing keys from the hub: its --token needs the spoke right (`fabric token create --spoke`); S3 users are served only within that token's roles.")
@click.option("--token", envvar="FABRIC_TOKEN", metavar="TOKEN", help="The spoke's own token at the hub: create it with `fabric token create --spoke --repo '*' --role write` (read is enough for a read-only spoke; a global admin token works too, but a spoke then holds the keys to the whole hub). Env: FABRIC_TOKEN.")
@click.option("--lease", type=float, default=10.0, show_default=True, metavar="SECONDS", help="How stale a branch head may be when the hub's watch stream is down (while it is up, heads are still checked every 6 leases).")
@click.option("--durability", type=click.Choice(["hub", "local", "replicated"]), default="hub", show_default=True, help="Default for writes that ask for none: hub = stored at the hub before success; local = queued on this spoke's disk, pushed when the hub is reachable; replicated = as local, and a copy kept by one other spoke of the group (needs --group or --peers) until the write is at the hub.")
@click.option(
    "--hub-timeout",
    "hub_timeouts",
    metavar="SPEC",
    callback=_hub_timeouts,
    help="How long a call to the hub may wait before the hub counts as unreachable (reads are then served as while "
    "it is down): SECONDS for the read timeout, or e.g. connect=5,read=10,write=60,pool=10,slow=300 (slow: commits, "
    "merges, uploads). Defaults: connect 5, read 10, write 60, pool 10, slow 300.",
)
@click.option(
    "--hub-bwlimit",
    metavar="RATE|UP:DOWN",
    help="Move at most RATE bytes a second each way with the hub (K, M, G: binary units; e.g. 200M), or UP:DOWN "
    "('off' for no cap one way): fetches, prefetch and write-back then leave the rest of the WAN link to other traffic. "
    "Default: no cap.",
)
@click.option(
    "--memory-cache",
    default="64MiB",
    show_default=True,
    metavar="SIZE",
    help="Chunks already verified and decompressed kept in memory, in front of the disk cache: a warm read of them "
    "neither reads the disk nor checks a checksum again. Copies read from the disk cache are always checked (so a "
    "bad disk is caught on the first read after a restart or an eviction from memory). 0 turns it off.",
)
@click.option(
    "--hint-window",
    metavar="SIZE",
    help="The most bytes fetched ahead of a job that sent a loader hint (POST /api/v1/repos/REPO/hints), counted from "
    "its read position; at most half the chunk cache. Default: a quarter of the chunk cache, at most 256MiB. 0 turns "
    "hinted prefetch off. Per-job reads and prefetch figures are in `fabric stats` (\"jobs\") and /metrics "
    "(fabric_spoke_job_*).",
)
@click.option(
    "--prefetch-share",
    type=click.FloatRange(0, 1),
    default=0.25,
    show_default=True,
    metavar="FRACTION",
    help="Learned prefetch: when a job (X-Fabric-Job, or FABRIC_JOB for a mount) opens a dataset earlier jobs read, "
    "the spoke fetches the files they read next, in the order they read them, in the background. This is the share "
    "of the fetch workers such background fetches may keep busy (at least one); demand reads always go first. "
    "0 turns learned prefetch off. Figures: `fabric stats` (\"learned_prefetch\", and kind \"learned\" per job).",
)
@click.option(
    "--prefetch-window",
    metavar="SIZE",
    help="The most bytes learned prefetch fetches ahead of a job that it has not read yet; at most half the chunk "
    "cache, which is the default. A job starts with --hint-window (or this, if smaller); once it has read 4 files "
    "of the learned working set in a row, the window doubles with each further one, and an open outside the "
    "working set takes it back to the start. A job reading in an order nobody can predict is covered only by what "
    "is already fetched, so the window must be able to hold its working set.",
)
@click.option(
    "--group",
    metavar="NAME",
    help="Join this spoke group (the spokes of one region): the group is registered at the hub, which lists its live "
    "members (a heartbeat every 2 s; a member silent for 6 s leaves). Each chunk has an owner in the group "
    "(rendezvous hashing); a chunk this spoke lacks is asked of its owner over the LAN before the hub, so it crosses "
    "the WAN once per region. A dead or slow owner costs a fallback to the next one or the hub, never an error. "
    "Needs --advertise and a --token with the spoke right (`fabric token create --spoke --repo '*' --role read`).",
)
@click.option(
    "--peers",
    metavar="URL,URL",
    help="A fixed group instead of --group: the other spokes' URLs, comma-separated (this spoke's own may be in the "
    "list), with no registration at the hub. Every member must be given the same URLs.",
)
@click.option(
    "--advertise",
    metavar="URL",
    help="With --group or --peers: the URL the other spokes of the group reach this spoke at, e.g. http://10.0.0.5:8700.",
)
@click.option(
    "--peer-timeout",
    type=click.FloatRange(0.1, 60),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="How long a request to another spoke of the group may wait (connecting, or between two pieces of its answer) "
    "before that spoke is left out for 10 s and its chunks are fetched from the next owner or the hub.",
)
@click.option("--no-auth", is_flag=True, help="Accept unauthenticated requests as admin (only for local demos).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve HTTPS (REST and S3) with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Private key for --tls-cert (PEM).")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True)
@click.option(
    "--full-wait",
    type=click.FloatRange(0, 3600),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="With local durability, writes not yet at the hub are pinned in the cache, within its budget. When it is full, "
    "a write waits until the write-back has moved enough to the hub (back-pressure: writers slow to the link's pace) "
    "for at most SECONDS, then fails with 'insufficient storage' (507; ENOSPC in a mount). 0: fail at once (fail-fast).",
)
@click.option(
    "--seed-copies",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Leave a plain copy of each file of 1 MiB or more written through this spoke in DIR (assembled in the background "
    "out of its chunks), so that `fabric mount --passthrough --copies-dir DIR` on this machine reads it at the local "
    "disk's speed: a checkpoint saved through this spoke is restored beside it as from a local disk.",
)
@click.option("--seed-copies-size", default="5GiB", show_default=True, metavar="SIZE",
              help="The most bytes of copies --seed-copies keeps (the least recently opened go first).")
@click.option(
    "--mirror-capacity",
    default="8GiB",
    show_default=True,
    metavar="SIZE",
    help="The most bytes this spoke keeps at once of the files that `fabric mount --writeback --durability replicated` "
    "mounts of its group's other spokes park here (in the cache directory, beside the cache's budget); beyond it, "
    "such a mount's fsync stages its file inline instead.",
)
@click.option(
    "--replica-takeover",
    type=click.FloatRange(1, 86400),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="This spoke keeps copies of other members' writes made with replicated durability until they reach the hub. "
    "When the member a copy came from has not answered for SECONDS, this spoke pushes its writes to the hub itself. "
    "The same holds for the files a `fabric mount --writeback --durability replicated` on another machine keeps here: "
    "once it has not renewed its lease for SECONDS, they are queued here for the hub.",
)
@handle_errors
def spoke(
    hub_url: str,
    cache_dir: str,
    cache_size: str,
    listen: str,
    s3_listen: str | None,
    token: str | None,
    lease: float,
    durability: str,
    hub_timeouts: Timeouts,
    hub_bwlimit: str | None,
    memory_cache: str,
    hint_window: str | None,
    prefetch_share: float,
    prefetch_window: str | None,
    group: str | None,
    peers: str | None,
    advertise: str | None,
    peer_timeout: float,
    full_wait: float,
    replica_takeover: float,
    mirror_capacity: str,
    seed_copies: str | None,
    seed_copies_size: str,
    no_auth: bool,
    tls_cert: str | None,
    tls_key: str | None,
    log_level: str,
) -> None:
    """Run a spoke: the hub's API next to the GPUs, served from a local cache.

    Reads are served from the cache and fetch only missing chunks from the
    hub; writes go to the hub (or, with --durability local, are queued here
    while the hub is away). Callers use their own tokens; the spoke checks
    them with the hub.
    """
    import uvicorn

    from fabric.api.serving import serve_together
    from fabric.client.bandwidth import parse_bwlimit
    from fabric.client.breaker import BreakerTransport

    from .app import create_app
    from .auth import SpokeAuth
    from .owners import CreatorAware
    from .plane import SpokePlane
    from .s3 import SpokeKeys, create_s3_app
    from .traffic import CountingTransport

    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if group is not None and peers is not None:
        raise click.UsageError("--group (registered at the hub) and --peers (a fixed list) do not go together")
    if (group is not None or peers is not None) != (advertise is not None):
        raise click.UsageError("--advertise goes with --group or --peers: the URL the group's other spokes reach this one at")
    peer_urls = [p.strip() for p in (peers or "").split(",") if p.strip()]
    if peers is not None and not peer_urls:
        raise click.UsageError("--peers needs at least one URL")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    host, port = parse_listen(listen)
    # One spoke per cache directory (write-back queue, state, caches), held until the command ends.
    click.get_current_context().with_resource(DirLock(cache_dir, "spoke cache directory"))
    plane = SpokePlane(
        hub_url,
        token,
        cache_dir,
        parse_size(cache_size),
        lease=lease,
        durability=durability,
        hub_timeouts=hub_timeouts,
        memory_cache=parse_size(memory_cache),
        hint_window=parse_size(hint_window) if hint_window is not None else None,
        prefetch_share=prefetch_share,
        prefetch_window=parse_size(prefetch_window) if prefetch_window is not None else None,
        group=group,
        peers=peer_urls,
        advertise=advertise,
        full_wait=full_wait,
        replica_takeover=replica_takeover,
        mirror_capacity=parse_size(mirror_capacity),
        seed_copies=seed_copies,
        seed_copies_size=parse_size(seed_copies_size),
        hub_bandwidth=parse_bwlimit(hub_bwlimit) if hub_bwlimit else None,
        peer_timeouts=Timeouts(connect=min(1.0, peer_timeout), read=peer_timeout, write=peer_timeout, pool=peer_timeout, slow=peer_timeout),
    )
    auth = keys = None
    if not no_auth:
        hub_transport = BreakerTransport(plane.breaker, CountingTransport(plane.traffic))
        auth = SpokeAuth(hub_url, plane.traffic, plane.state, transport=hub_transport, timeout=hub_timeouts.as_httpx())
        keys = SpokeKeys(plane) if s3_listen else None
    # What the frontends serve: a caller that creates a repository is checked with the hub again.
    served = CreatorAware(plane, [x.forget for x in (auth, keys) if x is not None])
    log.info("spoke of %s: cache %s (%s), durability %s", hub_url, cache_dir, cache_size, durability)
    if plane.membership is not None:
        seen = plane.membership.describe()
        log.info("group %s as %s: %d member(s) now", seen["group"] or "(fixed --peers)", seen["me"], len(seen["members"]))
    app = create_app(plane, auth, served)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, ssl_certfile=tls_cert, ssl_keyfile=tls_key, timeout_keep_alive=30
    )
    try:
        if not s3_listen:
            serve_together([config])
            return
        from fabric.api.s3.serve import s3_uvicorn_config

        s3_host, s3_port = parse_listen(s3_listen)
        gateway = create_s3_app(served, cache_dir, keys, access_log=log_level in ("debug", "info"))
        log.info("S3 API on %s://%s:%d", "https" if tls_cert else "http", s3_host, s3_port)
        s3_config = s3_uvicorn_config(gateway, s3_host, s3_port, log_level, ssl_certfile=tls_cert, ssl_keyfile=tls_key)
        serve_together([config, s3_config])
    finally:
        plane.close()
