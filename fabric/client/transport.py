"""An httpx transport on the standard library's :mod:`http.client`, for clients that move bulk bytes.

httpx's own transport (httpcore and h11) hands a response body over in pieces of at most
64 KiB, each copied from the socket, into h11's receive buffer and out of it again. A mount
reading a large file with nothing cached spent half of its CPU there: receiving 256 MiB of
``/chunks/frames`` records took 0.27-0.33 CPU-seconds through httpx, and 0.09 through
``http.client``, which reads a piece straight off the socket once (bench/RESULTS.md,
"Nothing cached: the client's receive path"). :class:`HttpClientTransport` keeps httpx's
client, with its requests, responses, timeouts and errors, and sends each request on an
``http.client`` connection instead:

- connections are kept per server and reused (HTTP/1.1 keep-alive), each by one request at a
  time; one the server has closed while idle is noticed before reuse (its socket is readable)
  and replaced;
- a request body in memory goes out with its headers in one write; a streamed one (an
  upload) in chunked encoding, or as is when its length was given; a server that answers
  before it has read the whole body (a refusal: 403, 413) and closes the connection has that
  answer returned, as httpx's own transport does, not the failed write;
- a response body is read in pieces of up to :data:`PIECE` bytes, each one read from the
  socket (whatever it holds, never more than the body has left);
- timeouts are httpx's (``connect``; ``read`` for every later wait, ``write`` for the
  request), and failures are httpx's exceptions (``ConnectError``, ``ReadTimeout``,
  ``RemoteProtocolError`` for a body cut short...), so callers handle them as before.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from collections.abc import Iterator

import httpx

#: The most a response body's piece holds.
PIECE = 1 << 20
#: Idle connections kept per server.
MAX_IDLE = 32

_Key = tuple[str, str, int]


class HttpClientTransport(httpx.BaseTransport):
    """See the module docstring. ``verify``: as httpx's (used for ``https://`` servers);
    ``retries``: connection attempts made again after one fails (as httpx's)."""

    def __init__(self, verify: ssl.SSLContext | str | bool = True, retries: int = 0) -> None:
        self._verify = verify
        self._retries = retries
        self._context: ssl.SSLContext | None = None
        self._idle: dict[_Key, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.scheme, request.url.host, request.url.port or (443 if request.url.scheme == "https" else 80))
        conn = self._take(key) or self._connect(key, request, timeouts.get("connect"))
        phase = "write"
        unsent: OSError | None = None
        try:
            _settimeout(conn, timeouts.get("write"))
            try:
                _send(conn, request)
            except OSError as exc:
                unsent = exc  # a server may refuse before it reads the whole body, and close: its answer is read below
            phase = "read"
            _settimeout(conn, timeouts.get("read"))
            response = conn.getresponse()
        except BaseException as exc:
            conn.close()
            if unsent is not None:
                raise _translate(unsent, request, "write") from unsent
            raise _translate(exc, request, phase) from exc
        return httpx.Response(
            response.status,
            headers=response.getheaders(),
            stream=_Body(self, key, conn, response, request, reusable=unsent is None),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason.encode("latin-1", "replace")},
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()

    # -- connections -------------------------------------------------------------
    def _take(self, key: _Key) -> http.client.HTTPConnection | None:
        """An idle connection to ``key`` the server has not closed, if there is one."""
        while True:
            with self._lock:
                conns = self._idle.get(key)
                if not conns:
                    return None
                conn = conns.pop()
            if conn.sock is not None and not _readable(conn.sock):
                return conn
            conn.close()  # closed by the server (or it sent what nobody asked for)

    def _release(self, key: _Key, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle.setdefault(key, [])
            if not self._closed and len(conns) < MAX_IDLE:
                conns.append(conn)
                return
        conn.close()

    def _connect(self, key: _Key, request: httpx.Request, timeout: float | None) -> http.client.HTTPConnection:
        scheme, host, port = key
        conn: http.client.HTTPConnection
        if scheme == "https":
            if self._context is None:
                self._context = httpx.create_ssl_context(self._verify)
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context)
        elif scheme == "http":
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        else:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}", request=request)
        attempts = 0
        while True:
            try:
                conn.connect()
                return conn
            except BaseException as exc:
                conn.close()
                error = _translate(exc, request, "connect")
                if attempts >= self._retries or not isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
                    raise error from exc
                attempts += 1


class _Body(httpx.SyncByteStream):
    """A response's body, read off its connection; the connection goes back to the pool once
    the body has been read to its end, and is closed otherwise."""

    def __init__(
        self, transport: HttpClientTransport, key: _Key, conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse, request: httpx.Request, reusable: bool = True,
    ) -> None:
        """``reusable``: False for the answer to a request not sent whole (its connection is closed after it)."""
        self._transport, self._key, self._conn, self._response, self._request = transport, key, conn, response, request
        self._reusable = reusable
        self._complete = False

    def __iter__(self) -> Iterator[bytes]:
        response = self._response
        try:
            while piece := response.read1(PIECE):
                yield piece
        except Exception as exc:
            raise _translate(exc, self._request, "read") from exc
        if not response.chunked and response.length:
            raise httpx.RemoteProtocolError(
                f"the server closed the connection {response.length} bytes before the end of the body", request=self._request
            )
        self._complete = True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reusable = self._reusable and self._complete and not self._response.will_close
        self._response.close()
        if reusable:
            self._transport._release(self._key, conn)
        else:
            conn.close()


def _send(conn: http.client.HTTPConnection, request: httpx.Request) -> None:
    conn.putrequest(request.method, request.url.raw_path.decode("ascii"), skip_host=True, skip_accept_encoding=True)
    for name, value in request.headers.raw:
        conn.putheader(name, value)
    if isinstance(request.stream, httpx.ByteStream) or request.stream is None:
        conn.endheaders(request.read() or None)
        return
    chunked = request.headers.get("Transfer-Encoding", "").lower() == "chunked"
    conn.endheaders(iter(request.stream), encode_chunked=chunked)  # type: ignore[arg-type]


def _settimeout(conn: http.client.HTTPConnection, timeout: float | None) -> None:
    if conn.sock is not None:
        conn.sock.settimeout(timeout)


def _readable(sock: socket.socket) -> bool:
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    try:
        return bool(poll.poll(0))
    except OSError:
        return True


def _translate(exc: BaseException, request: httpx.Request, phase: str) -> BaseException:
    """``exc`` as the httpx exception of the phase it happened in (others unchanged)."""
    if isinstance(exc, httpx.HTTPError):
        return exc
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, TimeoutError):  # (socket.timeout too)
        kind = {"connect": httpx.ConnectTimeout, "write": httpx.WriteTimeout}.get(phase, httpx.ReadTimeout)
        return kind(message, request=request)
    if phase == "connect" and isinstance(exc, OSError):  # refused, unresolvable, a TLS handshake failed
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, (http.client.HTTPException, ssl.SSLError)):  # RemoteDisconnected: closed without answering
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, OSError):
        return (httpx.WriteError if phase == "write" else httpx.ReadError)(message, request=request)
    return exc
