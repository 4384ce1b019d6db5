"""A userspace WAN emulator: a TCP proxy that adds one-way latency and a bandwidth cap.

Tests and benchmarks put it between a spoke and its hub where the kernel has no
``netem``::

    with WanProxy("127.0.0.1", hub_port, delay_ms_up=25, delay_ms_down=25, rate_mbit=1000) as wan:
        spoke = Spoke(hub_url=wan.url_for())
        ...
        wan.cut()      # outage: every connection is reset, new ones are refused
        wan.restore()  # the link is back

Model
-----
*up* is client -> target, *down* is target -> client. Each direction is a link
with its own one-way propagation delay and, optionally, a rate.

* **Latency is propagation delay, pipelined.** Every chunk read from one side is
  stamped with the time it was read and written to the other side at
  ``stamp + delay`` by a timer; reading goes on meanwhile. A 50 ms RTT link
  therefore carries as much as the window allows (here: up to ``max_inflight``
  bytes per direction per connection in the delay line), not ``chunk / delay``.
* **Rate is a token bucket shared per direction**, like one physical link: all
  connections together get ``rate_mbit * 125000`` bytes/s up and the same down.
  A chunk that overdraws the bucket leaves the bottleneck when the debt is paid
  (its delivery time moves by that much) and its connection reads nothing more
  until then, so senders are slowed by ordinary TCP back-pressure.
* **Handshake** (on by default): a new TCP connection costs one round trip
  before the client's first byte can travel, as on a real link. The client's
  data is held until ``accept + RTT`` and the server's first bytes until
  ``accept + delay_up``; so a request on a fresh connection takes 2 RTT, on a
  reused one 1 RTT.
* **Outages**: :meth:`WanProxy.cut` resets every open connection (RST to both
  ends, data in flight is lost) and stops listening, so new connections are
  refused until :meth:`WanProxy.restore`. The port stays reserved meanwhile.
* **Resets propagate**: when either end resets (or a write fails), the other end
  is reset at once, without the delay; data still in the delay line is dropped.
  Orderly closes and half-closes (FIN) travel with the data, after the delay.

The proxy runs an asyncio event loop in one background thread; every public
method is safe to call from any other thread.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Self

__all__ = ["WanProxy", "WanStats"]

#: Bytes per second in one Mbit/s.
MBIT = 125_000
#: Largest read from a socket; with a rate cap, reads are smaller (about 2 ms of the rate).
MAX_CHUNK = 256 * 1024
#: Transport write buffer above which the connection stops reading the other side.
WRITE_HIGH_WATER = 1024 * 1024
_EPS = 1e-6


class WanStats(dict):
    """Counters snapshot: ``bytes_up``, ``bytes_down`` (delivered), ``connections``
    (accepted in total), ``active`` (open now), ``failed`` (target unreachable),
    ``resets`` (connections reset by a peer, a write error or :meth:`WanProxy.cut`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _Link:
    """One direction of the emulated link, shared by all connections."""

    def __init__(self, delay_s: float, rate_bps: float | None) -> None:
        self.delay = delay_s
        self.rate = rate_bps
        # Burst: 10 ms of the rate, at least 64 KiB (a token bucket never lets a
        # single read wait for itself beyond its own length at the rate).
        self.burst = max(65536.0, rate_bps * 0.01) if rate_bps else 0.0
        self.tokens = self.burst
        self.stamp: float | None = None
        self.bytes = 0
        # A stall (WanProxy.stall): nothing read before this loop time is delivered before it.
        self.held_until = 0.0
        if rate_bps:
            self.chunk = int(min(MAX_CHUNK, max(1460, rate_bps * 0.002)))
        else:
            self.chunk = MAX_CHUNK
        # One receive buffer for every connection in this direction: the loop reads
        # into it and copies the bytes out before it reads anything else.
        self.view = memoryview(bytearray(self.chunk))

    def reserve(self, n: int, now: float) -> float:
        """Take ``n`` bytes worth of tokens; seconds until they have left the bottleneck."""
        if not self.rate:
            return 0.0
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class _Side(asyncio.BufferedProtocol):
    """One socket of a proxied connection (the client's or the target's)."""

    def __init__(self, conn: _Conn, name: str, link: _Link) -> None:
        self.conn = conn
        self.name = name
        self.view = link.view
        self.transport: asyncio.Transport | None = None
        self.out: _Pipe | None = None  # pipe that reads from this side
        self.inp: _Pipe | None = None  # pipe that writes into this side
        self.reading = True
        self.lost = False

    # -- reading control ------------------------------------------------------
    def set_reading(self, on: bool) -> None:
        t = self.transport
        if t is None or t.is_closing() or on == self.reading:
            return
        self.reading = on
        if on:
            t.resume_reading()
        else:
            t.pause_reading()

    # -- protocol callbacks ---------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        # Nothing is read until both ends are connected and the pipes wired.
        transport.pause_reading()
        self.reading = False
        if self.name == "client":
            self.conn.client_connected()
        self.conn.update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        assert self.out is not None
        self.out.on_data(bytes(self.view[:nbytes]))

    def eof_received(self) -> bool:
        assert self.out is not None
        self.out.on_eof()
        return True  # keep the transport open: half-close

    def pause_writing(self) -> None:
        if self.inp is not None:
            self.inp.dst_blocked = True
            self.conn.update_reading()

    def resume_writing(self) -> None:
        if self.inp is not None:
            self.inp.dst_blocked = False
            self.conn.update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.conn.side_lost(self, exc)


class _Pipe:
    """One direction of one connection: a delay line from ``src`` into ``dst``."""

    def __init__(self, conn: _Conn, link: _Link, src: _Side, dst: _Side, not_before: float, limit: int) -> None:
        self.conn = conn
        self.loop = conn.loop
        self.link = link
        self.src = src
        self.dst = dst
        src.out = self
        dst.inp = self
        self.not_before = not_before
        self.limit = limit
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.queued = 0
        self.last_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.throttle: asyncio.TimerHandle | None = None
        self.dst_blocked = False
        self.eof_read = False
        self.done = False

    def wants_read(self) -> bool:
        return not (self.eof_read or self.throttle is not None or self.dst_blocked or self.queued >= self.limit)

    def on_data(self, data: bytes) -> None:
        now = self.loop.time()
        wait = self.link.reserve(len(data), now)
        at = max(max(now + wait, self.not_before) + self.link.delay, self.link.held_until)
        at = self.last_at = max(at, self.last_at)
        self.queue.append((at, data))
        self.queued += len(data)
        if wait > 0:
            # The bottleneck is busy: read nothing more until this chunk has left it.
            self.throttle = self.loop.call_at(now + wait, self._unthrottle)
        self.conn.update_reading()
        self._schedule()

    def on_eof(self) -> None:
        self.eof_read = True
        now = self.loop.time()
        at = self.last_at = max(max(now, self.not_before) + self.link.delay, self.last_at, self.link.held_until)
        self.queue.append((at, None))
        self.conn.update_reading()
        self._schedule()

    def _unthrottle(self) -> None:
        self.throttle = None
        self.conn.update_reading()

    def _schedule(self) -> None:
        if self.timer is None and self.queue:
            self.timer = self.loop.call_at(self.queue[0][0], self._deliver)

    def _deliver(self) -> None:
        self.timer = None
        t = self.dst.transport
        if t is None or t.is_closing():
            self.queue.clear()
            self.queued = 0
            return
        now = self.loop.time() + _EPS
        batch: list[bytes] = []
        n = 0
        eof = False
        q = self.queue
        while q and q[0][0] <= now:
            data = q.popleft()[1]
            if data is None:
                eof = True
                break
            batch.append(data)
            n += len(data)
        if batch:
            # Counted before the write: sending can release the GIL, and a reader that got the
            # bytes must never see a counter that does not include them yet.
            self.queued -= n
            self.link.bytes += n
            t.write(batch[0] if len(batch) == 1 else b"".join(batch))
        if eof:
            self.done = True
            if t.can_write_eof():
                try:
                    t.write_eof()
                except OSError:
                    pass  # the peer is already gone: nothing left to close on its side
            self.conn.pipe_done()
            return
        self.conn.update_reading()
        self._schedule()

    def cancel(self) -> None:
        for h in (self.timer, self.throttle):
            if h is not None:
                h.cancel()
        self.timer = self.throttle = None
        self.queue.clear()
        self.queued = 0


def _rst(transport: asyncio.Transport | None) -> None:
    """Abort ``transport`` with a TCP reset, so the peer sees an error, not an EOF.

    Also cuts short a graceful close still flushing its buffer."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


class _Conn:
    """A proxied connection: the client's socket, the target's, two pipes."""

    def __init__(self, proxy: WanProxy) -> None:
        self.proxy = proxy
        assert proxy._loop is not None
        self.loop: asyncio.AbstractEventLoop = proxy._loop
        self.start = self.loop.time()
        self.client = _Side(self, "client", proxy._up)
        self.target = _Side(self, "target", proxy._down)
        up, down = proxy._up, proxy._down
        hs = proxy.handshake
        limit = proxy.max_inflight
        self.up = _Pipe(self, up, self.client, self.target, self.start + (up.delay + down.delay if hs else 0.0), limit)
        self.down = _Pipe(self, down, self.target, self.client, self.start + (up.delay if hs else 0.0), limit)
        self.ready = False
        self.closing = False
        self.task: asyncio.Task | None = None

    def client_connected(self) -> None:
        p = self.proxy
        if p._cut or p._stopping:
            self.closing = True
            _rst(self.client.transport)
            return
        p._conns.add(self)
        p._n_conns += 1
        self.task = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        p = self.proxy
        try:
            await self.loop.create_connection(lambda: self.target, p.target_host, p.target_port)
        except asyncio.CancelledError:
            self.task = None
            self.abort()
            raise
        except OSError:
            self.task = None
            p._n_failed += 1
            self.closing = True  # not counted as a reset
            self.abort()
            return
        self.task = None
        if self.closing:
            _rst(self.target.transport)
            return
        self.ready = True
        self.update_reading()

    def update_reading(self) -> None:
        if not self.ready or self.closing:
            return
        self.client.set_reading(self.up.wants_read())
        self.target.set_reading(self.down.wants_read())

    def pipe_done(self) -> None:
        if self.up.done and self.down.done and not self.closing:
            self.closing = True
            for side in (self.client, self.target):
                if side.transport is not None:
                    side.transport.close()  # flushes what is buffered first

    def abort(self) -> None:
        """Reset both ends now (outage, peer reset, stop)."""
        if self.task is not None:
            self.task.cancel()
        if not self.closing:
            self.proxy._n_resets += 1
        self.closing = True
        self.up.cancel()
        self.down.cancel()
        _rst(self.client.transport)
        _rst(self.target.transport)
        self._maybe_forget()

    def side_lost(self, side: _Side, exc: Exception | None) -> None:
        if exc is not None or not self.closing:
            # A reset, a failed write, or a close we did not ask for: reset the other end too.
            self.abort()
        self._maybe_forget()

    def _maybe_forget(self) -> None:
        c_done = self.client.lost or self.client.transport is None
        t_done = self.target.lost or (self.target.transport is None and self.task is None)
        if c_done and t_done:
            self.up.cancel()
            self.down.cancel()
            self.proxy._conns.discard(self)


class WanProxy:
    """TCP proxy to ``target_host:target_port`` emulating a WAN link (see the module doc).

    ``delay_ms_up``/``delay_ms_down``: one-way propagation delay client->target and
    target->client. ``rate_mbit``: cap per direction, shared by all connections
    (``None``: uncapped). ``handshake``: charge one RTT for connection setup.
    ``max_inflight``: bytes one direction of one connection may hold in its delay
    line (an emulated window; 16 MiB carries 5 Gbit/s at 25 ms one-way).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        delay_ms_up: float = 0.0,
        delay_ms_down: float = 0.0,
        rate_mbit: float | None = None,
        *,
        handshake: bool = True,
        max_inflight: int = 16 * 1024 * 1024,
    ) -> None:
        if delay_ms_up < 0 or delay_ms_down < 0:
            raise ValueError("delays must be >= 0")
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError("rate_mbit must be > 0 (or None for no cap)")
        self.target_host = target_host
        self.target_port = int(target_port)
        self.listen_host = listen_host
        self.listen_port = int(listen_port)
        self.delay_ms_up = float(delay_ms_up)
        self.delay_ms_down = float(delay_ms_down)
        self.rate_mbit = rate_mbit
        self.handshake = handshake
        self.max_inflight = int(max_inflight)
        self.port: int = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._placeholder: socket.socket | None = None
        self._family = socket.AF_INET
        self._sockaddr: Any = None
        self._conns: set[_Conn] = set()
        self._cut = False
        self._stopping = False
        rate = rate_mbit * MBIT if rate_mbit else None
        self._up = _Link(self.delay_ms_up / 1000.0, rate)
        self._down = _Link(self.delay_ms_down / 1000.0, rate)
        self._n_conns = self._n_failed = self._n_resets = 0

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> Self:
        """Bind, start the proxy thread, return once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("WanProxy already started")
        self._cut = self._stopping = False
        self._conns = set()
        infos = socket.getaddrinfo(self.listen_host, self.listen_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self._family, _, _, _, self._sockaddr = infos[0]
        sock = self._bind(listen=True)
        self.port = sock.getsockname()[1]
        self._sockaddr = (self._sockaddr[0], self.port, *self._sockaddr[2:])
        loop = asyncio.new_event_loop()
        self._loop = loop
        started: Future = Future()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(sock, started))
                loop.run_forever()
            finally:
                try:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    asyncio.set_event_loop(None)
                    loop.close()

        self._thread = threading.Thread(target=run, name=f"wanproxy-{self.port}", daemon=True)
        self._thread.start()
        try:
            started.result(timeout=10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Reset every connection, close the listener and join the thread. Idempotent."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if thread.is_alive() and not loop.is_closed():
            try:
                fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
                fut.result(timeout=timeout)
            except (TimeoutError, RuntimeError, OSError):
                pass  # the loop is stopped below regardless
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("WanProxy thread did not stop")
        self._thread = None
        self._loop = None
        self._close_placeholder()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- outages --------------------------------------------------------------
    def cut(self) -> None:
        """Outage: reset all current connections and refuse new ones until :meth:`restore`."""
        self._call(self._do_cut)

    def restore(self) -> None:
        """End an outage started by :meth:`cut`: accept connections again on the same port."""
        self._call(self._do_restore)

    @property
    def is_cut(self) -> bool:
        return self._cut

    def shape(self, delay_ms_up: float, delay_ms_down: float, rate_mbit: float | None) -> None:
        """Change the link while it carries traffic (a route that got slower, or faster again).

        Bytes already in a delay line keep the time they were given; bytes read from now on get
        the new delay and rate. Connections stay open."""
        if delay_ms_up < 0 or delay_ms_down < 0 or (rate_mbit is not None and rate_mbit <= 0):
            raise ValueError("delays must be >= 0 and rate_mbit > 0 (or None)")

        async def apply() -> None:
            rate = rate_mbit * MBIT if rate_mbit else None
            for link, delay in ((self._up, delay_ms_up), (self._down, delay_ms_down)):
                link.delay = delay / 1000.0
                link.rate = rate
                link.burst = max(65536.0, rate * 0.01) if rate else 0.0
                link.tokens = min(link.tokens, link.burst)
            self.delay_ms_up, self.delay_ms_down, self.rate_mbit = float(delay_ms_up), float(delay_ms_down), rate_mbit

        self._call(apply)

    def stall(self, seconds: float) -> None:
        """A packet-level stall: for ``seconds`` no byte crosses the link in either direction,
        but no connection is reset or refused (a black-holed route that comes back). What is
        read meanwhile is delivered when the stall ends, in order."""

        async def apply() -> None:
            assert self._loop is not None
            until = self._loop.time() + max(0.0, seconds)
            for link in (self._up, self._down):
                link.held_until = max(link.held_until, until)

        self._call(apply)

    # -- information ----------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        return (self.listen_host, self.port)

    def url_for(self, scheme: str = "http") -> str:
        host = self.listen_host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}"

    @property
    def bytes_up(self) -> int:
        return self._up.bytes

    @property
    def bytes_down(self) -> int:
        return self._down.bytes

    @property
    def connections(self) -> int:
        """Connections accepted so far (not counting those refused during a cut)."""
        return self._n_conns

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    def stats(self) -> WanStats:
        return WanStats(
            bytes_up=self._up.bytes,
            bytes_down=self._down.bytes,
            connections=self._n_conns,
            active=len(self._conns),
            failed=self._n_failed,
            resets=self._n_resets,
        )

    def __repr__(self) -> str:
        rate = f"{self.rate_mbit:g} Mbit/s" if self.rate_mbit else "uncapped"
        return (
            f"WanProxy({self.listen_host}:{self.port} -> {self.target_host}:{self.target_port}, "
            f"up {self.delay_ms_up:g} ms, down {self.delay_ms_down:g} ms, {rate})"
        )

    # -- internals (loop thread) ----------------------------------------------
    def _bind(self, listen: bool) -> socket.socket:
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self._sockaddr)
            if listen:
                sock.listen(1024)
                sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _serve(self, sock: socket.socket, started: Future) -> None:
        try:
            self._server = await self._loop.create_server(self._accept, sock=sock)  # type: ignore[union-attr]
        except (OSError, RuntimeError) as e:
            sock.close()
            started.set_exception(e)
            return
        started.set_result(None)

    def _accept(self) -> _Side:
        # asyncio may run this for a connection it accepted just before the listener
        # closed (stop or cut). Raising drops the socket at once; a transport built
        # for a closed server would fail half-made and keep the socket open in a
        # reference cycle until the garbage collector ran, so the client would hang.
        if self._cut or self._stopping:
            raise ConnectionAbortedError("the proxy is not accepting connections")
        return _Conn(self).client

    def _call(self, fn: Callable[[], Coroutine[Any, Any, None]], timeout: float = 10.0) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            raise RuntimeError("WanProxy is not running")
        if threading.current_thread() is self._thread:
            # From a callback on the proxy's own loop: cannot wait, so just schedule it.
            loop.create_task(fn())
            return
        asyncio.run_coroutine_threadsafe(fn(), loop).result(timeout)

    async def _do_cut(self) -> None:
        if self._cut:
            return
        self._cut = True
        if self._server is not None:
            self._server.close()  # closes the listening socket now
            self._server = None
        # Keep the port reserved (bound, not listening: connects are refused) so
        # that restore() gets it back and no outgoing connection takes it meanwhile.
        try:
            self._placeholder = self._bind(listen=False)
        except OSError:
            self._placeholder = None
        for conn in list(self._conns):
            conn.abort()

    async def _do_restore(self) -> None:
        if not self._cut or self._stopping:
            return
        deadline = time.monotonic() + 5.0
        while True:
            try:
                sock = self._bind(listen=True)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        assert self._loop is not None
        self._cut = False  # before serving starts: connections accepted from now on are kept
        try:
            self._server = await self._loop.create_server(self._accept, sock=sock)
        except BaseException:
            self._cut = True
            sock.close()
            raise
        self._close_placeholder()

    def _close_placeholder(self) -> None:
        if self._placeholder is not None:
            self._placeholder.close()
            self._placeholder = None

    async def _shutdown(self) -> None:
        self._stopping = True
        server = self._server
        if server is not None:
            server.close()
        self._server = None
        for conn in list(self._conns):
            conn.abort()
        # Let aborted transports run their connection_lost (closing their sockets).
        for _ in range(100):
            if not self._conns:
                break
            await asyncio.sleep(0.001)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)
