"""Serving the S3 gateway beside a service's REST API, in one process and one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to :func:`serve_together`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def s3_uvicorn_config(app: Any, host: str, port: int, log_level: str, **kwargs: Any) -> uvicorn.Config:
    """uvicorn settings of an S3 listener: no uvicorn access log, since it prints query strings
    (presigned URLs carry X-Amz-Credential and X-Amz-Signature); the gateway logs method,
    path and status itself on ``fabric.s3.access``."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, timeout_keep_alive=30, **kwargs)


def serve_together(configs: list[uvicorn.Config]) -> None:
    """Run several uvicorn servers in one asyncio loop until SIGINT/SIGTERM stops them all."""

    async def main() -> None:
        servers = [_Server(c) for c in configs]
        loop = asyncio.get_running_loop()

        def stop(*_: object) -> None:
            for s in servers:
                if s.should_exit:
                    s.force_exit = True
                s.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop()  # one server ending (e.g. its port was taken) ends the others
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            t.result()

    asyncio.run(main())
