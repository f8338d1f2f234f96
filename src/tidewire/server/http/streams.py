"""``/v1/streams``: lightweight streams over HTTP (the broker core's StreamManager, as the
binary protocol's APIs 58-62 reach it): send, work-queue receive (long-poll, one stream or
many), fan-out read by resume token (long-poll, or Server-Sent Events), list, describe and
the broker-wide counts.

**Stream ids in paths.** A stream id may hold any character but NUL, ``/`` included. In a
path it is percent-encoded (``%2F`` for ``/``, ``%25`` for ``%``, ``%3F`` for ``?``...); the
path parameter spans slashes, and the route is chosen by the path's end (``/messages``,
``/read``, ``/sse``), so ``GET /v1/streams/a/b/messages`` receives from the stream ``a/b``.
Two kinds of ids cannot be named in a path: one whose segments are ``.`` or ``..`` (HTTP
clients resolve them away) and, for describe only, one that ends with ``/messages``,
``/read`` or ``/sse`` (the route of that suffix answers). The body routes take any id:
``POST /v1/streams/messages`` (send), ``POST /v1/streams/receive``, ``POST /v1/streams/read``
and ``GET /v1/streams?prefix=`` (describe).

Long-polls await the manager (no timer or polling of their own); a waiting work-queue receive
also watches its connection, so a client that goes away takes nothing (one task for the
receive and one for the watch, only while it waits). When the gateway drains they answer at
once with what they have.

**In a cluster** any node answers every route of one stream, of several, and SSE: what the
stream's owner (the leader of its partition of ``__streams``) serves is forwarded to it
(:mod:`tidewire.server.http.streams_owner`). The list and the counts are the answering
node's: the streams it owns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.responses import Response
from starlette.types import Receive

from tidewire._tasks import cancel_and_wait
from tidewire.broker.streams.model import (
    FROM_END,
    FROM_START,
    MAX_STREAM_ID_CHARS,
    StreamMessage,
    check_stream_id,
    decode_token,
)
from tidewire.errors import InvalidRequestError, InvalidStreamError, TidewireError, for_code
from tidewire.security.model import ResourceType
from tidewire.server.gate import gate_for, names_allowed
from tidewire.server.http import streams_owner
from tidewire.server.http._common import json_response, parse_body, request_body
from tidewire.server.http._params import error_frame, int_param
from tidewire.server.http._stream_docs import (
    info_doc,
    message_doc,
    result_doc,
    send_item,
    stats_doc,
)
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_response
from tidewire.server.http.models import ErrorBody
from tidewire.server.http.stream import HEARTBEAT_S
from tidewire.server.http.streams_models import (
    MAX_RECEIVE_MESSAGES,
    ReadRequest,
    ReadResult,
    ReceiveRequest,
    ReceiveResult,
    StreamDescription,
    StreamList,
    StreamSendBatchRequest,
    StreamSendBatchResult,
    StreamSendRequest,
    StreamSendResult,
    StreamStatsDoc,
    StreamTokenResult,
)

__all__ = ["SSE_MESSAGES_PER_READ", "stream_responses", "streams_router", "take_unless_gone"]

#: Messages one SSE read takes from the manager at most (written as one chunk): large for
#: throughput, small enough that a slow client holds at most this many in the buffers.
SSE_MESSAGES_PER_READ = 500
#: The most streams one list page shows.
MAX_LIST = 1000

_WHAT = {
    400: "A malformed request, or a stream id, resume token, TTL or wait that is not "
    "allowed (InvalidStreamError, code 120, naming which and why).",
    404: "No such stream now (it holds no message and nobody waits on it).",
    406: "Not an SSE request (send Accept: text/event-stream).",
    413: "The body exceeds http_max_body_bytes, or the message stream_max_message_bytes.",
    429: "A blocking send whose stream stayed full for block_ms (StreamFullError, code 121): "
    "nothing was stored; retry after Retry-After.",
    503: "The broker is busy (too many streams or waiting receivers) or its storage refused; "
    "retry after Retry-After.",
}


def stream_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the error answers of a stream route (400 and 503 always)."""
    return {s: {"model": ErrorBody, "description": _WHAT[s]} for s in sorted({400, 503, *statuses})}


