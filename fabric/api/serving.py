"""Running a service's HTTP listeners (REST, S3) in one process and one event loop, and
stopping them quietly.

On SIGINT/SIGTERM every listener stops accepting connections; responses in flight get
:data:`GRACE_SECONDS` to finish. Connections still open then (a watch stream, which
never ends by itself; a download whose client stopped reading) are closed, so their
responses end as on a client disconnect: quietly, instead of being cancelled with
tracebacks or keeping the process alive. A second signal closes them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn

from fabric.util.limits import raise_open_files_limit

log = logging.getLogger("fabric.serve")

#: How long responses in flight may still run after a stop signal.
GRACE_SECONDS = 3.0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to :func:`serve_together` and closes lingering
    connections after the grace period (uvicorn itself would wait for them forever)."""

    def __init__(self, config: uvicorn.Config, grace: float) -> None:
        super().__init__(config)
        self.grace = grace
        self._closing: asyncio.Task | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._closing = asyncio.create_task(self._close_lingering(self.grace))
        try:
            await super().shutdown(sockets)
        finally:
            self._closing.cancel()

    def close_now(self) -> None:
        """Close every open connection now (a second stop signal)."""
        asyncio.get_running_loop().create_task(self._close_lingering(0))

    async def _close_lingering(self, delay: float) -> None:
        await asyncio.sleep(delay)
        lingering = list(self.server_state.connections)
        if lingering:
            log.info("closing %d connection(s) still open on %s:%s", len(lingering), self.config.host, self.config.port)
        for connection in lingering:
            transport = getattr(connection, "transport", None)
            if transport is not None:
                # abort, not close: close() waits to flush what a client that stopped reading never takes.
                transport.abort()


def serve_together(configs: list[uvicorn.Config], grace: float = GRACE_SECONDS) -> None:
    """Run uvicorn servers in one asyncio loop until SIGINT/SIGTERM (or one of them ending) stops them all."""
    raise_open_files_limit()

    async def main() -> None:
        servers = [_Server(c, grace) for c in configs]
        loop = asyncio.get_running_loop()
        signalled = False

        def stop_all() -> None:
            for s in servers:
                s.should_exit = True

        def on_signal() -> None:
            nonlocal signalled
            if signalled:
                for s in servers:
                    s.close_now()
            signalled = True
            stop_all()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        # What start-up made (modules, the app, the plane) lives as long as the process: out of
        # the collector's sight, a full collection walks only what came later. It took 27-56 ms
        # in a spoke during a loader run (5-7 ms frozen), a pause for every request in flight.
        gc.collect()
        gc.freeze()
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop_all()  # one server ending (e.g. its port was taken) ends the others
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            t.result()

    asyncio.run(main())
