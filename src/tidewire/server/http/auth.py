"""The HTTP side of the one gate: what every route needs, declared as data, and the ASGI
middleware that checks it before any route runs.

:data:`ROUTE_NEEDS` has one entry per route of every HTTP listener (the native API, its
WebSocket and SSE streams, and the compatibility modes): ``(method, path template)`` to a
:class:`Route` — the requirement (as in ``server/needs.py``: PUBLIC, AUTHENTICATED or a
function to the permissions needed) and the interface it is audited under. The requirement's
function gets a :class:`RouteRequest`: the path parameters, the query, and — for routes
declared with ``body=True`` — the JSON body. A test enumerates every route of every listener
and fails on one without an entry.

Authentication over HTTP is ``Authorization: Bearer <API key>`` (or a client certificate
when the listener asks for one), or — without ``Authorization`` — a browser session's
``tidewire_session`` cookie (``server/http/session.py``), whose POST, PUT, PATCH and DELETE
requests must also carry its ``X-CSRF-Token`` (403 otherwise). Refusals: 401
(``WWW-Authenticate: Bearer``) without valid credentials, 403 without the permission, 429
when the source failed too often; a WebSocket handshake is refused with the same statuses
and error documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidewire.broker import Broker
from tidewire.errors import (
    AuthenticationFailedError,
    TidewireError,
    TooManyAuthFailuresError,
)
from tidewire.security.model import CLUSTER_NAME, Operation, ResourceType
from tidewire.server.gate import Gate, Session, gate_for, source_of
from tidewire.server.http.compat import topic_for
from tidewire.server.http.errors import error_body, status_of
from tidewire.server.http.session import (
    CSRF_HEADER,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_IDLE_MS,
    MUTATING,
    cookie_token,
    sessions_for,
)
from tidewire.server.needs import AUTHENTICATED, PUBLIC, Need, Requirement

__all__ = ["LISTENER_ROUTES", "ROUTE_NEEDS", "HttpAuth", "Route", "RouteRequest"]


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a route's requirement function reads resource names from."""

    path: dict[str, str]
    query: dict[str, str]
    body: Any = None


@dataclass(frozen=True, slots=True)
class Route:
    requirement: Requirement
    interface: str = "http"
    #: The requirement needs the JSON body (read, then handed on to the route unchanged).
    body: bool = False
    #: The path parameters may hold '/' (matched as ``{name:path}``; the template is the
    #: OpenAPI spec's, without the converter).
    slashes: bool = False


_T, _G, _C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
_O = Operation


def _topic(op: Operation, *, param: str = "topic") -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_T, op, r.path[param])]


def _topic_stream(r: RouteRequest) -> list[Need]:
    """A topic's WebSocket stream: read on the topic, and with ``?group=`` read on the group
    too, which the stream joins and commits for (as ``JOIN_GROUP`` and ``OFFSET_COMMIT``
    need; in a cluster the node does it at the coordinator as its own principal, so the
    caller's right is checked here)."""
    needs = [Need(_T, _O.READ, r.path["topic"])]
    if group := r.query.get("group"):
        needs.append(Need(_G, _O.READ, group))
    return needs


def _publish(r: RouteRequest) -> list[Need]:
    t = r.path["topic"]
    return [Need(_T, _O.WRITE, t), Need(_T, _O.CREATE, t, if_missing=True)]


def _group(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_G, op, r.path["group"])]


def _create_topic(r: RouteRequest) -> list[Need]:
    name = r.body.get("name") if isinstance(r.body, dict) else None
    if not isinstance(name, str) or not name:
        return []  # a body without a name: the route refuses it (400) with its own message
    return [Need(_T, _O.CREATE, name)]


def _body_topics(r: RouteRequest, *keys: str) -> list[str]:
    """Topic names in the body: ``body[key]`` for each key, a string or a list of objects
    with a ``topic`` (anything else: none; the route refuses the body itself)."""
    out: list[str] = []
    body = r.body if isinstance(r.body, dict) else {}
    for key in keys:
        value = body.get(key)
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            out += [
                v["topic"] for v in value if isinstance(v, dict) and isinstance(v.get("topic"), str)
            ]
    return list(dict.fromkeys(out))


