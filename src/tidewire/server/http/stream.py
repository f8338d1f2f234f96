"""``GET /v1/topics/{topic}/stream``: a topic delivered over a WebSocket or as Server-Sent
Events, read from the log (never from an in-memory fan-out), within the client's credit.

**WebSocket** (the request is an upgrade). Query parameters:

- ``group``: join this consumer group (the broker's coordinator assigns the partitions;
  each starts from the group's committed offset, or per ``from`` when none is committed);
- ``from``: ``earliest``, ``latest`` (default), ``offset:N`` or ``timestamp:MS`` (with a
  group only ``earliest``/``latest``, for partitions without a committed offset);
- ``partitions``: ``0,2,5`` — only these (without a group);
- ``credit`` (messages, default 1,000) and ``credit_bytes`` (default 1 MiB): the first
  grant; ``batch``: up to this many messages per frame, as a JSON array (default 1: one
  message object per frame); ``encoding=base64``: always base64.

The server sends ``{"type": "subscribed", ...}`` (and ``{"type": "assigned", ...}`` after
each group rebalance), then messages (:class:`~._cursor.Message`). The client sends JSON
commands: ``{"type": "credit", "messages": N, "bytes": B}`` and, in a group,
``{"type": "commit"}`` (the positions delivered so far) or ``{"type": "commit", "offsets":
[{"partition": P, "offset": O}]}``, answered with ``{"type": "committed", ...}`` once
fsynced. Credit: a message is sent only while the message credit is at least 1 and its JSON
fits in the byte credit (one message larger than the whole byte window goes alone, once
every byte sent before was given back). Errors are ``{"type": "error", "error": {code,
name, message}}``; bad commands close the socket (close codes in :data:`CLOSE_CODES`).

**Server-Sent Events** (``Accept: text/event-stream``): the same ``from``/``partitions``/
``encoding`` parameters; each message is one ``event: message`` whose ``id`` is a resume token
of every partition's next offset after it, so ``Last-Event-ID`` (or ``?last_event_id=``)
resumes exactly after the last event received. ``: keepalive`` comments while idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.responses import Response, StreamingResponse

from tidewire.broker import Broker
from tidewire.errors import (
    InvalidRequestError,
    OffsetOutOfRangeError,
    TidewireError,
)
from tidewire.server.http._cursor import (
    LogCursor,
    StartAt,
    decode_token,
    encode_token,
    parse_from,
)
from tidewire.server.http._params import (
    encoding_param,
    error_frame,
    int_param,
    partitions_param,
    wait_for_data_or,
)
from tidewire.server.http._ws_session import WsSession
from tidewire.server.http._ws_settings import CLOSE_CODES, WsSettings
from tidewire.server.http.cluster import topic_partition_count
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_response, status_of
from tidewire.server.http.peers import (
    close_cursor,
    make_cursor,
    offset_bounds,
    resolve_start,
    wake_events,
)

__all__ = ["CLOSE_CODES", "HEARTBEAT_S", "stream_router"]

log = logging.getLogger("tidewire.http")

#: Seconds between SSE keepalive comments on an idle stream: below the usual 60 s idle
#: timeout of proxies.
HEARTBEAT_S = 15.0
#: Events written per chunk of the SSE response at most: large chunks for throughput, small
#: enough that a slow client holds at most this many in the gateway's buffers.
SSE_EVENTS_PER_CHUNK = 500


def stream_router(ctx: GatewayContext, *, heartbeat_s: float = HEARTBEAT_S) -> APIRouter:
    """The streaming routes of one gateway.

    Args:
        ctx: the broker, settings and drain signal of the app.
        heartbeat_s: seconds between SSE keepalive comments (the default; a client may ask
            for another period with ``heartbeat_ms``).
    """
    router = APIRouter(tags=["streaming"])
    broker = ctx.broker

    @router.websocket("/v1/topics/{topic}/stream")
    async def stream_ws(websocket: WebSocket, topic: str) -> None:
        await websocket.accept()
        try:
            settings = WsSettings.from_params(websocket.query_params)
            topic_partition_count(broker, topic)  # an unknown topic fails here
        except TidewireError as exc:
            code = "not_found" if status_of(exc) == 404 else "bad_request"
            await websocket.send_json(error_frame(exc))
            await websocket.close(
                CLOSE_CODES[code], exc.message.encode()[:120].decode("utf-8", "ignore")
            )
            return
        await WsSession(broker, websocket, topic, settings, ctx.closing).run()

    @router.get(
        "/v1/topics/{topic}/stream",
        summary="Stream a topic as Server-Sent Events (or, upgraded, over a WebSocket)",
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
            400: {"description": "a bad parameter or resume token"},
            404: {"description": "unknown topic or partition"},
            406: {"description": "neither an SSE request nor a WebSocket upgrade"},
            416: {"description": "a resume position no longer in the log"},
            503: {
                "description": "in a cluster: a partition held by another node whose leader "
                "did not answer (retry)"
            },
        },
    )
    async def stream_sse(
        request: Request,
        topic: str,
        *,
        from_: Annotated[
            str | None,
            Query(
                alias="from",
                description="earliest, latest (default), offset:N or timestamp:MS",
            ),
        ] = None,
        partitions: Annotated[
            str | None, Query(description="only these partitions, e.g. 0,2,5")
        ] = None,
        encoding: Annotated[
            str | None, Query(description="auto (text when UTF-8, default) or base64")
        ] = None,
        heartbeat_ms: Annotated[
            int | None, Query(description="ms between keepalive comments while idle")
        ] = None,
        last_event_id: Annotated[
            str | None,
            Query(description="a resume token, as the Last-Event-ID header (which wins)"),
        ] = None,
    ) -> Response:
        """Each message is an ``event: message`` whose ``id`` is a resume token: reconnect
        with ``Last-Event-ID`` to go on exactly after the last event received."""
        if "text/event-stream" not in request.headers.get("accept", ""):
            exc = InvalidRequestError(
                "this endpoint streams: send 'Accept: text/event-stream' for Server-Sent "
                "Events, or open it as a WebSocket"
            )
            return error_response(exc, 406)
        params = request.query_params
        try:
            heartbeat = int_param(params, "heartbeat_ms", int(heartbeat_s * 1000), 10, 300_000)
            cursor = await _sse_cursor(broker, topic, request)
        except TidewireError as exc:
            return error_response(exc)
        return StreamingResponse(
            _sse_events(broker, cursor, heartbeat / 1000, ctx.closing),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return router


async def _sse_cursor(broker: Broker, topic: str, request: Request) -> LogCursor:
    """The cursor of an SSE stream at the positions its request asks for (in a cluster,
    those of partitions without a replica here asked of their leaders)."""
    params = request.query_params
    force = encoding_param(params)
    parts = partitions_param(broker, topic, params.get("partitions"))
    token = request.headers.get("last-event-id") or params.get("last_event_id")
    saved = decode_token(token, topic) if token else None
    start_at = parse_from(params.get("from"))
    cursor = make_cursor(broker, topic, force_base64=force)
    try:
        positions: dict[int, int] = {}
        for p in parts:
            if saved is None:
                positions[p] = await resolve_start(cursor, start_at, p)
                continue
            if p not in saved:  # a partition added since the token: from its start
                positions[p] = await resolve_start(cursor, StartAt("earliest"), p)
                continue
            start, end = await offset_bounds(cursor, p)
            if not start <= saved[p] <= end:
                raise OffsetOutOfRangeError(
                    f"the resume token's offset {saved[p]} of partition {p} is outside the "
                    f"log's {start}..{end}"
                )
            positions[p] = saved[p]
    except BaseException:
        await close_cursor(cursor)
        raise
    cursor.assign(positions)
    return cursor


async def _sse_events(
    broker: Broker, cursor: LogCursor, heartbeat_s: float, closing: asyncio.Event
) -> AsyncIterator[bytes]:
    """The event stream: messages with resume tokens; keepalives while idle; an
    ``event: error`` and the end when a partition can no longer be read; the end when the
    gateway drains (the client reconnects elsewhere with its last id)."""
    try:
        async for chunk in _sse_chunks(broker, cursor, heartbeat_s, closing):
            yield chunk
    finally:
        await close_cursor(cursor)


async def _sse_chunks(
    broker: Broker, cursor: LogCursor, heartbeat_s: float, closing: asyncio.Event
) -> AsyncIterator[bytes]:
    topic = cursor.topic
    yield b"retry: 1000\n: connected\n\n"
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    rotate = 0
    while not closing.is_set():
        chunk: list[bytes] = []
        parts = list(cursor.parts.values())
        rotate = (rotate + 1) % max(len(parts), 1)  # no partition starves the others
        try:
            for part in parts[rotate:] + parts[:rotate]:
                while len(chunk) < SSE_EVENTS_PER_CHUNK:
                    head = cursor.peek(part)
                    if head is None:
                        break
                    cursor.advance(part)
                    token = encode_token(topic, cursor.positions()).encode()
                    chunk.append(b"id: %s\nevent: message\ndata: %s\n\n" % (token, head[1]))
        except TidewireError as exc:
            chunk.append(b"event: error\ndata: %s\n\n" % msgspec.json.encode(error_frame(exc)))
            yield b"".join(chunk)
            return
        if chunk:
            yield b"".join(chunk)
            last_sent = loop.time()
            continue
        wait = heartbeat_s - (loop.time() - last_sent)
        if wait <= 0:
            yield b": keepalive\n\n"
            last_sent = loop.time()
            continue
        await wait_for_data_or(broker, cursor.waiting_keys(), wait, closing, *wake_events(cursor))
