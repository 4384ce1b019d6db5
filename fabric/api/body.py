"""A blocking file-like view of an async request body, for code that runs in a thread."""

from __future__ import annotations

import anyio.from_thread
from starlette.requests import ClientDisconnect, Request

from fabric.errors import BadRequest


class BodyReader:
    """``read(n)`` pulls the request body piece by piece from the event loop.

    Use it only from a worker thread started with ``anyio.to_thread.run_sync``;
    memory stays bounded by what the caller asks for at a time.
    """

    def __init__(self, request: Request) -> None:
        self._stream = request.stream().__aiter__()
        self._buf = bytearray()
        self._done = False

    async def _next(self) -> bytes | None:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            return None
        except ClientDisconnect:
            raise BadRequest("the client disconnected before the body was complete") from None

    def read(self, n: int = -1) -> bytes:
        while not self._done and (n < 0 or len(self._buf) < n):
            part = anyio.from_thread.run(self._next)
            if part is None:
                self._done = True
            else:
                self._buf += part
        return take(self._buf, n)


def take(buf: bytearray, n: int) -> bytes:
    """Remove and return the first ``n`` bytes of ``buf`` (all of them when ``n`` is negative
    or at least its length): the read side shared by the blocking body views."""
    if n < 0 or n >= len(buf):
        out = bytes(buf)
        buf.clear()
    else:
        out = bytes(buf[:n])
        del buf[:n]
    return out
