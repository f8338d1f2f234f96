"""The native HTTP API as a FastAPI app: ``create_app(broker, config)``.

The app calls the broker core directly, in the broker's event loop (run it with
:class:`~tidewire.server.http.gateway.HttpGateway`). Its OpenAPI spec is at ``/openapi.json``
and interactive docs at ``/docs``. Routes come in routers; :func:`routers` lists them, and a
new family of routes (streaming, say) is one more entry there.

Every request passes the gate of ``server/http/auth.py`` first: with authentication on,
``Authorization: Bearer <API key>`` (docs/security.md).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, FastAPI
from starlette.types import ASGIApp

from tidewire import __version__
from tidewire.broker import Broker
from tidewire.observability.metrics import configure_metrics
from tidewire.server.http._common import add_body_schemas
from tidewire.server.http.audit import audit_router
from tidewire.server.http.cluster_routes import cluster_router
from tidewire.server.http.config import HttpConfig
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.dashboard_routes import dashboard_router
from tidewire.server.http.errors import BodyLimit, install_error_handlers
from tidewire.server.http.fastpath import PublishFastPath
from tidewire.server.http.groups import groups_router
from tidewire.server.http.health import health_router
from tidewire.server.http.kafka_stats import kafka_stats_router
from tidewire.server.http.log_levels import log_levels_router
from tidewire.server.http.messages import messages_router
from tidewire.server.http.metrics_routes import metrics_router
from tidewire.server.http.observe import RequestObservation
from tidewire.server.http.peers import PublishForwarder
from tidewire.server.http.publisher import Publisher, shared_store
from tidewire.server.http.queue_messages import queue_messages_router
from tidewire.server.http.queue_ws import queue_ws_router
from tidewire.server.http.queues import queues_router
from tidewire.server.http.security import security_router
from tidewire.server.http.session_api import session_router
from tidewire.server.http.settings_api import settings_router
from tidewire.server.http.stream import stream_router
from tidewire.server.http.streams import streams_router
from tidewire.server.http.topics import topics_router

__all__ = ["asgi_app", "create_app", "routers"]

DESCRIPTION = """\
The native HTTP API of the tidewire broker: topics, publishing (one message or an atomic batch,
with `Idempotency-Key` for retries that store once), reading (long-poll), consumer groups,
exchanges and queues (publish, get, ack, dead letters), lightweight streams (send, long-poll
receive, read by resume token, SSE) and health. Every error answers
`{"error": {"code", "name", "message"}}` with the code of tidewire's error class. With
authentication on, every route but the health probes and this spec needs
`Authorization: Bearer <API key>` (401 without, 403 without the permission). Bodies are JSON
(`Content-Type: application/json`, 415 otherwise); a `Host` that is not the broker's is
answered 421 and a page of another origin 403 (docs/http.md, Security and limits).
"""


def routers(ctx: GatewayContext) -> list[APIRouter]:
    """Every router of the native API, in the order they are included.

    Add a family of routes here, built from ``ctx`` (the broker, the settings, the drain
    signal), e.g. ``stream_router(ctx)`` from ``tidewire.server.http.stream``.
    """
    return [
        topics_router(ctx),
        messages_router(ctx),
        groups_router(ctx),
        queues_router(ctx),
        queue_messages_router(ctx),
        queue_ws_router(ctx),
        streams_router(ctx),
        kafka_stats_router(ctx),
        cluster_router(ctx),
        health_router(ctx),
        stream_router(ctx),
        security_router(ctx),
        audit_router(ctx),
        session_router(ctx),
        settings_router(ctx),
        dashboard_router(ctx),
        metrics_router(ctx),
        log_levels_router(ctx),
    ]


def create_app(
    broker: Broker, config: HttpConfig, *, closing: asyncio.Event | None = None
) -> FastAPI:
    """The native API app for ``broker``.

    Args:
        broker: the broker core, started (or starting: ``/healthz/startup`` says when).
        config: the gateway's settings (``http_max_body_bytes`` bounds request bodies).
        closing: set when the gateway drains (its own event when None).
    """
    app = FastAPI(
        title="tidewire",
        version=__version__,
        description=DESCRIPTION,
        docs_url="/docs",
        openapi_url="/openapi.json",
        redoc_url=None,
    )
    forward = PublishForwarder(broker) if config.http_cluster_routing == "forward" else None
    publisher = Publisher(broker, shared_store(broker), forward=forward)
    ctx = GatewayContext(
        broker, config, closing if closing is not None else asyncio.Event(), publisher
    )
    ctx.on_topic_deleted.append(publisher.store.forget_topic)
    app.state.tidewire = ctx
    configure_metrics(
        broker,
        enabled=config.metrics_enabled,
        max_partition_series=config.metrics_max_partition_series,
        sample_interval_s=config.metrics_sample_interval_s,
    )
    install_error_handlers(app)
    for router in routers(ctx):
        app.include_router(router)
    add_body_schemas(app)
    app.add_middleware(BodyLimit, limit=config.http_max_body_bytes)
    return app


def asgi_app(app: FastAPI) -> ASGIApp:
    """What a listener serves for ``app`` (from :func:`create_app`): the app behind the
    publish fast path (see fastpath.py), which answers single publishes without the
    framework's layers, both under the request id and span of each request (observe.py)."""
    ctx = app.state.tidewire
    assert isinstance(ctx, GatewayContext)
    return RequestObservation(PublishFastPath(app, ctx))
