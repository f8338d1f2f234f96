"""The publish route without the framework around it: ``POST /v1/topics/{topic}/messages``
answered by a plain ASGI function in front of the FastAPI app.

Publishing one message is the API's hot path, and the framework's routing, dependency and
middleware layers cost several times the publish itself. This does exactly what the FastAPI
route does (the route declares it in the OpenAPI spec, and calls the same
:meth:`~tidewire.server.http.messages.Publisher.publish_one`): the same body limit, the same
``Idempotency-Key`` check, the same answers and error documents. Every other request goes to
the app.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidewire.errors import (
    BatchTooLargeError,
    InvalidRequestError,
    NotLeaderError,
    TidewireError,
    UnknownError,
)
from tidewire.server.http.cluster import leader_location
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.errors import error_body, status_of
from tidewire.server.http.idempotency import MAX_KEY_CHARS

__all__ = ["PublishFastPath"]

log = logging.getLogger("tidewire.http")

_PREFIX = "/v1/topics/"
_SUFFIX = "/messages"
_JSON = [(b"content-type", b"application/json")]
_RETRY = [(b"content-type", b"application/json"), (b"retry-after", b"1")]


class PublishFastPath:
    """ASGI middleware: serve single publishes itself, pass everything else to ``app``.

    Args:
        app: the FastAPI app (with its own body limit for the other routes).
        ctx: the app's context (its publisher and settings).
    """

    def __init__(self, app: ASGIApp, ctx: GatewayContext) -> None:
        self.app = app
        self.ctx = ctx
        self.limit = ctx.config.http_max_body_bytes
        #: Whether a publish led by another node is answered 307 (else it was forwarded, and
        #: one that could not be is 503).
        self.redirect = ctx.config.http_cluster_routing == "redirect"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(_PREFIX) and path.endswith(_SUFFIX):
                topic = path[len(_PREFIX) : -len(_SUFFIX)]
                if topic and "/" not in topic:
                    await self._publish(topic, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _publish(self, topic: str, scope: Scope, receive: Receive, send: Send) -> None:
        key: str | None = None
        declared = -1
        for name, value in scope["headers"]:
            if name == b"idempotency-key":
                key = value.decode("latin-1")
            elif name == b"content-length":
                declared = int(value) if value.isdigit() else -1
        try:
            if declared > self.limit:
                raise _too_large(self.limit)
            if key is not None and len(key) > MAX_KEY_CHARS:
                raise InvalidRequestError(
                    f"header Idempotency-Key: at most {MAX_KEY_CHARS} characters, not {len(key):,}"
                )
            body = await self._body(receive)
            if body is None:
                return  # the client went away
            answer = await self.ctx.publisher.publish_one(topic, body, key)
        except TidewireError as exc:
            if isinstance(exc, NotLeaderError) and self.redirect:
                where = leader_location(self.ctx.broker, exc, scope["scheme"], _target(scope))
                if where is not None:
                    body = error_body(
                        exc.code, type(exc).__name__, exc.message, leader_id=exc.leader_id
                    )
                    await _send(send, 307, body, [(b"location", where.encode())])
                    return
            status = status_of(exc)
            await _send(send, status, error_body(exc.code, type(exc).__name__, exc.message))
            return
        except Exception as exc:  # answered 500 and logged, as the app's own handler does
            log.exception("POST %s failed", scope["path"])
            err = UnknownError(f"the broker failed: {type(exc).__name__}")
            await _send(send, 500, error_body(err.code, type(err).__name__, err.message))
            return
        await _send(send, 201, answer)

    async def _body(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.limit:
                    raise _too_large(self.limit)
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> TidewireError:
    return BatchTooLargeError(f"the request body exceeds http_max_body_bytes={limit:,}")


def _target(scope: Scope) -> str:
    """The request's path and query, as sent."""
    query: bytes = scope.get("query_string", b"")
    path: str = scope["path"]
    return path + ("?" + query.decode("latin-1") if query else "")


async def _send(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = _RETRY if status == 503 else _JSON
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, *(extra or ()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
