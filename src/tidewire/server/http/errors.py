"""The HTTP gateway's errors: one JSON shape, statuses mapped from tidewire's error classes.

Every error answer of the native API is::

    {"error": {"code": 70, "name": "UnknownTopicError", "message": "topic 'x' does not exist"}}

``code`` and ``name`` are those of the :mod:`tidewire.errors` class (the binary protocol's
error codes); the HTTP status follows from the class (:data:`STATUS`): 400 a malformed request
(bad JSON, a field of the wrong type, named in the message), 404 no such topic, partition or
group, 409 exists already or a group in the way, 413 too large, 416 an offset outside the log,
422 a name or count that is not allowed, or an offset in a damaged range of the log (code 32;
the error then carries ``"damaged_range": {"start": S, "end": E}``: reading can go on at E),
503 the broker is busy or its disk refused (retry), or the partition is offline (code 37).
Queues and exchanges: 404 no such queue or exchange, 409 declared already with other
settings, a state that forbids it (not empty, in use) or a delivery tag not held, 422 a
mandatory message no binding routes, 423 an exclusive queue of another connection, 429 a
queue at its length limit (retry after Retry-After), 400 a name or setting not allowed.
Streams: 400 a stream id, resume token, TTL or wait not allowed (code 120), 429 a blocking send
that found no room (code 121), 503 too many streams or waiting receivers (retry).
"""

from __future__ import annotations

import logging

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidewire import errors as tw
from tidewire.server.http.cluster import leader_location

__all__ = [
    "STATUS",
    "BodyLimit",
    "BodyTooLarge",
    "IdempotencyKeyReusedError",
    "error_body",
    "error_response",
    "install_error_handlers",
    "status_of",
]

log = logging.getLogger("tidewire.http")


class IdempotencyKeyReusedError(tw.InvalidRequestError):
    """An ``Idempotency-Key`` sent again with other messages than its first request's
    (answered 409; its code is that of an invalid request)."""


#: HTTP status of each error class (the first class in the MRO found here wins).
STATUS: dict[type[tw.TidewireError], int] = {
    IdempotencyKeyReusedError: 409,
    tw.UnknownTopicError: 404,
    tw.UnknownPartitionError: 404,
    tw.UnknownGroupError: 404,
    tw.UnknownMemberError: 404,
    tw.TopicExistsError: 409,
    tw.GroupNotEmptyError: 409,
    tw.IllegalGenerationError: 409,
    tw.PartitionNotAssignedError: 409,
    tw.RebalanceInProgressError: 409,
    tw.InconsistentGroupProtocolError: 409,
    tw.ProducerFencedError: 409,
    tw.OutOfOrderSequenceError: 409,
    tw.DuplicateSequenceError: 409,
    tw.BatchTooLargeError: 413,
    tw.OffsetOutOfRangeError: 416,
    tw.PartitionCorruptError: 422,
    tw.PartitionOfflineError: 503,
    tw.InvalidTopicError: 422,
    tw.InvalidGroupError: 422,
    tw.RecordBatchError: 400,
    tw.InvalidConfigError: 400,
    tw.ProtocolError: 400,
    tw.BackpressureError: 503,
    tw.ShuttingDownError: 503,
    tw.GroupFullError: 503,
    tw.StorageError: 503,
    tw.RequestTimedOutError: 504,
    tw.AuthenticationFailedError: 401,
    tw.UnsupportedSaslMechanismError: 401,
    tw.AuthorizationFailedError: 403,
    tw.TooManyAuthFailuresError: 429,
    tw.UnknownPrincipalError: 404,
    tw.PrincipalExistsError: 409,
    tw.UnknownQueueError: 404,
    tw.UnknownExchangeError: 404,
    tw.PreconditionFailedError: 409,
    tw.UnknownDeliveryTagError: 409,
    tw.QueueLockedError: 423,
    tw.UnroutableError: 422,
    tw.InvalidQueueError: 400,
    # A queue at its length limit: the publisher is asked to slow down (the broker is fine).
    tw.QueueFullError: 429,
    # Lightweight streams: a bad id, token, TTL or wait; a blocking send that found no room
    # (the sender is asked to slow down, as a full queue); too many streams: busy (503).
    tw.InvalidStreamError: 400,
    tw.StreamFullError: 429,
    # A cluster's: another node leads the partition (redirected there when its HTTP address
    # is known, see tidewire.server.http.cluster), or too few in-sync replicas for now.
    tw.NotLeaderError: 503,
    tw.NotEnoughReplicasError: 503,
    # A request forwarded to another node whose connection broke before its answer: retry
    # (a publish without Idempotency-Key may have been stored, see docs/cluster.md).
    tw.ConnectionLostError: 503,
}

#: Statuses whose answers say when to retry.
_RETRY_AFTER_S = {503: "1", 429: "10"}
#: Backpressure (a busy broker, a full queue) says to retry soon, whatever its status.
_BACKPRESSURE_RETRY_S = "1"