def _commit(r: RouteRequest) -> list[Need]:
    return [Need(_G, _O.READ, r.path["group"])] + [
        Need(_T, _O.READ, t) for t in _body_topics(r, "offsets")
    ]


def _reset(r: RouteRequest) -> list[Need]:
    return [Need(_G, _O.ALTER, r.path["group"])] + [
        Need(_T, _O.DESCRIBE, t) for t in _body_topics(r, "topic")
    ]


def _topic_and_cluster(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_T, op, r.path["topic"]), Need(_C, op, CLUSTER_NAME)]


def _cluster(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_C, op, CLUSTER_NAME)]


def _own(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    """``op`` on the cluster, unless the principal in the path is the caller itself."""
    return lambda r: [Need(_C, op, CLUSTER_NAME, unless_principal=r.path["name"])]


def _compat(
    prefix: str, op: Operation, name: Callable[[RouteRequest], str]
) -> Callable[[RouteRequest], list[Need]]:
    """A compatibility route's need, on the tidewire topic its name maps onto (so the ACLs of
    ``msgbus.*`` topics govern them); writes may create it."""

    def needs(r: RouteRequest) -> list[Need]:
        raw = name(r)
        if not raw:
            return []  # the route answers 400 itself
        try:
            t = topic_for(prefix, raw)
        except TidewireError:
            return []  # likewise
        out = [Need(_T, op, t)]
        if op is _O.WRITE:
            out.append(Need(_T, _O.CREATE, t, if_missing=True))
        if op is _O.READ:
            out.append(Need(_G, _O.READ, prefix.rstrip(".")))
        return out

    return needs


_Q, _X = ResourceType.QUEUE, ResourceType.EXCHANGE
#: The name ACLs give the default exchange ("" to the broker; paths spell it so too).
_DEFAULT_EXCHANGE_ACL = "amq.default"


def _queue(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_Q, op, r.path["name"])]


def _exchange(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_X, op, r.path["name"])]


def _replay(r: RouteRequest) -> list[Need]:
    # The targets are named by each message's x-death header: write on every queue.
    return [Need(_Q, _O.READ, r.path["name"]), Need(_Q, _O.WRITE, "*")]


def _binding(r: RouteRequest) -> list[Need]:
    """Bind or unbind: write on the exchange, and read on the queue (or write on the topic
    its messages would be stored in)."""
    body = r.body if isinstance(r.body, dict) else {}
    exchange, dest = body.get("exchange"), body.get("destination")
    if not isinstance(exchange, str) or not isinstance(dest, str):
        return []  # the route refuses the body (400) with its own message
    kind = body.get("destination_kind", "queue")
    out = [Need(_X, _O.WRITE, exchange or _DEFAULT_EXCHANGE_ACL)]
    if kind == "topic":
        out.append(Need(_T, _O.WRITE, dest))
    else:
        out.append(Need(_Q, _O.READ, dest))
    return out


_S = ResourceType.STREAM


def _stream(op: Operation) -> Callable[[RouteRequest], list[Need]]:
    return lambda r: [Need(_S, op, r.path["stream"])]


def _body_streams(r: RouteRequest, op: Operation, key: str) -> list[Need]:
    """``op`` on every distinct stream the body names: ``body[key]`` a list of ids, a list of
    objects with a ``stream``, or an object whose keys are ids (anything else names none: the
    route refuses the body itself)."""
    body = r.body if isinstance(r.body, dict) else {}
    value = body.get(key)
    names: list[str] = []
    if isinstance(value, dict):
        names = [k for k in value if isinstance(k, str)]
    elif isinstance(value, list):
        for v in value:
            s = v.get("stream") if isinstance(v, dict) else v
            if isinstance(s, str):
                names.append(s)
    return [Need(_S, op, s) for s in dict.fromkeys(names)]


def _ipubsub_send_stream(r: RouteRequest) -> list[Need]:
    s = r.body.get("streamId") if isinstance(r.body, dict) else None
    return [Need(_S, _O.WRITE, s)] if isinstance(s, str) and s else []


