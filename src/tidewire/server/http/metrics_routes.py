"""Metrics over HTTP: ``GET /metrics`` (Prometheus text, or OpenMetrics when the scraper's
``Accept`` asks for it), ``GET /v1/metrics/recent`` (the recent-samples ring behind the
dashboard's charts), and :class:`HttpMetrics`, the ASGI middleware that times every request
of a listener by route template (never the raw path: one series per route, not per topic).

With authentication on, both routes need describe on the cluster: a Prometheus scrape
job sends an API key as a bearer token (``authorization: {credentials: <api key>}``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidewire.broker import Broker
from tidewire.errors import InvalidRequestError
from tidewire.observability.metrics import BrokerMetrics, metrics_for
from tidewire.observability.samples import RecentSamples, samples_for
from tidewire.server.gate import gate_for
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_body

__all__ = ["ROUTE_SCOPE_KEY", "HttpMetrics", "create_metrics_app", "metrics_router"]

#: Where the gate (``auth.HttpAuth``) leaves the matched route, ``"<METHOD> <template>"``.
ROUTE_SCOPE_KEY = "tidewire.route"

_DISABLED = "metrics are disabled on this broker (metrics_enabled = false)"


def metrics_router(ctx: GatewayContext) -> APIRouter:
    """``/metrics`` and ``/v1/metrics/recent``; starts the sampler (stopped when the
    gateway closes)."""
    router = APIRouter(tags=["metrics"])
    metrics = metrics_for(ctx.broker)
    if metrics.security_stats is None:
        metrics.security_stats = gate_for(ctx.broker).stats

    _start_sampler(ctx, metrics)

    @router.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text."}},
    )
    async def scrape(request: Request) -> Response:
        """Every metric of the broker in Prometheus' text format (OpenMetrics when
        ``Accept: application/openmetrics-text``). 404 when metrics are disabled
        (``metrics_enabled = false``). docs/observability.md lists the metrics."""
        if not metrics.enabled:
            return _disabled()
        _start_sampler(ctx, metrics)
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    @router.get("/v1/metrics/recent")
    async def recent() -> Response:
        """The last hour of broker-wide samples (every ``interval_s``): messages, bytes in
        and out and requests per second, connections, disk used, and each consumer group's
        total lag (the 50 largest), as ``[[unix seconds, value], ...]``; ``stream_series``:
        the lightweight streams' (streams, messages held, receivers, sent, taken and read
        per second, log bytes)."""
        if not metrics.enabled:
            return _disabled()
        ring = _start_sampler(ctx, metrics)
        return JSONResponse(ring.snapshot())

    return router


def create_metrics_app(broker: Broker) -> ASGIApp:
    """The app of ``metrics_port``: ``GET /metrics`` alone, as on the API's port (the gate
    in front of it is the same; docs/observability.md)."""
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    metrics = metrics_for(broker)
    if metrics.security_stats is None:
        metrics.security_stats = gate_for(broker).stats

    async def scrape(request: Request) -> Response:
        if not metrics.enabled:
            return _disabled()
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    return Starlette(routes=[Route("/metrics", scrape, methods=["GET"])])


def _disabled() -> Response:
    err = InvalidRequestError(_DISABLED)
    return Response(
        error_body(err.code, "InvalidRequestError", err.message),
        status_code=404,
        media_type="application/json",
    )


def _start_sampler(ctx: GatewayContext, metrics: BrokerMetrics) -> RecentSamples:
    ring = samples_for(metrics)
    if metrics.enabled and not ring.running and not ctx.closing.is_set():
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the app built outside a loop: started by the first request
            return ring
        ring.start(ctx.closing)
    return ring


class HttpMetrics:
    """ASGI middleware: time each request of one listener (``interface``) and count its
    errors (status >= 400) by route template; count WebSocket and SSE sessions open."""

    def __init__(self, app: ASGIApp, broker: Broker, interface: str = "http") -> None:
        self.app = app
        self.broker = broker
        self.interface = interface

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        metrics = metrics_for(self.broker)
        if kind not in ("http", "websocket") or not metrics.enabled:
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            metrics.streams_open["websocket"] += 1
            try:
                await self.app(scope, receive, send)
            finally:
                metrics.streams_open["websocket"] -= 1
            return
        started = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "sse": False}

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"content-type" and value.startswith(b"text/event-stream"):
                        state["sse"] = True
                        metrics.streams_open["sse"] += 1
            await send(message)

        metrics.http_in_flight += 1
        try:
            await self.app(scope, receive, send_counted)
        finally:
            metrics.http_in_flight -= 1
            if state["sse"]:
                metrics.streams_open["sse"] -= 1
            route = scope.get(ROUTE_SCOPE_KEY) or f"{scope['method']} (unmatched)"
            status = int(state["status"])
            metrics.observe_request(
                self.interface,
                route,
                time.perf_counter() - started,
                status if status >= 400 else None,
            )
