"""``fabric hub``: run a hub service."""

from __future__ import annotations

import logging

import click

from fabric.auth.tokens import TokenStore, write_bootstrap_token
from fabric.catalog.db import redact
from fabric.catalog.pool import DEFAULT_SIZE as DEFAULT_POOL_SIZE
from fabric.cli.context import handle_errors
from fabric.engine.engine import Engine
from fabric.util.dirlock import DirLock
from fabric.util.net import parse_listen

log = logging.getLogger("fabric.hub")


@click.command("hub")
@click.option("--data", "data_dir", required=True, metavar="DIR", help="Data directory (catalog, store, admin.token).")
@click.option("--listen", default="127.0.0.1:8600", show_default=True, metavar="HOST:PORT", help="REST API address.")
@click.option("--s3-listen", metavar="HOST:PORT", help="Also serve the S3 API on this address.")
@click.option("--db", metavar="URL", help="Catalog: sqlite:///PATH (default DIR/catalog.db) or postgresql://…")
@click.option(
    "--catalog-sync",
    type=click.Choice(["full", "normal"]),
    default="full",
    show_default=True,
    help="SQLite catalog durability. full: every acknowledged write survives power loss. "
    "normal: faster commits, but the last acknowledged writes may be lost on power loss or an OS crash "
    "(never on a crash of the hub alone).",
)
@click.option(
    "--catalog-pool",
    type=click.IntRange(min=1),
    default=DEFAULT_POOL_SIZE,
    show_default=True,
    metavar="N",
    help="Catalog database connections kept open at most (requests wait for a free one, then get 503).",
)
@click.option("--store", metavar="URL", help="Pack store: a path (default DIR/store), s3://bucket/prefix or an fsspec URL.")
@click.option("--no-auth", is_flag=True, help="Accept unauthenticated requests as admin (only for local demos).")
@click.option(
    "--s3-autocommit",
    metavar="SECONDS",
    type=float,
    help="Commit what S3 clients write: 0 after every write, N every N seconds (default: never; commit with `fabric commit`).",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve HTTPS with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Private key for --tls-cert (PEM).")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True)
@handle_errors
def hub(
    data_dir: str,
    listen: str,
    s3_listen: str | None,
    db: str | None,
    catalog_sync: str,
    catalog_pool: int,
    store: str | None,
    no_auth: bool,
    s3_autocommit: float | None,
    tls_cert: str | None,
    tls_key: str | None,
    log_level: str,
) -> None:
    """Run a hub: the authoritative, versioned store that spokes and clients talk to.

    On first start a global admin token is written to DIR/admin.token (mode
    0600); it is never printed or logged. Create more with `fabric token create`.

    Several hub processes, each with its own DIR and --listen, on one --db
    postgresql://… and one --store s3://…, are one hub: any of them answers any
    request (uploads, tokens and watch streams included).
    """
    import uvicorn

    from fabric.api.serving import serve_together

    from .app import create_app

    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if s3_autocommit is not None and not s3_listen:
        raise click.UsageError("--s3-autocommit needs --s3-listen")
    if s3_autocommit is not None and s3_autocommit < 0:
        raise click.UsageError("--s3-autocommit: give 0 (after every write) or a number of seconds")
    s3_addr = parse_listen(s3_listen) if s3_listen else None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    host, port = parse_listen(listen)
    # One hub per data directory, held until the command ends: a second one on DIR is refused.
    click.get_current_context().with_resource(DirLock(data_dir, "hub data directory"))
    engine = Engine.open(data_dir, db, store, catalog_sync=catalog_sync, catalog_pool=catalog_pool)
    tokens = TokenStore(engine.catalog.db)
    written = write_bootstrap_token(tokens, data_dir)
    if written:
        log.info("wrote a bootstrap admin token to %s", written)
    log.info(
        "hub: catalog %s, store %s, auth %s",
        redact(engine.catalog.db.url),
        engine.store.describe(),
        "off" if no_auth else "on",
    )
    app = create_app(engine, tokens, auth=not no_auth)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, ssl_certfile=tls_cert, ssl_keyfile=tls_key, timeout_keep_alive=30
    )
    if s3_addr is None:
        serve_together([config])
        return
    from fabric.api.s3.serve import s3_uvicorn_config

    from .s3 import create_s3_app

    s3_app = create_s3_app(
        engine, tokens, auth=not no_auth, autocommit=s3_autocommit, access_log=log_level in ("debug", "info")
    )
    s3_config = s3_uvicorn_config(s3_app, s3_addr[0], s3_addr[1], log_level, ssl_certfile=tls_cert, ssl_keyfile=tls_key)
    log.info("S3 API on %s://%s:%d", "https" if tls_cert else "http", s3_addr[0], s3_addr[1])
    serve_together([config, s3_config])