def _ipubsub_receive_stream(r: RouteRequest) -> list[Need]:
    s = r.query.get("streamId", "")
    return [Need(_S, _O.READ, s)] if s else []


#: Every route of every HTTP listener: (method, path template) -> Route. WebSocket routes
#: use the method ``WS``.
ROUTE_NEEDS: dict[str, dict[tuple[str, str], Route]] = {
    "native": {
        ("GET", "/openapi.json"): Route(PUBLIC),
        ("GET", "/docs"): Route(PUBLIC),
        ("GET", "/docs/oauth2-redirect"): Route(PUBLIC),
        ("GET", "/healthz/live"): Route(PUBLIC),
        ("GET", "/healthz/startup"): Route(PUBLIC),
        ("GET", "/healthz/ready"): Route(PUBLIC),
        ("GET", "/healthz/storage"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/healthz/listeners"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/healthz/recovery"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/topics"): Route(AUTHENTICATED),
        ("POST", "/v1/topics"): Route(_create_topic, body=True),
        ("GET", "/v1/topics/{topic}"): Route(_topic(_O.DESCRIBE)),
        ("DELETE", "/v1/topics/{topic}"): Route(_topic(_O.DELETE)),
        ("PATCH", "/v1/topics/{topic}"): Route(_topic(_O.ALTER)),
        ("POST", "/v1/topics/{topic}/messages"): Route(_publish),
        ("POST", "/v1/topics/{topic}/messages:batch"): Route(_publish),
        ("GET", "/v1/topics/{topic}/messages"): Route(_topic(_O.READ)),
        ("GET", "/v1/topics/{topic}/partitions/{partition}/messages"): Route(_topic(_O.READ)),
        ("GET", "/v1/topics/{topic}/stream"): Route(_topic(_O.READ), interface="sse"),
        ("WS", "/v1/topics/{topic}/stream"): Route(_topic_stream, interface="websocket"),
        # Queues and exchanges (as the binary APIs 41-57): lists show what may be described.
        ("GET", "/v1/exchanges"): Route(AUTHENTICATED),
        ("GET", "/v1/exchanges/{name}"): Route(_exchange(_O.DESCRIBE)),
        ("PUT", "/v1/exchanges/{name}"): Route(_exchange(_O.CREATE)),
        ("DELETE", "/v1/exchanges/{name}"): Route(_exchange(_O.DELETE)),
        ("POST", "/v1/exchanges/{name}/publish"): Route(_exchange(_O.WRITE)),
        ("GET", "/v1/bindings"): Route(AUTHENTICATED),
        ("POST", "/v1/bindings"): Route(_binding, body=True),
        ("DELETE", "/v1/bindings"): Route(_binding, body=True),
        ("GET", "/v1/queues"): Route(AUTHENTICATED),
        ("GET", "/v1/queues/{name}"): Route(_queue(_O.DESCRIBE)),
        ("PUT", "/v1/queues/{name}"): Route(_queue(_O.CREATE)),
        ("DELETE", "/v1/queues/{name}"): Route(_queue(_O.DELETE)),
        ("POST", "/v1/queues/{name}/purge"): Route(_queue(_O.DELETE)),
        ("POST", "/v1/queues/{name}/get"): Route(_queue(_O.READ)),
        ("POST", "/v1/queues/{name}/ack"): Route(_queue(_O.READ)),
        ("POST", "/v1/queues/{name}/nack"): Route(_queue(_O.READ)),
        ("POST", "/v1/queues/{name}/reject"): Route(_queue(_O.READ)),
        ("GET", "/v1/queues/{name}/dlq"): Route(_queue(_O.READ)),
        ("POST", "/v1/queues/{name}/dlq/replay"): Route(_replay),
        ("POST", "/v1/queues/{name}/dlq/purge"): Route(_queue(_O.DELETE)),
        ("WS", "/v1/queues/{name}/ws"): Route(_queue(_O.READ), interface="websocket"),
        # Lightweight streams (as the binary APIs 58-62): ACLs by stream id. A request naming
        # several streams needs the permission on each; lists show what may be described.
        ("GET", "/v1/streams"): Route(AUTHENTICATED),
        ("GET", "/v1/stats/streams"): Route(_cluster(_O.DESCRIBE)),
        # The Kafka listener's figures (as the tidewire_kafka_* metrics).
        ("GET", "/v1/stats/kafka"): Route(_cluster(_O.DESCRIBE)),
        # A cluster's status and partitions (as the tidewire_cluster_* metrics).
        ("GET", "/v1/cluster"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/cluster/partitions"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/cluster/metrics"): Route(_cluster(_O.DESCRIBE)),
        # Reassignments (as ALTER_REPLICATION): moves of a topic need alter on it and on the
        # cluster (Kafka's ALTER on the cluster), their status describe on the topic.
        ("GET", "/v1/cluster/reassignments"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/cluster/reassignments/{topic}"): Route(_topic(_O.DESCRIBE)),
        ("POST", "/v1/cluster/reassignments/{topic}"): Route(_topic_and_cluster(_O.ALTER)),
        ("DELETE", "/v1/cluster/reassignments/{topic}"): Route(_topic_and_cluster(_O.ALTER)),
        ("POST", "/v1/streams/messages"): Route(
            lambda r: _body_streams(r, _O.WRITE, "items"), body=True
        ),
        ("POST", "/v1/streams/receive"): Route(
            lambda r: _body_streams(r, _O.READ, "streams"), body=True
        ),
        ("POST", "/v1/streams/read"): Route(
            lambda r: _body_streams(r, _O.READ, "positions"), body=True
        ),
        # Longest suffixes first: the stream id in the path may hold '/'.
        ("POST", "/v1/streams/{stream}/messages"): Route(_stream(_O.WRITE), slashes=True),
        ("GET", "/v1/streams/{stream}/messages"): Route(_stream(_O.READ), slashes=True),
        ("GET", "/v1/streams/{stream}/read"): Route(_stream(_O.READ), slashes=True),
        ("GET", "/v1/streams/{stream}/sse"): Route(_stream(_O.READ), interface="sse", slashes=True),
        ("GET", "/v1/streams/{stream}"): Route(_stream(_O.DESCRIBE), slashes=True),
        ("GET", "/v1/groups"): Route(AUTHENTICATED),
        ("GET", "/v1/groups/{group}"): Route(_group(_O.DESCRIBE)),
        ("POST", "/v1/groups/{group}/commit"): Route(_commit, body=True),
        ("POST", "/v1/groups/{group}/reset"): Route(_reset, body=True),
        # Security administration: changes need alter on the cluster, reads describe; a
        # principal's own keys need authentication alone (as the binary APIs 30-40).
        ("GET", "/v1/principals"): Route(_cluster(_O.DESCRIBE)),
        ("POST", "/v1/principals"): Route(_cluster(_O.ALTER)),
        ("GET", "/v1/principals/{name}"): Route(_own(_O.DESCRIBE)),
        ("PATCH", "/v1/principals/{name}"): Route(_cluster(_O.ALTER)),
        ("DELETE", "/v1/principals/{name}"): Route(_cluster(_O.ALTER)),
        ("GET", "/v1/principals/{name}/keys"): Route(_own(_O.DESCRIBE)),
        ("POST", "/v1/principals/{name}/keys"): Route(_own(_O.ALTER)),
        ("DELETE", "/v1/keys/{key_id}"): Route(
            lambda r: [Need(_C, _O.ALTER, unless_principal=r.query.get("principal", ""))]
        ),
        ("GET", "/v1/acls"): Route(_cluster(_O.DESCRIBE)),
        ("POST", "/v1/acls"): Route(_cluster(_O.ALTER)),
        ("DELETE", "/v1/acls"): Route(_cluster(_O.ALTER)),
        ("GET", "/v1/quotas"): Route(_cluster(_O.DESCRIBE)),
        ("PUT", "/v1/quotas/{name}"): Route(_cluster(_O.ALTER)),
        ("DELETE", "/v1/quotas/{name}"): Route(_cluster(_O.ALTER)),
        ("GET", "/v1/whoami"): Route(AUTHENTICATED),
        # Browser sessions: the routes check the key or the cookie themselves (session_api.py).
        ("POST", "/v1/session"): Route(PUBLIC),
        ("GET", "/v1/session"): Route(PUBLIC),
        ("DELETE", "/v1/session"): Route(PUBLIC),
        ("GET", "/v1/settings"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/audit"): Route(_cluster(_O.ADMIN)),
        # The dashboard's static files: its data comes through the routes above.
        ("GET", "/dashboard"): Route(PUBLIC),
        ("GET", "/dashboard/{path}"): Route(PUBLIC),
        # Metrics: a Prometheus scrape sends an API key of a principal allowed this.
        ("GET", "/metrics"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/metrics/recent"): Route(_cluster(_O.DESCRIBE)),
        ("GET", "/v1/admin/log-levels"): Route(_cluster(_O.DESCRIBE)),
        ("PUT", "/v1/admin/log-levels"): Route(_cluster(_O.ALTER)),
    },
    # metrics_port: a listener of its own for the scraper, behind the same gate.
    "metrics": {
        ("GET", "/metrics"): Route(_cluster(_O.DESCRIBE)),
    },
    "msgbus": {
        ("GET", "/"): Route(AUTHENTICATED, interface="msgbus"),
        ("PUT", "/{topic:path}"): Route(
            _compat("msgbus.", _O.WRITE, lambda r: r.path["topic"]), interface="msgbus"
        ),
        ("POST", "/{topic:path}"): Route(
            _compat("msgbus.", _O.WRITE, lambda r: r.path["topic"]), interface="msgbus"
        ),
        ("GET", "/{topic:path}"): Route(
            _compat("msgbus.", _O.READ, lambda r: r.path["topic"]), interface="msgbus"
        ),
        ("WS", "/{topic:path}"): Route(
            _compat("msgbus.", _O.READ, lambda r: r.path["topic"]), interface="msgbus"
        ),
    },
    # iPubSub's streams are tidewire streams: ACLs by stream id (the streamId).
    "ipubsub": {
        ("POST", "/api/v1/streams/send"): Route(
            _ipubsub_send_stream, interface="ipubsub", body=True
        ),
        ("GET", "/api/v1/streams/receive"): Route(_ipubsub_receive_stream, interface="ipubsub"),
    },
}

#: The listener names of the gateway (gateway.NATIVE, MSGBUS, IPUBSUB) -> their table.
LISTENER_ROUTES = ROUTE_NEEDS


_SPAN = re.compile(r"\{(\w+)\}")


@dataclass(slots=True)
class _Compiled:
    method: str
    template: str
    regex: re.Pattern[str]
    route: Route
    convertors: dict[str, Any] = field(default_factory=dict)


class HttpAuth:
    """ASGI middleware: authenticate and authorize every request of one listener before
    ``app`` sees it (see the module docstring).

    Args:
        app: the listener's app.
        broker: whose gate decides.
        routes: the listener's entry of :data:`ROUTE_NEEDS`.
        max_body_bytes: the longest body read for a ``body=True`` route (the app refuses
            longer ones itself).
        session_idle_ms, max_sessions: the browser sessions' settings (``HttpConfig``).
    """

    def __init__(
        self,
        app: ASGIApp,
        broker: Broker,
        routes: dict[tuple[str, str], Route],
        *,
        max_body_bytes: int,
        session_idle_ms: int = DEFAULT_SESSION_IDLE_MS,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self.app = app
        self.gate: Gate = gate_for(broker)
        self.sessions = sessions_for(broker, idle_ms=session_idle_ms, max_sessions=max_sessions)
        self.max_body_bytes = max_body_bytes
        #: Per method: the routes without parameters by path, then the others in order.
        self._exact: dict[tuple[str, str], _Compiled] = {}
        self._routes: dict[str, list[_Compiled]] = {}
        for (method, template), route in routes.items():
            pattern = _SPAN.sub(r"{\1:path}", template) if route.slashes else template
            regex, _, convertors = compile_path(pattern)
            c = _Compiled(method, template, regex, route, convertors)
            if "{" in template:
                self._routes.setdefault(method, []).append(c)
            else:
                self._exact[method, template] = c

    def _match(self, method: str, path: str) -> tuple[_Compiled | None, dict[str, str]]:
        if method == "HEAD":
            method = "GET"
        c = self._exact.get((method, path))
        if c is not None:
            return c, {}
        for c in self._routes.get(method, ()):
            m = c.regex.match(path)
            if m is not None:
                return c, m.groupdict()
        return None, {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        method = "WS" if kind == "websocket" else scope["method"]
        compiled, params = self._match(method, scope["path"])
        route = compiled.route if compiled is not None else Route(AUTHENTICATED)
        action = f"{method} {compiled.template if compiled is not None else scope['path']}"
        if compiled is not None:
            scope["tidewire.route"] = f"{method} {compiled.template}"  # metrics' label
        session = Session(
            source=source_of(scope.get("client")),
            interface=route.interface,
            tls=bool(scope.get("tidewire.tls")) or scope.get("scheme") in ("https", "wss"),
            cert_principal=scope.get("tidewire.cert_principal"),
        )
        cookie: str | None = None
        try:
            if route.requirement is not PUBLIC:
                key = _bearer(scope)
                if key is not None:
                    try:
                        await self.gate.authenticate_key(session, key)
                    except TidewireError as exc:
                        await self.gate.hold_back(exc)
                        raise
                elif self.gate.enabled:
                    cookie = cookie_token(scope["headers"])
                    if cookie is not None:
                        browser = self.sessions.get(cookie)
                        session.principal_name = browser.principal
                        session.key_id = browser.key_id
                        session.mechanism = "session"
                        if method in MUTATING:
                            browser.check_csrf(_header(scope, CSRF_HEADER.encode()))
            body_bytes: bytes | None = None
            body: Any = None
            if route.body and kind == "http":
                body_bytes, receive = await self._read_body(receive)
                try:
                    body = json.loads(body_bytes) if body_bytes else None
                except ValueError:
                    body = None  # the route answers 400 with its own message
            request = RouteRequest(
                params, dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))), body
            )
            principal = self.gate.check(session, action, route.requirement, request)
        except TidewireError as exc:
            if cookie is not None and isinstance(exc, AuthenticationFailedError):
                self.sessions.end(cookie)  # its key was revoked, or its principal deleted
            await _refuse(exc, scope, send)
            return
        scope.setdefault("state", {})["tidewire_principal"] = principal
        self.gate.enter(session, principal)
        await self.app(scope, receive, send)

    async def _read_body(self, receive: Receive) -> tuple[bytes, Receive]:
        """The whole body (up to one byte past the limit) and a ``receive`` that hands it
        on to the app, then whatever follows."""
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and size <= self.max_body_bytes:
            message = await receive()
            if message["type"] != "http.request":
                pending: list[Message] = [message]
                break
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
        else:
            pending = []
        data = b"".join(chunks)
        replay: list[Message] = [{"type": "http.request", "body": data, "more_body": more}]
        replay += pending

        async def replayed() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        return data, replayed


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationFailedError(
                    "the Authorization header must be 'Bearer <API key>'"
                )
            return str(token.strip())
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


async def _refuse(exc: TidewireError, scope: Scope, send: Send) -> None:
    status = status_of(exc)
    headers = [(b"content-type", b"application/json")]
    if isinstance(exc, AuthenticationFailedError):
        headers.append((b"www-authenticate", b'Bearer realm="tidewire"'))
    if isinstance(exc, TooManyAuthFailuresError):
        headers.append((b"retry-after", b"60"))
    body = error_body(exc.code, type(exc).__name__, exc.message)
    headers.append((b"content-length", str(len(body)).encode()))
    if scope["type"] == "websocket":
        if "websocket.http.response" in scope.get("extensions", {}):
            await send(
                {"type": "websocket.http.response.start", "status": status, "headers": headers}
            )
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
