"""Prometheus metrics: an ASGI middleware for request counts, latency and bytes."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    """One registry per service instance (tests start many in one process)."""

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fabric_http_requests", "HTTP requests", ["service", "method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "fabric_http_request_seconds", "HTTP request latency", ["service", "method", "route"], registry=self.registry
        )
        self.bytes = Counter(
            "fabric_http_bytes", "HTTP body bytes", ["service", "direction"], registry=self.registry
        )
        self.service = service

    def response(self, collect: Callable[[], None] | None = None) -> Response:
        if collect is not None:
            collect()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.m = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]
        svc = self.m.service

        async def counting_receive() -> Message:
            msg = await receive()
            if msg["type"] == "http.request":
                self.m.bytes.labels(svc, "in").inc(len(msg.get("body", b"")))
            return msg

        async def counting_send(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            elif msg["type"] == "http.response.body":
                self.m.bytes.labels(svc, "out").inc(len(msg.get("body", b"")))
            await send(msg)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self.m.requests.labels(svc, method, name, str(status[0])).inc()
            self.m.latency.labels(svc, method, name).observe(time.perf_counter() - start)