_encode = msgspec.json.Encoder().encode


def status_of(exc: tw.TidewireError) -> int:
    """The HTTP status answering ``exc`` (500 for an error without a mapping)."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 500


def error_body(code: int, name: str, message: str, **extra: object) -> bytes:
    """The JSON error document (``extra``: more fields of the error object)."""
    return _encode({"error": {"code": code, "name": name, "message": message, **extra}})


def _extra(exc: tw.TidewireError) -> dict[str, object]:
    if isinstance(exc, tw.PartitionCorruptError) and exc.damage_end >= 0:
        return {"damaged_range": {"start": exc.damage_start, "end": exc.damage_end}}
    return {}


def error_response(exc: tw.TidewireError, status: int | None = None) -> Response:
    """The answer to a tidewire error."""
    status = status_of(exc) if status is None else status
    retry = (
        _BACKPRESSURE_RETRY_S
        if isinstance(exc, tw.BackpressureError)
        else _RETRY_AFTER_S.get(status)
    )
    headers = {"Retry-After": retry} if retry is not None else None
    return Response(
        error_body(exc.code, type(exc).__name__, exc.message, **_extra(exc)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def redirect_response(exc: tw.NotLeaderError, location: str) -> Response:
    """307 to ``location`` (the partition's leader), with the error document as its body."""
    return Response(
        error_body(exc.code, type(exc).__name__, exc.message, leader_id=exc.leader_id),
        status_code=307,
        media_type="application/json",
        headers={"Location": location},
    )


def bad_request(message: str) -> Response:
    """A 400 answer: a request that does not match the API's schema."""
    return error_response(tw.InvalidRequestError(message), 400)


class BodyTooLarge(HTTPException):
    """A request body over ``http_max_body_bytes`` (raised while the body is read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds http_max_body_bytes={limit:,}")


def _validation_message(exc: RequestValidationError) -> str:
    """One line naming every field at fault: ``body.value: Input should be a valid string``."""
    parts: list[str] = []
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            at = loc[1] if len(loc) > 1 else "?"
            parts.append(f"the body is not valid JSON: {ctx.get('error', 'decode error')} at {at}")
            continue
        if loc and loc[0] == "body" and len(loc) > 1:
            loc = loc[1:]
            where = "field " + ".".join(loc)
        elif loc and loc[0] == "body":
            where = "the body"
        elif len(loc) > 1:
            where = f"{loc[0]} parameter {'.'.join(loc[1:])!r}"
        else:
            where = ".".join(loc) or "the request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts) or "the request does not match the API's schema"


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in the one JSON shape: tidewire errors by their class, validation
    failures as 400 naming the field, HTTP errors (404 no route, 405, 413) with their
    status, and anything unexpected as 500 (logged)."""

    async def on_tidewire(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, tw.TidewireError)
        if isinstance(exc, tw.NotLeaderError):
            ctx = getattr(request.app.state, "tidewire", None)
            url = request.url
            target = url.path + (f"?{url.query}" if url.query else "")
            where = None if ctx is None else leader_location(ctx.broker, exc, url.scheme, target)
            if where is not None:
                return redirect_response(exc, where)
        if status_of(exc) >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc.message)
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return bad_request(_validation_message(exc))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 413:
            err: tw.TidewireError = tw.BatchTooLargeError(str(exc.detail))
        elif exc.status_code == 404:
            err = tw.InvalidRequestError(f"no route {request.method} {request.url.path}")
        else:
            err = tw.InvalidRequestError(str(exc.detail))
        return Response(
            error_body(err.code, type(err).__name__, err.message),
            status_code=exc.status_code,
            media_type="application/json",
            headers=exc.headers,
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        err = tw.UnknownError(f"the broker failed: {type(exc).__name__}")
        return Response(
            error_body(err.code, type(err).__name__, err.message),
            status_code=500,
            media_type="application/json",
        )

    app.add_exception_handler(tw.TidewireError, on_tidewire)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)


class BodyLimit:
    """ASGI middleware: refuse a request body over ``limit`` bytes with 413, by its
    Content-Length before reading anything, or (chunked) as soon as the bytes read pass it.

    Args:
        app: the app to guard.
        limit: the largest body accepted (bytes).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    response = _too_large(limit)
                    await response(scope, receive, send)
                    return
                if declared >= 0:  # the server stops at the declared length
                    await self.app(scope, receive, send)
                    return
                break
        seen = 0

        async def counting() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counting, send)


def _too_large(limit: int) -> Response:
    err = tw.BatchTooLargeError(f"the request body exceeds http_max_body_bytes={limit:,}")
    return Response(
        error_body(err.code, type(err).__name__, err.message),
        status_code=413,
        media_type="application/json",
    )
