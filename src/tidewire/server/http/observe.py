"""Per-request observability of the HTTP API, as a pure ASGI middleware: the request id and
the request's span.

- ``X-Request-Id``: a client's value is kept when it is 1 to 128 plain characters
  (``A-Z a-z 0-9 . _ : @ / + = -``), else one is generated; it is bound to the request's log
  lines (``request_id``, see :mod:`tidewire.observability.logs`) and echoed on the answer.
- With an OpenTelemetry SDK (:mod:`tidewire.observability.tracing`), a SERVER span per
  request, continuing a ``traceparent`` the client sent: ``{method} {route}`` with
  ``http.request.method``, ``http.route``, ``url.path``, ``http.response.status_code`` and
  ``error.type`` (the status code) for 5xx answers. Without an SDK: one cheap check.

WebSocket and lifespan scopes pass through untouched.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import propagate
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidewire.observability import logs, tracing

__all__ = ["REQUEST_ID_HEADER", "RequestObservation"]

REQUEST_ID_HEADER = "x-request-id"
_HEADER_BYTES = REQUEST_ID_HEADER.encode()


class _ScopeGetter:
    """Reads an ASGI scope's headers as a propagation carrier."""

    def get(self, carrier: Scope, key: str) -> list[str] | None:
        want = key.encode()
        for k, v in carrier.get("headers", ()):
            if k == want:
                return [v.decode("latin-1")]
        return None

    def keys(self, carrier: Scope) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier.get("headers", ())]


_GETTER = _ScopeGetter()


class RequestObservation:
    """The middleware (wraps the whole native API app, the publish fast path included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for k, v in scope.get("headers", ()):
            if k == _HEADER_BYTES:
                rid = v.decode("latin-1")
                break
        if not logs.valid_request_id(rid):
            rid = logs.new_request_id()
        assert rid is not None
        method = scope.get("method", "")
        path = scope.get("path", "")
        # The gate in front (auth.py) has named the principal by now.
        principal = scope.get("state", {}).get("tidewire_principal")
        logs.bind_request("", rid, f"{method} {path}", getattr(principal, "name", "") or "")
        echoed = (_HEADER_BYTES, rid.encode("latin-1"))
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), echoed]
            await send(message)

        t = tracing.tracer()  # None without an OpenTelemetry SDK
        if t is None:
            await self.app(scope, receive, send_with_id)
            return
        attrs: dict[str, Any] = {"http.request.method": method, "url.path": path}
        ctx = propagate.extract(scope, getter=_GETTER)  # type: ignore[arg-type]
        span = t.start_span(method, context=ctx, kind=SpanKind.SERVER, attributes=attrs)
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException as exc:
            tracing.fail_span(span, exc)
            raise
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)
            if template:
                span.set_attribute("http.route", template)
                span.update_name(f"{method} {template}")
            if status:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(StatusCode.ERROR)
            span.end()
