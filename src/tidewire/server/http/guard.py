"""The checks every HTTP request passes before a listener's app sees it.

A browser lets any web page send requests to ``localhost``: a form posts ``text/plain`` or
form-encoded bodies cross-site without asking, a page opens WebSockets anywhere, and a DNS
name the attacker controls can be re-pointed at ``127.0.0.1`` (DNS rebinding) so that the
page reads the answers too. A client may also send bodies faster than the broker can hold
them. :class:`RequestGuard`, an ASGI middleware in front of each listener's app, refuses
before the app runs and before the body is read:

=====  =======================================================================================
421    a ``Host`` that is not one of this broker's names (:class:`HostPolicy`,
       ``http_allowed_hosts``): the request was sent to another name that resolved here
403    a request from a web page of another origin (``Origin`` not allowed by
       ``http_allowed_origins``; without ``Origin``, ``Sec-Fetch-Site: cross-site`` or
       ``same-site`` on a request that may change something), WebSocket handshakes included
415    a body that is not JSON on a route that takes JSON (a ``Content-Type`` other than
       ``application/json`` or ``application/*+json``; none at all is taken as JSON)
413    a declared ``Content-Length`` over ``http_max_body_bytes``, answered before any of the
       body is read, or a chunked body as soon as it passes it
503    a body that does not fit in ``http_max_inflight_body_bytes`` (the bytes of every body
       being received or handled at once, :class:`BodyBudget`), with ``Retry-After``
=====  =======================================================================================

Each answer is in the listener's own error shape (:class:`ErrorStyle`): the native API's
JSON error document, msgbus' plain text, iPubSub's ``{"error": ...}``. A refused body is
never read: the answer says ``Connection: close``.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidewire import errors as tw
from tidewire.server.http.config import SAME_ORIGIN, HttpConfig, split_list
from tidewire.server.http.errors import error_body

__all__ = [
    "IPUBSUB_POLICY",
    "MSGBUS_POLICY",
    "NATIVE_POLICY",
    "SMALL_BODY_BYTES",
    "WARN_EVERY_S",
    "BodyBudget",
    "ErrorStyle",
    "HostPolicy",
    "ListenerPolicy",
    "OriginPolicy",
    "RequestGuard",
    "Warner",
    "raw_response",
    "render",
]

log = logging.getLogger("tidewire.http")

#: A kind of refusal is logged at most once per this many seconds (with the count since):
#: a flood must not flood the log too.
WARN_EVERY_S = 60.0
#: Bodies up to this size are taken even when :class:`BodyBudget` is spent: their memory is
#: bounded by the connection caps (uvicorn buffers 64 KiB before it stops reading), and
#: small publishes keep flowing while a few large uploads hold the budget.
SMALL_BODY_BYTES = 64 * 1024
#: Host values whose verdict is remembered (a hostile client could send many).
_HOST_CACHE = 256
#: Methods that change nothing on routes whose GETs only read.
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_CROSS = frozenset({b"cross-site", b"same-site"})


class ErrorStyle(enum.Enum):
    """How a listener words its errors."""

    #: The native API's ``{"error": {"code", "name", "message"}}``.
    NATIVE = "native"
    #: Plain text, as msgbus answers.
    TEXT = "text"
    #: ``{"error": "message"}``, as iPubSub answers.
    IPUBSUB = "ipubsub"


@dataclass(frozen=True, slots=True)
class ListenerPolicy:
    """What one listener's routes take.

    Attributes:
        style: how its errors are worded.
        json_methods: methods whose bodies must be JSON (415 for another ``Content-Type``).
        safe_gets: whether its GETs only read (then a GET from another site without an
            ``Origin`` passes, as a link followed from another page does); msgbus' and
            iPubSub's GETs take messages, so theirs are checked like a POST.
    """

    style: ErrorStyle
    json_methods: frozenset[str]
    safe_gets: bool


#: The native API: every body is JSON; GETs read.
NATIVE_POLICY = ListenerPolicy(ErrorStyle.NATIVE, frozenset({"POST", "PUT", "PATCH"}), True)
#: msgbus: a publish's body is the message, byte for byte, of any type (its documented
#: ``curl -d`` sends a form type); a GET pops a message.
MSGBUS_POLICY = ListenerPolicy(ErrorStyle.TEXT, frozenset(), False)
#: iPubSub: a send is JSON (its documented requests say ``application/json``); a GET receives.
IPUBSUB_POLICY = ListenerPolicy(ErrorStyle.IPUBSUB, frozenset({"POST"}), False)

_encode = msgspec.json.Encoder().encode
_PHRASE = {
    401: b"Unauthorized",
    403: b"Forbidden",
    408: b"Request Timeout",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    421: b"Misdirected Request",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def render(style: ErrorStyle, err: tw.TidewireError) -> tuple[bytes, bytes]:
    """The content type and body of an error answer in ``style``."""
    if style is ErrorStyle.NATIVE:
        return b"application/json", error_body(err.code, type(err).__name__, err.message)
    if style is ErrorStyle.IPUBSUB:
        return b"application/json", _encode({"error": err.message})
    return b"text/plain; charset=utf-8", err.message.encode()


def _headers(
    style: ErrorStyle, err: tw.TidewireError, *, close: bool, retry: bool
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    ctype, body = render(style, err)
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    if retry:
        headers.append((b"retry-after", b"1"))
    if close:
        headers.append((b"connection", b"close"))
    return headers, body


def raw_response(style: ErrorStyle, status: int, err: tw.TidewireError, *, retry: bool) -> bytes:
    """A whole HTTP/1.1 answer (``Connection: close``) to write on a socket directly."""
    headers, body = _headers(style, err, close=True, retry=retry)
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _PHRASE.get(status, b"Error"))]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    return b"".join([*lines, b"\r\n", body])


class HostPolicy:
    """Which ``Host`` values name this broker (``http_allowed_hosts``).

    Accepted: an IP address (a DNS rebinding attack needs a name it controls, so an address
    is never one), ``localhost``, the names of ``http_allowed_hosts`` (``*.example.com``: its
    subdomains; ``*``: anything), the name ``http_host`` binds, and, when it binds every
    address, this machine's host name. A request without ``Host`` (HTTP/1.0) is not a
    browser's, and passes. The port is not compared.
    """

    def __init__(self, config: HttpConfig) -> None:
        items = [h.lower().rstrip(".") for h in split_list(config.http_allowed_hosts)]
        self.any = "*" in items
        self.names = {h for h in items if not h.startswith("*")} | {"localhost"}
        self.suffixes = tuple(h[1:] for h in items if h.startswith("*."))
        bind = config.http_host.lower().strip("[]")
        if bind in ("0.0.0.0", "::", ""):
            self.names.add(socket.gethostname().lower())
        elif not _is_address(bind):
            self.names.add(bind)
        self._cache: dict[bytes, bool] = {}

    def allows(self, host: bytes) -> bool:
        """Whether a ``Host`` header value names this broker."""
        verdict = self._cache.get(host)
        if verdict is None:
            verdict = self.any or self._allows(host.decode("latin-1").strip().lower())
            if len(self._cache) >= _HOST_CACHE:
                self._cache.clear()
            self._cache[host] = verdict
        return verdict

    def _allows(self, host: str) -> bool:
        if host.startswith("["):  # [IPv6]:port
            end = host.find("]")
            return end > 0 and _is_address(host[1:end])
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        name = name.rstrip(".")
        if _is_address(name):
            return True
        return name in self.names or name.endswith((*self.suffixes, ".localhost"))


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class OriginPolicy:
    """Which web pages may call the listeners (``http_allowed_origins``): the origins listed,
    pages of the listener's own origin (``same-origin``: the ``Origin``'s host and port are the
    request's ``Host``), or any (``*``)."""

    def __init__(self, config: HttpConfig) -> None:
        items = split_list(config.http_allowed_origins)
        self.any = "*" in items
        self.same_origin = SAME_ORIGIN in items
        self.origins = {o.lower().rstrip("/") for o in items if o not in ("*", SAME_ORIGIN)}

    def allows(self, origin: bytes, host: bytes | None) -> bool:
        """Whether a page of ``origin`` (an ``Origin`` header) may call a listener reached
        by ``host`` (the ``Host`` header)."""
        if self.any:
            return True
        text = origin.decode("latin-1").strip().lower()
        if text in self.origins:
            return True
        if not self.same_origin or host is None:
            return False
        scheme, sep, authority = text.partition("://")
        if not sep:
            return False  # "null": a sandboxed page or a file
        return _authority(scheme, authority) == _authority(
            scheme, host.decode("latin-1").strip().lower()
        )


