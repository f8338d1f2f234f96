"""The lightweight-stream APIs (keys 58..62): requests to ``broker.streams``
(:class:`~tidewire.broker.streams.StreamManager`), which keeps no state per connection.

The gate has checked the request's needs (server/needs.py) before a handler runs: write on
every stream of a send, read on every stream of a receive or read, describe on the stream
described. A listing shows only the streams the principal may describe.

Errors of the request as a whole (an argument out of range, the log failing) are answered in
the response's ``error_code``/``error_message``; a send's per-item errors are in its
results. A receive or read that waits is a task of its own on the connection (as every
request is), so one connection can have many waiting at once, up to its ``max_in_flight``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidewire.broker.streams.model import check_stream_id
from tidewire.errors import InvalidStreamError, TidewireError
from tidewire.protocol.messages import (
    MAX_SEND_ITEMS,
    RING_SIZE_DEFAULT,
    ApiKey,
    Body,
    StreamDescribeRequest,
    StreamDescribeResponse,
    StreamListRequest,
    StreamListResponse,
    StreamReadRequest,
    StreamReadResponse,
    StreamReceiveRequest,
    StreamReceiveResponse,
    StreamSendRequest,
    StreamSendResponse,
)
from tidewire.security.model import ResourceType
from tidewire.server.gate import gate_for, names_allowed

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.server.handlers import ServerInfo

__all__ = ["MAX_LIST_LIMIT", "MAX_RECEIVE_STREAMS", "STREAM_HANDLERS"]

Reply = tuple[Body | None, list[bytes]]

#: The most streams one STREAM_RECEIVE or STREAM_READ names: each is a waiter registration
#: while it waits, and the request's decode and the gate's checks are per stream.
MAX_RECEIVE_STREAMS = 10_000
#: The most streams one STREAM_LIST answers (a page; the client asks for the next one).
MAX_LIST_LIMIT = 10_000
#: The most messages one receive or read answers: bounds the answer's size.
MAX_MESSAGES = 10_000


def _err(exc: TidewireError) -> dict[str, Any]:
    return {"error_code": exc.code, "error_message": exc.message}


def _ring_size(value: int) -> int | None:
    if value == RING_SIZE_DEFAULT:
        return None
    if value < 0:
        raise InvalidStreamError(f"ring_size={value:,} must be >= 0 (or -1: the default)")
    return value


def _bounded(name: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise InvalidStreamError(f"{name}={value:,} must be within {lo:,}..{hi:,}")
    return value


def _non_negative(name: str, value: int) -> int:
    if value < 0:
        raise InvalidStreamError(f"{name}={value:,} must be >= 0")
    return value


def _stream_count(n: int) -> None:
    if n == 0:
        raise InvalidStreamError("no stream named: name at least one")
    if n > MAX_RECEIVE_STREAMS:
        raise InvalidStreamError(
            f"{n:,} streams in one request exceed the limit of {MAX_RECEIVE_STREAMS:,}"
        )


async def stream_send(b: Broker, s: ServerInfo, req: StreamSendRequest, _: memoryview) -> Reply:
    try:
        if len(req.items) > MAX_SEND_ITEMS:
            raise InvalidStreamError(
                f"{len(req.items):,} items in one send exceed the limit of {MAX_SEND_ITEMS:,}"
            )
        ring_size = _ring_size(req.ring_size)
        block_ms = _non_negative("block_ms", req.block_ms)
        results = await b.streams.send(
            req.items, ring_size=ring_size, block_ms=block_ms, tokens=req.tokens
        )
    except TidewireError as exc:
        return StreamSendResponse(**_err(exc)), []
    return StreamSendResponse(results=results), []


async def stream_receive(
    b: Broker, s: ServerInfo, req: StreamReceiveRequest, _: memoryview
) -> Reply:
    try:
        _stream_count(len(req.streams))
        messages = await b.streams.receive(
            req.streams,
            max_messages=_bounded("max_messages", req.max_messages, 1, MAX_MESSAGES),
            wait_ms=_non_negative("wait_ms", req.wait_ms),
            ring_size=_ring_size(req.ring_size),
        )
    except TidewireError as exc:
        return StreamReceiveResponse(**_err(exc)), []
    return StreamReceiveResponse(messages=messages), []


async def stream_read(b: Broker, s: ServerInfo, req: StreamReadRequest, _: memoryview) -> Reply:
    try:
        _stream_count(len(req.positions))
        messages, tokens = await b.streams.read(
            req.positions,
            max_messages=_bounded("max_messages", req.max_messages, 1, MAX_MESSAGES),
            wait_ms=_non_negative("wait_ms", req.wait_ms),
        )
    except TidewireError as exc:
        return StreamReadResponse(**_err(exc)), []
    return StreamReadResponse(messages=messages, tokens=tokens), []


async def stream_list(b: Broker, s: ServerInfo, req: StreamListRequest, _: memoryview) -> Reply:
    try:
        limit = _bounded("limit", req.limit, 1, MAX_LIST_LIMIT)
        manager = b.streams
        page = manager.list(prefix=req.prefix, after=req.after, limit=limit)
    except TidewireError as exc:
        return StreamListResponse(**_err(exc)), []
    allowed = set(names_allowed(gate_for(b), ResourceType.STREAM, [i.stream for i in page]))
    # A full page may have more after it: its last id (shown or not) is where the next
    # page starts, so streams the principal may not see never end a listing early.
    last = page[-1].stream if len(page) == limit else ""
    return StreamListResponse(
        streams=[i for i in page if i.stream in allowed],
        partitions=manager.partitions,
        last=last,
    ), []


async def stream_describe(
    b: Broker, s: ServerInfo, req: StreamDescribeRequest, _: memoryview
) -> Reply:
    try:
        manager = b.streams
        if not req.stream:
            return StreamDescribeResponse(stats=manager.stats()), []
        return StreamDescribeResponse(info=manager.describe(check_stream_id(req.stream))), []
    except TidewireError as exc:
        return StreamDescribeResponse(**_err(exc)), []


STREAM_HANDLERS: dict[int, Callable[[Broker, ServerInfo, Any, memoryview], Awaitable[Reply]]] = {
    ApiKey.STREAM_SEND: stream_send,
    ApiKey.STREAM_RECEIVE: stream_receive,
    ApiKey.STREAM_READ: stream_read,
    ApiKey.STREAM_LIST: stream_list,
    ApiKey.STREAM_DESCRIBE: stream_describe,
}
