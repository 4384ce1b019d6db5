"""``fabric wan-proxy``: put an emulated WAN link (latency, bandwidth) in front of a server."""

from __future__ import annotations

import json
import signal
import threading

import click

from fabric.cli.context import Ctx, handle_errors


def _hostport(value: str, what: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (host 127.0.0.1)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}", param_hint=what)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


@click.command("wan-proxy")
@click.option("--listen", default="127.0.0.1:9600", show_default=True, metavar="HOST:PORT", help="Address to accept clients on (port 0: any free port).")
@click.option("--target", required=True, metavar="HOST:PORT", help="Server to forward to (e.g. the hub at 127.0.0.1:8600).")
@click.option("--rtt-ms", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Round-trip time to add, split evenly into both directions.")
@click.option("--delay-up-ms", type=click.FloatRange(min=0), default=None, help="One-way delay client->target (overrides half of --rtt-ms).")
@click.option("--delay-down-ms", type=click.FloatRange(min=0), default=None, help="One-way delay target->client (overrides half of --rtt-ms).")
@click.option("--rate-mbit", type=click.FloatRange(min=0, min_open=True), default=None, help="Bandwidth cap per direction, shared by all connections. Default: none.")
@click.option("--no-handshake", is_flag=True, help="Do not charge one RTT for setting up each connection.")
@handle_errors
def wan_proxy(
    listen: str,
    target: str,
    rtt_ms: float,
    delay_up_ms: float | None,
    delay_down_ms: float | None,
    rate_mbit: float | None,
    no_handshake: bool,
) -> None:
    """Forward TCP from --listen to --target through an emulated WAN link, until Ctrl-C.

    Adds real propagation delay (pipelined: a long link still carries a full
    window) and an optional bandwidth cap, like netem on hosts that lack it.

    \b
    Example: a spoke 50 ms and 1 Gbit/s away from its hub:
      fabric wan-proxy --listen 127.0.0.1:9600 --target 127.0.0.1:8600 --rtt-ms 50 --rate-mbit 1000
    """
    from testbed.wanproxy import WanProxy

    lhost, lport = _hostport(listen, "--listen")
    thost, tport = _hostport(target, "--target")
    up = rtt_ms / 2 if delay_up_ms is None else delay_up_ms
    down = rtt_ms / 2 if delay_down_ms is None else delay_down_ms
    proxy = WanProxy(thost, tport, lhost, lport, delay_ms_up=up, delay_ms_down=down, rate_mbit=rate_mbit, handshake=not no_handshake)
    try:
        proxy.start()
    except OSError as e:
        raise click.ClickException(f"cannot listen on {listen}: {e}") from e
    done = threading.Event()
    # Ctrl-C and SIGTERM stop it whatever this process inherited (a parent may ignore or block them).
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in stops}
    rate = f"{rate_mbit:g} Mbit/s per direction" if rate_mbit else "no rate cap"
    host = f"[{lhost}]" if ":" in lhost else lhost
    ctx = click.get_current_context().find_object(Ctx)
    as_json = ctx is not None and ctx.json
    if as_json:
        info = {"listen": f"{host}:{proxy.port}", "target": f"{thost}:{tport}", "delay_ms_up": up, "delay_ms_down": down, "rate_mbit": rate_mbit}
        click.echo(json.dumps(info, sort_keys=True))
    else:
        click.echo(f"wan-proxy listening on {host}:{proxy.port} -> {thost}:{tport} (up {up:g} ms, down {down:g} ms, {rate})")
        click.echo("Ctrl-C to stop.")
    try:
        while not done.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stats = proxy.stats()
        proxy.stop()
        if as_json:
            click.echo(json.dumps({"stopped": dict(stats)}, sort_keys=True))
        else:
            click.echo(
                f"wan-proxy stopped: {stats.connections} connections, "
                f"{stats.bytes_up} bytes up, {stats.bytes_down} bytes down"
            )
