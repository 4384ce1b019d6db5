"""fabric.client.transport: httpx's client on http.client connections, against real sockets on loopback."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from fabric.client.transport import HttpClientTransport
from fabric.errors import Forbidden


class RawServer:
    """A loopback server that answers each request on a connection with ``answer(head, conn)``
    and counts the connections it accepted."""

    def __init__(self, answer: Callable[[bytes, socket.socket], bool]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.bodies: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._requests(conn)
        except OSError:  # the client went away (a reset)
            pass

    def _requests(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            body, buf = _body(head, buf, conn)
            self.bodies.append(body)
            if not self.answer(head, conn):
                return

    def close(self) -> None:
        self.sock.close()


def _body(head: bytes, buf: bytes, conn: socket.socket) -> tuple[bytes, bytes]:
    """The request's body (by Content-Length or chunked) and what follows it."""
    lines = head.lower().split(b"\r\n")
    length = next((int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length:")), None)
    chunked = any(x.startswith(b"transfer-encoding:") and b"chunked" in x for x in lines)

    def need(n: int) -> None:
        nonlocal buf
        while len(buf) < n:
            buf += conn.recv(65536)

    if length is not None:
        need(length)
        return buf[:length], buf[length:]
    if not chunked:
        return b"", buf
    body = b""
    while True:
        while b"\r\n" not in buf:
            buf += conn.recv(65536)
        size_line, buf = buf.split(b"\r\n", 1)
        size = int(size_line, 16)
        need(size + 2)
        body, buf = body + buf[:size], buf[size + 2 :]
        if size == 0:
            return body, buf


def ok(payload: bytes) -> Callable[[bytes, socket.socket], bool]:
    def answer(head: bytes, conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        return True

    return answer


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(transport=HttpClientTransport(), timeout=httpx.Timeout(5.0, read=1.0)) as c:
        yield c


def test_requests_share_one_connection_and_bodies_arrive_whole(client: httpx.Client) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: several pieces
    server = RawServer(ok(payload))
    try:
        for _ in range(3):
            assert client.post(server.url + "/x", content=b"small body").content == payload
        assert server.connections == 1
        assert server.bodies == [b"small body"] * 3
    finally:
        server.close()


def test_a_streamed_upload_goes_out_chunked(client: httpx.Client) -> None:
    server = RawServer(ok(b"done"))
    try:
        parts = [b"a" * 100_000, b"b" * 3, b"c" * 70_000]
        assert client.put(server.url + "/up", content=iter(parts)).content == b"done"
        assert server.bodies == [b"".join(parts)]
    finally:
        server.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(client: httpx.Client) -> None:
    def answer_once(head: bytes, conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        return False  # then close, as a server's keep-alive timeout does

    server = RawServer(answer_once)
    try:
        assert client.get(server.url).content == b"hi"
        time.sleep(0.2)
        assert client.post(server.url, content=b"not sent twice").content == b"hi"
        assert server.connections == 2
        assert server.bodies[-1] == b"not sent twice"
    finally:
        server.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\nonly this",
    ],
    ids=["content-length", "chunked"],
)
def test_a_body_cut_short_is_an_error_and_the_connection_is_not_reused(client: httpx.Client, reply: bytes) -> None:
    def cut(head: bytes, conn: socket.socket) -> bool:
        conn.sendall(reply)
        return False

    server = RawServer(cut)
    try:
        with pytest.raises(httpx.TransportError):
            client.get(server.url)
        with pytest.raises(httpx.TransportError):
            client.get(server.url)
        assert server.connections == 2
    finally:
        server.close()


def test_a_silent_server_is_a_read_timeout(client: httpx.Client) -> None:
    server = RawServer(lambda head, conn: (time.sleep(3), False)[1])
    try:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            client.get(server.url)
        assert time.monotonic() - started < 2.5
    finally:
        server.close()


def test_a_refused_connection_is_a_connect_error(client: httpx.Client) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(httpx.ConnectError):
            client.get(f"http://127.0.0.1:{port}/")


def test_a_body_left_unread_closes_its_connection(client: httpx.Client) -> None:
    server = RawServer(ok(b"x" * 3_000_000))
    try:
        with client.stream("GET", server.url) as response:
            next(response.iter_raw())
        assert client.get(server.url).content == b"x" * 3_000_000
        assert server.connections == 2
    finally:
        server.close()


def test_a_refusal_sent_before_the_body_was_read_is_the_answer(client: httpx.Client) -> None:
    """A server that answers after the headers alone (403 for a 64 MiB upload) and closes: the
    client's write fails, and the answer it gets is the 403, not a write error."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    def refuse() -> None:
        conn, _ = sock.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nConnection: close\r\n\r\nrefused")
            conn.shutdown(socket.SHUT_WR)
            time.sleep(0.5)  # (the client is still sending: what it sends is never read)

    threading.Thread(target=refuse, daemon=True).start()
    try:
        response = client.put(f"http://127.0.0.1:{port}/up", content=iter([b"x" * (1 << 20)] * 64))
        assert response.status_code == 403 and response.content == b"refused"
    finally:
        sock.close()


def test_a_large_upload_without_the_right_is_forbidden_not_unreachable(hub) -> None:  # noqa: ANN001 - tests.hubserver.Hub
    """Through a real hub: a 64 MiB object put with a read-only token is refused, and the client
    reports the refusal (whether the hub answers before or after reading the body), storing nothing."""
    from fabric.client.http import HttpPlane
    from tests.hubserver import unique_name

    repo = hub.new_repo("transport")
    reader = hub.plane().create_token(unique_name("reader"), roles={repo: "read"})["token"]
    plane = HttpPlane(hub.url, reader)
    try:
        with pytest.raises(Forbidden):
            plane.put_object(repo, "main", "big.bin", io.BytesIO(b"x" * (64 << 20)))
    finally:
        plane.close()
    assert hub.plane().list(repo, "main").entries == []