def _authority(scheme: str, authority: str) -> str:
    """``host:port`` without the scheme's default port."""
    default = {"http": ":80", "https": ":443"}.get(scheme)
    if default and authority.endswith(default):
        return authority[: -len(default)]
    return authority


class Warner:
    """Logs a warning for a kind of refusal at most once per :data:`WARN_EVERY_S`, with how
    many there were since the last one."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> None:
        """Count one refusal of ``kind``; log ``message`` if none was logged lately."""
        count = self._count.get(kind, 0) + 1
        now = time.monotonic()
        if now - self._last.get(kind, -WARN_EVERY_S) < WARN_EVERY_S:
            self._count[kind] = count
            return
        self._last[kind] = now
        self._count[kind] = 0
        log.warning("%s (%d such refusals since this was last logged)", message, count)


class BodyBudget:
    """The bytes of request bodies being received or handled at once, over every listener,
    and their limit (``http_max_inflight_body_bytes``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        #: Logs the refusals of the gateway's listeners (the budget is shared by them).
        self.warner = Warner()

    def take(self, n: int) -> bool:
        """Count ``n`` more bytes if they fit (always for a small body); whether they did."""
        if n > SMALL_BODY_BYTES and self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        """Release ``n`` bytes counted by :meth:`take`."""
        self.used -= n


class _Refused(Exception):
    def __init__(self, status: int, err: tw.TidewireError, *, retry: bool = False) -> None:
        super().__init__(err.message)
        self.status = status
        self.err = err
        self.retry = retry


class RequestGuard:
    """ASGI middleware: the checks of this module, then ``app``.

    Args:
        app: the listener's app.
        policy: what the listener's routes take.
        config: the gateway's settings (limits, allowed hosts and origins).
        budget: the gateway's body budget, shared by its listeners.
    """

    def __init__(
        self, app: ASGIApp, policy: ListenerPolicy, config: HttpConfig, budget: BodyBudget
    ) -> None:
        self.app = app
        self.policy = policy
        self.hosts = HostPolicy(config)
        self.origins = OriginPolicy(config)
        self.budget = budget
        self.max_body = config.http_max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        ctype = length = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                ctype = value
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        method: str = scope.get("method", "GET")
        try:
            refusal = self.screen(scope["headers"], method, websocket=kind == "websocket")
            if refusal is not None:
                raise _Refused(*refusal)
            if kind == "websocket":
                await self.app(scope, receive, send)
                return
            if method in self.policy.json_methods and ctype is not None and not _is_json(ctype):
                raise _Refused(415, _not_json(ctype.decode("latin-1"), method, scope["path"]))
            declared = int(length) if length is not None and length.isdigit() else -1
            if declared > self.max_body:
                raise _Refused(413, self._too_large(declared))
            if declared > 0 and not chunked:
                await self._call_counted(declared, scope, receive, send)
            elif chunked:
                await self._call_chunked(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        except _Refused as refusal:
            await self._refuse(kind, refusal, scope, receive, send)

    def screen(
        self, headers: list[tuple[bytes, bytes]], method: str, *, websocket: bool
    ) -> tuple[int, tw.TidewireError] | None:
        """The status and error refusing a request for its ``Host`` or its origin, or None.
        The protocol calls it for a WebSocket handshake before the upgrade."""
        host = origin = fetch_site = None
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                fetch_site = value
        if host is not None and not self.hosts.allows(host):
            return 421, _wrong_host(host)
        if origin is not None:
            if not self.origins.allows(origin, host):
                return 403, _foreign(origin.decode("latin-1"))
        elif (
            fetch_site in _CROSS
            and not self.origins.any
            and (websocket or method not in _SAFE or not self.policy.safe_gets)
        ):
            return 403, _foreign(None)
        return None

    async def _call_counted(
        self, declared: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        budget = self.budget
        if not budget.take(declared):
            raise _Refused(503, self._no_room(declared), retry=True)
        try:
            await self.app(scope, receive, send)
        finally:
            budget.give(declared)

    async def _call_chunked(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read a chunked body here, within the limit and the budget, then hand it to the
        app: a body of unknown length is only known to fit once it has all come."""
        budget = self.budget
        chunks: list[bytes] = []
        size = 0
        counted = 0
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunk: bytes = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body:
                    raise _Refused(413, self._too_large(None))
                if size > SMALL_BODY_BYTES:
                    if not budget.take(size - counted):
                        raise _Refused(503, self._no_room(None), retry=True)
                    counted = size
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            chunks.clear()
            await self.app(scope, _replay(body, receive), send)
        finally:
            budget.give(counted)

    def _too_large(self, declared: int | None) -> tw.TidewireError:
        if self.policy.style is ErrorStyle.TEXT:  # msgbus' own words
            return tw.BatchTooLargeError(
                f"payload exceeds max payload size of {self.max_body} bytes"
            )
        what = "the request body" if declared is None else f"the request body of {declared:,} bytes"
        return tw.BatchTooLargeError(f"{what} exceeds http_max_body_bytes={self.max_body:,}")

    def _no_room(self, declared: int | None) -> tw.TidewireError:
        what = "a chunked request body" if declared is None else f"a body of {declared:,} bytes"
        err = tw.BackpressureError(
            f"{self.budget.used:,} bytes of request bodies are being received or handled, and "
            f"{what} does not fit in http_max_inflight_body_bytes={self.budget.limit:,}: "
            "retry later"
        )
        self.budget.warner.warn("budget", f"HTTP: {err.message}")
        return err

    async def _refuse(
        self, kind: str, refusal: _Refused, scope: Scope, receive: Receive, send: Send
    ) -> None:
        headers, body = _headers(self.policy.style, refusal.err, close=True, retry=refusal.retry)
        if kind == "websocket":
            message = await receive()  # websocket.connect
            if message["type"] != "websocket.connect":
                return
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})
                return
            start = "websocket.http.response.start"
            body_type = "websocket.http.response.body"
        else:
            start, body_type = "http.response.start", "http.response.body"
        await send({"type": start, "status": refusal.status, "headers": headers})
        await send({"type": body_type, "body": body})


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    """A ``receive`` that gives ``body`` whole, then what ``receive`` gives (a disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _is_json(ctype: bytes) -> bool:
    media = ctype.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def _wrong_host(host: bytes) -> tw.TidewireError:
    return tw.InvalidRequestError(
        f"Host {host.decode('latin-1')[:100]!r} is not a name of this broker "
        "(http_allowed_hosts); a request for another name was sent here"
    )


def _foreign(origin: str | None) -> tw.TidewireError:
    if origin is None:
        return tw.InvalidRequestError(
            "a request from a page of another site (Sec-Fetch-Site) is refused; "
            "see http_allowed_origins"
        )
    return tw.InvalidRequestError(
        f"a request from a page of origin {origin[:100]!r} is refused: not among "
        "http_allowed_origins"
    )


def _not_json(ctype: str, method: str, path: str) -> tw.TidewireError:
    # curl's -d sends a form type: the most common way to meet this answer.
    hint = "; curl -d sends that type, --json sends JSON" if "form-urlencoded" in ctype else ""
    return tw.InvalidRequestError(
        f"{method} {path[:200]} takes a JSON body (Content-Type: application/json), "
        f"not {ctype[:100]!r}{hint}"
    )
