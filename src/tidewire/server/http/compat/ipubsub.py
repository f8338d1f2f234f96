"""Compatibility mode: the HTTP API of iPubSub, on its own port (``http_ipubsub_port``).

``POST /api/v1/streams/send`` with ``{streamId, messageUuid, message, inMemoryStreamSize,
blockingSendTimeoutSeconds, writeToDB, dbTTLSeconds}`` and ``GET /api/v1/streams/receive?
streamId=&timeoutSeconds=&readFromDB=&dbResumeToken=``, with the semantics iPubSub's design
documents, on tidewire's lightweight streams (``broker.streams``, docs/streams.md): an
iPubSub stream is the tidewire stream of the same id (ACLs by stream id), so native clients
and the ``/v1/streams`` routes reach the same messages.

- a send is ``SendItem(streamId, the message's JSON, messageUuid, dbTTLSeconds * 1000,
  persistent=writeToDB)``: a ``writeToDB`` message is written durably and can be replayed, the
  others are kept in memory only; ``messageUuid`` deduplicates (a send whose uuid is among the
  stream's recent ones answers ``200`` and stores nothing); ``dbTTLSeconds`` (default 86,400)
  is each message's own expiry: an expired message is never answered;
- ``inMemoryStreamSize`` (default 100, fixed by the first request of the stream) bounds the
  messages waiting to be received: a send without ``blockingSendTimeoutSeconds`` pushes the
  oldest waiting one out beyond it (circular buffer); with it, the send waits up to that long
  for room (size plus the receivers waiting now, so size 0 is a synchronous hand-over) and
  answers ``424`` if none came;
- a receive (long-poll, ``timeoutSeconds`` default 30; ``424`` when nothing came) takes the
  oldest waiting message once (work-queue): a ``writeToDB`` message's take is recorded durably
  before the answer, so it is received once across restarts too;
- in a cluster any node answers: a stream owned by another node (the leader of its
  partition of ``__streams``) is forwarded there, as iPubSub's nodes forward to the owning
  node (:mod:`tidewire.server.http.streams_owner`);
- ``readFromDB=true`` reads (without taking) the first ``writeToDB`` message at or after
  ``dbResumeToken`` (empty: the stream's oldest) and answers it with the ``dbResumeToken`` of
  the position after it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidewire.broker import Broker
from tidewire.broker.streams.model import FROM_START, SendItem, StreamMessage
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    InvalidRequestError,
    InvalidStreamError,
    LogFailedError,
    ShuttingDownError,
    StorageError,
    StreamFullError,
    TidewireError,
    for_code,
)
from tidewire.server.http import streams_owner
from tidewire.server.http.compat import rfc3339
from tidewire.server.http.streams import take_unless_gone

__all__ = ["DEFAULT_STREAM_SIZE", "create_ipubsub_app"]

#: iPubSub's defaults and bounds.
DEFAULT_TIMEOUT_S = 30
MAX_TIMEOUT_S = 3_600
DEFAULT_STREAM_SIZE = 100
DEFAULT_TTL_S = 24 * 3600
MAX_ID_CHARS = 255

_TIMEOUT = {"error": "long poll waiting timeout"}
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder()


class _BadRequest(Exception):
    pass


class _TooLarge(Exception):
    pass


def _json(status: int, body: Any) -> Response:
    return Response(_encode(body), status_code=status, media_type="application/json")


def _opt_int(body: dict[str, Any], name: str, default: int, low: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _BadRequest(f"{name} must be an integer >= {low}, not {value!r}")
    return value


def _id(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise _BadRequest(
            f"invalid request schema: {name} must be a string of 1..{MAX_ID_CHARS} characters"
        )
    return value


def create_ipubsub_app(
    broker: Broker, *, max_body_bytes: int, closing: asyncio.Event | None = None
) -> Starlette:
    """The iPubSub-compatible app.

    Args:
        broker: the running broker (its stream manager stores and times the messages).
        max_body_bytes: the largest send request accepted (``413`` beyond it).
        closing: set when the gateway drains (long-polls answer at once).
    """
    stop = closing if closing is not None else asyncio.Event()
    wait_step = broker.config.stream_max_wait_ms

    async def read_body(request: Request) -> dict[str, Any]:
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body_bytes:
                raise _TooLarge(f"the request body exceeds {max_body_bytes:,} bytes")
        try:
            body = _decode.decode(raw)
        except msgspec.DecodeError as exc:
            raise _BadRequest(f"invalid request schema: the body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise _BadRequest("invalid request schema: the body must be a JSON object")
        return body

    async def send(request: Request) -> Response:
        try:
            body = await read_body(request)
            stream_id, uuid = _id(body, "streamId"), _id(body, "messageUuid")
            if "message" not in body:
                raise _BadRequest("invalid request schema: message is required")
            size = _opt_int(body, "inMemoryStreamSize", DEFAULT_STREAM_SIZE, 0)
            blocking = _opt_int(body, "blockingSendTimeoutSeconds", 0, 0)
            ttl = _opt_int(body, "dbTTLSeconds", DEFAULT_TTL_S, 1)
            to_db = body.get("writeToDB", False)
            if not isinstance(to_db, bool):
                raise _BadRequest("invalid request schema: writeToDB must be a boolean")
        except _BadRequest as exc:
            return _json(400, {"error": str(exc)})
        except _TooLarge as exc:
            return _json(413, {"error": str(exc)})
        item = SendItem(stream_id, _encode(body["message"]), uuid, ttl * 1000, to_db)
        try:
            (result,) = await streams_owner.send(
                broker, [item], ring_size=size, block_ms=blocking * 1000
            )
        except TidewireError as exc:
            return _server_error(exc)
        if result.code in (0, -1):  # stored, or sent before (stored once)
            return _json(200, {})
        if result.code == StreamFullError.code:
            return _json(424, {"error": "stream is full: blocking send timeout"})
        error = for_code(result.code)(result.message)
        if isinstance(error, InvalidStreamError):
            return _json(400, {"error": error.message})
        return _server_error(error)

    async def receive(request: Request) -> Response:
        q = request.query_params
        stream_id = q.get("streamId", "")
        if not stream_id:
            return _json(400, {"error": "streamId is required"})
        text = q.get("timeoutSeconds", "")
        if text == "":
            timeout = DEFAULT_TIMEOUT_S
        elif text.isascii() and text.isdigit() and int(text) <= MAX_TIMEOUT_S:
            timeout = int(text)
        else:
            return _json(400, {"error": f"invalid timeoutSeconds: 0..{MAX_TIMEOUT_S}"})
        from_db = q.get("readFromDB", "false").lower()
        if from_db not in ("true", "false", ""):
            return _json(400, {"error": "invalid readFromDB: true or false"})
        try:
            if from_db == "true":
                token = q.get("dbResumeToken", "") or FROM_START
                message = await replay(stream_id, token, timeout * 1000)
            else:
                message = await take(request, stream_id, timeout * 1000)
        except (InvalidStreamError, InvalidRequestError) as exc:
            return _json(400, {"error": exc.message})
        except TidewireError as exc:
            return _server_error(exc)
        if message is None:
            return _json(424, _TIMEOUT)
        return _json(200, _answer(message))

    async def take(request: Request, stream_id: str, timeout_ms: int) -> StreamMessage | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            left = 0 if stop.is_set() else max(0, int((deadline - loop.time()) * 1000))
            taking = streams_owner.receive(broker, [stream_id], wait_ms=min(left, wait_step))
            # A client gone while it waits takes nothing.
            got = await (take_unless_gone(request.receive, taking) if left else taking)
            if got:
                return got[0]
            if left <= wait_step or stop.is_set():
                return None

    async def replay(stream_id: str, token: str, timeout_ms: int) -> StreamMessage | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            left = 0 if stop.is_set() else max(0, int((deadline - loop.time()) * 1000))
            got, tokens = await streams_owner.read(
                broker, {stream_id: token}, max_messages=1, wait_ms=min(left, wait_step)
            )
            if got:
                return got[0]
            if left <= wait_step or stop.is_set():
                return None
            token = tokens.get(stream_id, token)

    routes = [
        Route("/api/v1/streams/send", send, methods=["POST"]),
        Route("/api/v1/streams/receive", receive, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _answer(m: StreamMessage) -> dict[str, Any]:
    try:
        message = _decode.decode(m.value) if m.value else None
    except msgspec.DecodeError:  # sent natively, not as JSON: handed over as text
        message = m.value.decode("utf-8", "replace")
    out: dict[str, Any] = {
        "messageUuid": m.uuid,
        "message": message,
        "timestamp": rfc3339(m.timestamp_ms),
    }
    if m.token:  # written to the DB: replayable from the position after it
        out["dbResumeToken"] = m.token
    return out


def _server_error(exc: TidewireError) -> Response:
    unavailable = (StorageError, LogFailedError, BackpressureError, ShuttingDownError)
    status = 503 if isinstance(exc, unavailable) else 500
    if isinstance(exc, BatchTooLargeError):  # over stream_max_message_bytes
        status = 413
    return _json(status, {"error": exc.message})
