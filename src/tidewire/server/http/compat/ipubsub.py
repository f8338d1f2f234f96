"""Compatibility mode: the HTTP API of iPubSub, on its own port (``http_ipubsub_port``).

``POST /api/v1/streams/send`` with ``{streamId, messageUuid, message, inMemoryStreamSize,
blockingSendTimeoutSeconds, writeToDB, dbTTLSeconds}`` and ``GET /api/v1/streams/receive?
streamId=&timeoutSeconds=&readFromDB=&dbResumeToken=``, with the semantics iPubSub's design
documents, mapped onto the log:

- a stream is the tidewire topic ``ipubsub.STREAM`` (escaped by
  :func:`~tidewire.server.http.compat.topic_for`) of one partition, created by the first send
  or receive that names it; a message is one record (key: ``messageUuid``; value: the
  ``message`` JSON; headers: whether it was written "to the DB" and when it expires);
- a receive (long-poll, ``timeoutSeconds`` default 30; ``424`` when nothing came) takes the
  next message once: the consumer group ``ipubsub`` commits the offset after it before the
  answer (:class:`~._pop.Popper`), so each message is received once, across restarts too;
- ``inMemoryStreamSize`` (default 100, fixed by the first request of the stream in this
  process) bounds the messages waiting to be received: a send without
  ``blockingSendTimeoutSeconds`` drops the oldest waiting ones beyond it (circular buffer);
  with it, the send waits up to that long for room (size plus the receivers waiting now, so
  size 0 is a synchronous hand-over) and answers ``424`` if none came;
- ``messageUuid`` deduplicates: a send whose uuid is among the stream's last
  :data:`DEDUP_WINDOW` messages answers ``200`` and stores nothing;
- ``writeToDB`` messages can also be replayed: ``readFromDB=true`` reads (without taking)
  the first such message at or after ``dbResumeToken`` (empty: the stream's start) and
  answers it with the ``dbResumeToken`` of the next one; ``dbTTLSeconds`` (default 86,400) is
  each message's own expiry: an expired message is never answered, and the topic's retention
  is raised to the longest TTL sent so its bytes stay until then and are removed after.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidewire.broker import Broker
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    InvalidRequestError,
    LogFailedError,
    StorageError,
    TidewireError,
)
from tidewire.records import BatchBuilder
from tidewire.server.http._cursor import Record, decode_records, decode_token, encode_token
from tidewire.server.http._params import wait_for_data_or
from tidewire.server.http.compat import ensure_topic, rfc3339, topic_for
from tidewire.server.http.compat._pop import Popper

__all__ = ["DEDUP_WINDOW", "GROUP", "PREFIX", "create_ipubsub_app"]

#: Prefix of the tidewire topics of iPubSub streams.
PREFIX = "ipubsub."
#: The consumer group whose committed offsets mark received messages.
GROUP = "ipubsub"
#: A resent ``messageUuid`` is recognised among this many latest messages of its stream.
DEDUP_WINDOW = 1_000
#: Streams whose state (buffer size, recent uuids) is kept in memory at most; an idle one
#: beyond it is forgotten and rebuilt from its log when next used.
MAX_STREAMS = 10_000
#: iPubSub's defaults and bounds.
DEFAULT_TIMEOUT_S = 30
MAX_TIMEOUT_S = 3_600
DEFAULT_STREAM_SIZE = 100
DEFAULT_TTL_S = 24 * 3600
MAX_ID_CHARS = 255

_H_DB = "ipubsub-db"
_H_EXPIRES = "ipubsub-expires"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder()


@dataclass(slots=True)
class _Stream:
    size: int
    seen: set[str] = field(default_factory=set)
    order: deque[str] = field(default_factory=deque)
    receivers: int = 0
    senders: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def remember(self, uuid: str) -> None:
        self.seen.add(uuid)
        self.order.append(uuid)
        while len(self.order) > DEDUP_WINDOW:
            self.seen.discard(self.order.popleft())


class _BadRequest(Exception):
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


def _now_ms() -> int:
    return int(time.time() * 1000)


def _id(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise _BadRequest(
            f"invalid request schema: {name} must be a string of 1..{MAX_ID_CHARS} characters"
        )
    return value


def create_ipubsub_app(
    broker: Broker,
    *,
    max_body_bytes: int,
    closing: asyncio.Event | None = None,
    clock: Callable[[], int] = _now_ms,
) -> Starlette:
    """The iPubSub-compatible app.

    Args:
        broker: the running broker.
        max_body_bytes: the largest send request accepted (``413`` beyond it).
        closing: set when the gateway drains (long-polls answer at once).
        clock: ms since the epoch: message timestamps and expiry.
    """
    stop = closing if closing is not None else asyncio.Event()
    popper = Popper(broker, GROUP, stop)
    streams: OrderedDict[str, _Stream] = OrderedDict()

    def stream_of(topic: str, size: int) -> _Stream:
        st = streams.get(topic)
        if st is not None:
            streams.move_to_end(topic)
            return st
        st = streams[topic] = _Stream(size)
        end = broker.high_watermark(topic, 0)
        pos = max(broker.list_offset(topic, 0, -2), end - DEDUP_WINDOW)
        while pos < end:  # the latest uuids, from the log
            r = broker.read_partition(topic, 0, pos, 1 << 20)
            for rec in decode_records(topic, 0, r.data, pos):
                if rec.key is not None:
                    st.remember(rec.key.decode("utf-8", "replace"))
            pos = r.next_offset
        for name in [t for t, s in streams.items() if not s.receivers and not s.senders]:
            if len(streams) <= MAX_STREAMS:
                break
            del streams[name]
        return st

    def on_taken(topic: str) -> None:
        st = streams.get(topic)
        if st is not None:
            st.changed.set()

    popper.on_taken = on_taken

    def backlog(topic: str) -> int:
        return broker.high_watermark(topic, 0) - popper.position(topic)

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
            topic = topic_for(PREFIX, stream_id)
        except _BadRequest as exc:
            return _json(400, {"error": str(exc)})
        except _TooLarge as exc:
            return _json(413, {"error": str(exc)})
        except TidewireError as exc:
            return _json(400, {"error": exc.message})

        def record(now: int) -> bytes:
            batch = BatchBuilder()
            batch.append(
                _encode(body["message"]),
                key=uuid.encode(),
                timestamp_ms=now,
                headers=[
                    (_H_DB, b"1" if to_db else b"0"),
                    (_H_EXPIRES, str(now + ttl * 1000).encode()),
                ],
            )
            return batch.build()

        try:
            data = record(clock())
            ensure_topic(broker, topic, data)  # a message refused creates no stream
            st = stream_of(topic, size)
            if uuid in st.seen:
                return _json(200, {})  # sent before: stored once
            if blocking > 0:
                if not await wait_for_room(topic, st, blocking):
                    return _json(424, {"error": "stream is full: blocking send timeout"})
                if uuid in st.seen:  # the same uuid sent again while this one waited
                    return _json(200, {})
                data = record(clock())  # its time is when it is stored, not when it came
            await broker.produce(topic, 0, data)
            st.remember(uuid)
            if to_db:
                keep_for(topic, ttl * 1000)
            if blocking <= 0:
                await drop_oldest(topic, st)
        except TidewireError as exc:
            return _server_error(exc)
        return _json(200, {})

    async def wait_for_room(topic: str, st: _Stream, timeout_s: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        st.senders += 1
        try:
            while backlog(topic) >= st.size + st.receivers:
                left = deadline - loop.time()
                if left <= 0 or stop.is_set():
                    return False
                st.changed.clear()
                try:
                    await asyncio.wait_for(st.changed.wait(), left)
                except TimeoutError:
                    return False
            return True
        finally:
            st.senders -= 1

    async def drop_oldest(topic: str, st: _Stream) -> None:
        """Circular buffer: keep at most ``size`` messages waiting (plus one per receiver
        waiting now, which takes it at once)."""
        async with popper.exclusive(topic):
            excess = backlog(topic) - (st.size + st.receivers)
            if excess > 0:
                await popper.commit(topic, popper.position(topic) + excess)

    def keep_for(topic: str, ttl_ms: int) -> None:
        cfg = broker.log(topic, 0).config
        if 0 <= cfg.retention_ms < ttl_ms:
            broker.alter_topic(topic, config=replace(cfg, retention_ms=ttl_ms))

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
            topic = topic_for(PREFIX, stream_id)
            ensure_topic(broker, topic)
            if from_db == "true":
                return await replay(topic, q.get("dbResumeToken", ""), timeout)
            st = stream_of(topic, DEFAULT_STREAM_SIZE)
            st.receivers += 1
            st.changed.set()  # a blocked sender may hand its message over now
            try:
                rec = await popper.pop(topic, timeout, _alive_at(clock()))
            finally:
                st.receivers -= 1
        except InvalidRequestError as exc:
            return _json(400, {"error": exc.message})
        except TidewireError as exc:
            return _server_error(exc)
        if rec is None:
            return _json(424, {"error": "long poll waiting timeout"})
        return _json(200, _answer(rec, with_token=_header(rec, _H_DB) == b"1"))

    async def replay(topic: str, token: str, timeout_s: int) -> Response:
        pos = decode_token(token, topic).get(0, 0) if token else 0
        start = broker.list_offset(topic, 0, -2)
        pos = max(pos, start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            r = broker.read_partition(topic, 0, pos, 1 << 20)
            for rec in decode_records(topic, 0, r.data, pos) if r.data else []:
                if _header(rec, _H_DB) == b"1" and _alive_at(clock())(rec):
                    return _json(200, _answer(rec, with_token=True))
            if r.data:
                pos = r.next_offset
                continue
            left = deadline - loop.time()
            if left <= 0 or stop.is_set():
                return _json(424, {"error": "long poll waiting timeout"})
            await wait_for_data_or(broker, [(topic, 0)], left, stop)

    routes = [
        Route("/api/v1/streams/send", send, methods=["POST"]),
        Route("/api/v1/streams/receive", receive, methods=["GET"]),
    ]
    return Starlette(routes=routes)


class _TooLarge(Exception):
    pass


def _header(rec: Record, name: str) -> bytes | None:
    for key, value in rec.headers:
        if key == name:
            return value
    return None


def _alive_at(now_ms: int) -> Callable[[Record], bool]:
    def alive(rec: Record) -> bool:
        expires = _header(rec, _H_EXPIRES)
        return expires is None or int(expires) > now_ms

    return alive


def _answer(rec: Record, *, with_token: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messageUuid": (rec.key or b"").decode("utf-8", "replace"),
        "message": _decode.decode(rec.value) if rec.value else None,
        "timestamp": rfc3339(rec.timestamp),
    }
    if with_token:
        out["dbResumeToken"] = encode_token(rec.topic, [(0, rec.offset + 1)])
    return out


def _server_error(exc: TidewireError) -> Response:
    status = 503 if isinstance(exc, (StorageError, LogFailedError, BackpressureError)) else 500
    if isinstance(exc, BatchTooLargeError):  # over the topic's max_batch_bytes
        status = 413
    return _json(status, {"error": exc.message})