StreamPath = Annotated[
    str,
    Path(
        description="The stream id, percent-encoded (any character; '/' as %2F or as is: "
        "the route is chosen by the path's end).",
    ),
]
WaitQuery = Annotated[
    int,
    Query(ge=0, le=2**63 - 1, description="ms to wait for a first message (long-poll)."),
]
EncodingQuery = Annotated[
    Literal["auto", "base64"],
    Query(description="auto: values as UTF-8 text when they are; base64: always base64."),
]
RingQuery = Annotated[
    int | None,
    Query(
        ge=0,
        le=1_000_000,
        description="Messages kept waiting for a receiver, fixed by the request that "
        "creates the stream (absent: the broker's stream_ring_size).",
    ),
]
TokenQuery = Annotated[
    str,
    Query(
        max_length=256,
        description='Where to read from: "" (absent) the oldest retained persistent '
        'message, "$" only what is sent after the read began, or a token of an earlier '
        "answer (a message's token, or the answer's token).",
    ),
]


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def take_unless_gone(
    receive: Receive, taking: Coroutine[Any, Any, list[StreamMessage]]
) -> list[StreamMessage]:
    """The messages of a waiting work-queue receive (``taking``), unless the client
    disconnects first: then the receive is cancelled, which takes nothing if it took nothing
    yet (a message sent meanwhile stays for another receiver; one it had taken, its take
    recorded, stays taken), and the answer is empty (nobody reads it).

    ``receive``: the request's ASGI channel, its body read already."""
    take = asyncio.ensure_future(taking)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((take, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(gone)
        if not take.done():
            await cancel_and_wait(take)
    return [] if take.cancelled() else take.result()


def _stream(stream: str) -> str:
    try:
        return check_stream_id(stream)
    except InvalidStreamError as exc:
        raise InvalidStreamError(f"path: {exc.message}") from None


def _check_token(stream: str, token: str) -> None:
    if token not in (FROM_START, FROM_END):
        decode_token(stream, token)


def streams_router(ctx: GatewayContext, *, heartbeat_s: float = HEARTBEAT_S) -> APIRouter:
    """The routes of ``/v1/streams``.

    Args:
        ctx: the broker, settings and drain signal of the app.
        heartbeat_s: seconds between SSE keepalive comments (a client may ask for another
            period with ``heartbeat_ms``).
    """
    router = APIRouter(tags=["streams"])
    broker = ctx.broker
    closing = ctx.closing

    def docs(messages: list[StreamMessage], encoding: str) -> list[dict[str, Any]]:
        force = encoding == "base64"
        return [message_doc(m, force) for m in messages]

    def waiting(wait_ms: int) -> int:
        return 0 if closing.is_set() else wait_ms

    # --- routes without a stream in the path (any id) -------------------------------------------

    @router.get("/v1/streams", response_model=StreamList, responses=stream_responses())
    async def list_streams(
        prefix: Annotated[
            str, Query(max_length=MAX_STREAM_ID_CHARS, description="Only ids starting so.")
        ] = "",
        after: Annotated[
            str,
            Query(max_length=MAX_STREAM_ID_CHARS, description="Only ids after this one."),
        ] = "",
        limit: Annotated[int, Query(ge=1, le=MAX_LIST, description="Streams at most.")] = MAX_LIST,
    ) -> Response:
        """The streams that exist now (ids sorted, after ``after``, starting with
        ``prefix``) that the caller may describe, with their figures. Page on with
        ``after=next_after`` until it is null."""
        infos = broker.streams.list(prefix=prefix, after=after, limit=limit)
        by_id = {i.stream: i for i in infos}
        shown = names_allowed(gate_for(broker), ResourceType.STREAM, by_id)
        return json_response(
            {
                "streams": [info_doc(by_id[s]) for s in shown],
                "next_after": infos[-1].stream if len(infos) == limit else None,
            }
        )

    @router.get("/v1/stats/streams", response_model=StreamStatsDoc, responses=stream_responses())
    async def stream_stats() -> Response:
        """Counts over every stream of the broker (as the tidewire_stream* metrics)."""
        manager = broker.streams
        return json_response({**stats_doc(manager.stats()), "partitions": manager.partitions})

    @router.post(
        "/v1/streams/messages",
        response_model=StreamSendBatchResult,
        responses=stream_responses(413),
        openapi_extra={"requestBody": request_body(StreamSendBatchRequest)},
    )
    async def send_batch(request: Request) -> Response:
        """Send messages to any streams (each item names its stream). Every item gets a
        result, in order: ``stored`` (with a persistent message's token), ``duplicate``
        (its uuid was sent before: nothing stored) or ``error`` (nothing stored for it);
        persistent messages are durable per the broker's fsync policy before the answer."""
        req = parse_body(StreamSendBatchRequest, await request.body())
        items = [send_item(m.stream, m, f"items.{i}.") for i, m in enumerate(req.items)]
        results = await streams_owner.send(
            broker, items, ring_size=req.ring_size, block_ms=req.block_ms
        )
        return json_response({"results": [result_doc(r) for r in results]})

    @router.post(
        "/v1/streams/receive",
        response_model=ReceiveResult,
        responses=stream_responses(),
        openapi_extra={"requestBody": request_body(ReceiveRequest)},
    )
    async def receive_many(request: Request) -> Response:
        """Take up to ``max`` messages from any of ``streams`` (work-queue: each message is
        taken by one receiver), waiting up to ``wait_ms`` for a first one: the answer comes
        as soon as any of them has a message; none: an empty list."""
        req = parse_body(ReceiveRequest, await request.body())
        wait_ms = waiting(req.wait_ms)
        taking = streams_owner.receive(
            broker, req.streams, max_messages=req.max, wait_ms=wait_ms, ring_size=req.ring_size
        )
        messages = await (take_unless_gone(request.receive, taking) if wait_ms else taking)
        return json_response({"messages": docs(messages, req.encoding)})

    @router.post(
        "/v1/streams/read",
        response_model=ReadResult,
        responses=stream_responses(),
        openapi_extra={"requestBody": request_body(ReadRequest)},
    )
    async def read_many(request: Request) -> Response:
        """Read (without taking) the persistent messages of several streams, each from its
        token, waiting up to ``wait_ms`` for a first one; ``tokens`` gives every stream's
        token to read on from (also for a stream that had nothing)."""
        req = parse_body(ReadRequest, await request.body())
        messages, tokens = await streams_owner.read(
            broker, req.positions, max_messages=req.max, wait_ms=waiting(req.wait_ms)
        )
        return json_response({"messages": docs(messages, req.encoding), "tokens": tokens})

    # --- routes of one stream, named in the path (longest suffixes first) ------------------------

    @router.post(
        "/v1/streams/{stream:path}/messages",
        response_model=StreamSendResult,
        responses=stream_responses(413, 429),
        openapi_extra={"requestBody": request_body(StreamSendRequest)},
    )
    async def send_one(request: Request, stream: StreamPath) -> Response:
        """Send one message to the stream (created by it if new). A duplicate answers 200
        with status ``duplicate``; a refused message answers its error's status."""
        stream = _stream(stream)
        req = parse_body(StreamSendRequest, await request.body())
        item = send_item(stream, req, "")
        (result,) = await streams_owner.send(
            broker, [item], ring_size=req.ring_size, block_ms=req.block_ms
        )
        doc = result_doc(result)
        if doc["status"] == "error":
            return error_response(for_code(result.code)(result.message))
        return json_response(doc)

    @router.get(
        "/v1/streams/{stream:path}/messages",
        response_model=ReceiveResult,
        responses=stream_responses(),
    )
    async def receive_one(
        request: Request,
        stream: StreamPath,
        *,
        wait_ms: WaitQuery = 0,
        max: Annotated[
            int, Query(ge=1, le=MAX_RECEIVE_MESSAGES, description="Messages at most.")
        ] = 1,
        ring_size: RingQuery = None,
        encoding: EncodingQuery = "auto",
    ) -> Response:
        """Take up to ``max`` messages of the stream (work-queue: each message is taken by
        one receiver, in send order), waiting up to ``wait_ms`` for a first one; none came:
        200 with an empty list."""
        wait_ms = waiting(wait_ms)
        taking = streams_owner.receive(
            broker, [_stream(stream)], max_messages=max, wait_ms=wait_ms, ring_size=ring_size
        )
        messages = await (take_unless_gone(request.receive, taking) if wait_ms else taking)
        return json_response({"messages": docs(messages, encoding)})

    @router.get(
        "/v1/streams/{stream:path}/read",
        response_model=StreamTokenResult,
        responses=stream_responses(),
    )
    async def read_one(
        stream: StreamPath,
        token: TokenQuery = FROM_START,
        wait_ms: WaitQuery = 0,
        max: Annotated[
            int, Query(ge=1, le=MAX_RECEIVE_MESSAGES, description="Messages at most.")
        ] = 100,
        encoding: EncodingQuery = "auto",
    ) -> Response:
        """Read (without taking) the stream's persistent messages from ``token``, waiting
        up to ``wait_ms`` for a first one; ``token`` in the answer is where to read on
        (the same position when nothing came). Every reader reads every message."""
        stream = _stream(stream)
        messages, tokens = await streams_owner.read(
            broker, {stream: token}, max_messages=max, wait_ms=waiting(wait_ms)
        )
        return json_response({"messages": docs(messages, encoding), "token": tokens[stream]})

    @router.get(
        "/v1/streams/{stream:path}/sse",
        summary="A stream's persistent messages as Server-Sent Events",
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
            **stream_responses(406),
        },
    )
    async def read_sse(
        request: Request,
        stream: StreamPath,
        token: TokenQuery = FROM_START,
        encoding: EncodingQuery = "auto",
        heartbeat_ms: Annotated[
            int | None, Query(description="ms between keepalive comments while idle")
        ] = None,
    ) -> Response:
        """Each persistent message is an ``event: message`` whose ``data`` is the message
        document and whose ``id`` is its token: reconnect with ``Last-Event-ID`` (which
        wins over ``token``) to go on exactly after the last event received, missing and
        repeating nothing. ``: keepalive`` comments while idle."""
        if "text/event-stream" not in request.headers.get("accept", ""):
            exc = InvalidRequestError(
                "this endpoint streams: send 'Accept: text/event-stream' for Server-Sent Events"
            )
            return error_response(exc, 406)
        try:
            stream = _stream(stream)
            start = request.headers.get("last-event-id") or token
            _check_token(stream, start)
            default = int(heartbeat_s * 1000)
            every = int_param(request.query_params, "heartbeat_ms", default, 10, 300_000)
        except TidewireError as exc:
            return error_response(exc)
        del heartbeat_ms  # read by int_param (its bounds named in its error)
        return StreamingResponse(
            _sse_events(ctx, stream, start, encoding == "base64", every),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.get(
        "/v1/streams/{stream:path}",
        response_model=StreamDescription,
        responses=stream_responses(404),
    )
    async def describe(stream: StreamPath) -> Response:
        """The stream's figures now; 404 when it does not exist (it holds no message and
        nobody waits on it)."""
        info = await streams_owner.describe(broker, _stream(stream))
        if info is None:
            return error_response(
                InvalidStreamError(
                    f"stream {stream[:200]!r} does not exist now (it holds no message and "
                    "nobody waits on it)"
                ),
                404,
            )
        return json_response(info_doc(info))

    return router


async def _sse_events(
    ctx: GatewayContext, stream: str, token: str, force_base64: bool, heartbeat_ms: int
) -> AsyncIterator[bytes]:
    """The event stream: each read's messages as one chunk, a keepalive comment after each
    idle heartbeat; ends when the gateway drains (the client reconnects with its last id),
    or with an ``event: error`` when reading fails."""
    encode = msgspec.json.encode
    broker = ctx.broker
    yield b"retry: 1000\n: connected\n\n"
    while not ctx.closing.is_set():
        try:
            messages, tokens = await streams_owner.read(
                broker, {stream: token}, max_messages=SSE_MESSAGES_PER_READ, wait_ms=heartbeat_ms
            )
        except TidewireError as exc:
            yield b"event: error\ndata: %s\n\n" % encode(error_frame(exc))
            return
        token = tokens.get(stream, token)
        if not messages:
            yield b": keepalive\n\n"
            continue
        yield b"".join(
            b"id: %s\nevent: message\ndata: %s\n\n"
            % (m.token.encode(), encode(message_doc(m, force_base64)))
            for m in messages
        )
