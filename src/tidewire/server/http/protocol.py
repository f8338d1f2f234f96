"""The listeners' HTTP protocol: uvicorn's httptools protocol (with coalesced writes) that
times out slow requests and caps connections.

uvicorn closes idle keep-alive connections, but waits for ever for a request that has
begun: a client sending its headers a byte at a time ("slowloris"), or not at all after
connecting, holds its connection and descriptor for good; and it accepts every connection
it is offered. :class:`GuardedProtocol` adds, per connection:

- a **header deadline**: a request's line and headers must arrive within
  ``http_header_timeout_ms`` of its first byte (of the connection's opening, for the first
  request). Past it the connection is closed: silently if nothing came at all, after a 408
  answer if part of a request did;
- a **body timeout**: while a body is being read, the client may be silent for at most
  ``http_body_timeout_ms`` (time the broker itself stops reading, as a handler that has not
  asked for more yet, is not counted); then 408 and close;
- a **header size limit** of :data:`MAX_HEAD_BYTES` (431 beyond it);
- **connection caps** (:class:`ConnectionCaps`): ``http_max_connections`` per listener and
  ``http_max_connections_per_source`` per client address over every listener. A connection
  beyond a cap is answered 503 with ``Retry-After`` at once and closed; it never reaches
  uvicorn. WebSocket connections upgraded from a request keep their place until they close.

:func:`guarded_protocol` makes the protocol class of one listener (uvicorn's
``Config(http=...)`` takes a class).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tidewire import errors as tw
from tidewire.security.tls import CERT_REQUIRED_MESSAGE, peer_of
from tidewire.server.http.coalesce import CoalescingProtocol
from tidewire.server.http.config import HttpConfig
from tidewire.server.http.guard import ErrorStyle, Warner, raw_response

__all__ = [
    "MAX_HEAD_BYTES",
    "TLS_STATE",
    "ConnectionCaps",
    "GuardedProtocol",
    "ListenerLimits",
    "guarded_protocol",
]

#: The longest request line and headers together (bytes): browsers send 1 to 8 KiB, the
#: usual server limits are 8 to 64 KiB; past it a client only makes the broker buffer.
MAX_HEAD_BYTES = 64 * 1024
#: How long a connection refused by a cap is kept to read the client's request after the
#: 503 (seconds): closing at once, with the request unread, would reset the connection and
#: the client could lose the answer.
LINGER_S = 1.0
#: Refused connections lingering at once at most; beyond, they are closed at once (a flood
#: must not hold descriptors for the linger).
MAX_LINGERING = 64

#: Key of a TLS connection's ``(True, principal)`` in the ASGI ``state`` uvicorn copies into
#: each request's scope; :class:`~tidewire.server.http.gateway.TlsScope` moves it to the
#: scope's ``tidewire.tls`` and ``tidewire.cert_principal``.
TLS_STATE = "tidewire.tls_peer"

# Where a connection is in its current request.
_NEW = 0  # opened, nothing received
_HEAD = 1  # request line and headers arriving
_BODY = 2  # headers complete, body arriving
_DONE = 3  # request complete (handled, or waiting for the next one: uvicorn's keep-alive)
_UPGRADED = 4  # a WebSocket now


@dataclass(slots=True)
class ConnectionCaps:
    """Connections open per listener and per client address (over every listener), and
    their caps.

    Args:
        per_listener: ``http_max_connections``.
        per_source: ``http_max_connections_per_source``.
    """

    per_listener: int
    per_source: int
    listeners: dict[str, int] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)
    lingering: int = 0
    warner: Warner = field(default_factory=Warner)

    def open(self, listener: str, source: str) -> str | None:
        """Count a new connection; or, beyond a cap, say why not (counting nothing)."""
        on_listener = self.listeners.get(listener, 0)
        if on_listener >= self.per_listener:
            return (
                f"{on_listener:,} connections are open on the HTTP {listener} listener, "
                f"the most allowed (http_max_connections={self.per_listener:,}): retry later"
            )
        from_source = self.sources.get(source, 0)
        if from_source >= self.per_source:
            return (
                f"{from_source:,} connections are open from {source}, the most allowed "
                f"(http_max_connections_per_source={self.per_source:,}): retry later"
            )
        self.listeners[listener] = on_listener + 1
        self.sources[source] = from_source + 1
        return None

    def close(self, listener: str, source: str) -> None:
        """Forget a connection counted by :meth:`open`."""
        self.listeners[listener] -= 1
        left = self.sources[source] - 1
        if left:
            self.sources[source] = left
        else:
            del self.sources[source]


#: Decides whether a WebSocket handshake (its headers and method) is refused.
Screen = Callable[..., "tuple[int, tw.TidewireError] | None"]


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """What one listener's protocol enforces.

    Attributes:
        name: the listener's name.
        style: how its errors are worded.
        caps: the gateway's connection caps (shared by its listeners).
        header_timeout_s: ``http_header_timeout_ms`` in seconds.
        body_timeout_s: ``http_body_timeout_ms`` in seconds.
        screen: refuses a WebSocket handshake before the upgrade (with the status and the
            error to answer), as :meth:`~tidewire.server.http.guard.RequestGuard.screen`;
            None: every handshake goes to the app.
    """

    name: str
    style: ErrorStyle
    caps: ConnectionCaps
    header_timeout_s: float
    body_timeout_s: float
    screen: Screen | None = None

    @classmethod
    def of(
        cls,
        name: str,
        style: ErrorStyle,
        caps: ConnectionCaps,
        config: HttpConfig,
        screen: Screen | None = None,
    ) -> ListenerLimits:
        """The limits of listener ``name`` under ``config``."""
        return cls(
            name,
            style,
            caps,
            config.http_header_timeout_ms / 1000,
            config.http_body_timeout_ms / 1000,
            screen,
        )


def guarded_protocol(
    limits: ListenerLimits, principal_field: str = "CN", *, require_cert: bool = False
) -> type[GuardedProtocol]:
    """The protocol class of one listener (for ``uvicorn.Config(http=...)``);
    ``principal_field`` (``CN`` or ``DN``) names the principal of a verified client
    certificate on a TLS listener; ``require_cert``: a TLS connection without one is
    answered 401 and closed (see :func:`~tidewire.security.tls.listener_context`)."""

    class ListenerProtocol(GuardedProtocol):
        pass

    ListenerProtocol.limits = limits
    ListenerProtocol.principal_field = principal_field
    ListenerProtocol.require_cert = require_cert
    return ListenerProtocol


class _HeadTooLarge(Exception):
    pass


class GuardedProtocol(CoalescingProtocol):
    """:class:`~tidewire.server.http.coalesce.CoalescingProtocol` with deadlines and caps
    (see the module's docstring). Made per listener by :func:`guarded_protocol`."""

    limits: ClassVar[ListenerLimits]
    principal_field: ClassVar[str] = "CN"
    require_cert: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _NEW
        self._since = 0.0  # loop time the current deadline counts from
        self._timer: asyncio.TimerHandle | None = None
        self._source: str | None = None  # the cap's place this connection holds
        self._head_bytes = 0
        self._head_too_large = False
        self._refused: asyncio.Transport | None = None  # a refused connection's
        self._lingering = False  # whether it counts in ConnectionCaps.lingering

    # --- opening and closing ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self.limits
        tls = peer_of(transport, self.principal_field)
        if self.require_cert and not tls.certified:  # see listener_context
            err = tw.AuthenticationFailedError(CERT_REQUIRED_MESSAGE)
            self._refuse(transport, err, 401, retry=False)
            return
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        why = limits.caps.open(limits.name, source)
        if why is not None:
            limits.caps.warner.warn("connections", f"HTTP: a connection refused: {why}")
            self._refuse(transport, tw.BackpressureError(why), 503, retry=True)
            return
        self._source = source
        if tls.tls:  # this connection's requests (and WebSocket) see it in their scope's state
            self.app_state = {**self.app_state, TLS_STATE: (True, tls.principal)}
        super().connection_made(transport)
        self._since = self.loop.time()
        self._arm(limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused is not None:
            self._refused = None
            if self._lingering:
                self._lingering = False
                self.limits.caps.lingering -= 1
            self._disarm()
            return
        self._disarm()
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            self.limits.caps.close(self.limits.name, source)

    def _refuse(
        self, transport: asyncio.Transport, err: tw.TidewireError, status: int, *, retry: bool
    ) -> None:
        """Answer ``status`` and close; read (and drop) what the client sends meanwhile, up
        to :data:`LINGER_S`, so that its request does not reset the connection under the
        answer."""
        caps = self.limits.caps
        self._refused = transport
        transport.write(raw_response(self.limits.style, status, err, retry=retry))
        if caps.lingering >= MAX_LINGERING:
            transport.close()
            return
        caps.lingering += 1
        self._lingering = True
        if transport.can_write_eof():  # not over TLS, which has no half close
            transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, transport.close)

    def eof_received(self) -> None:
        if self._refused is not None:
            self._refused.close()
            return
        super().eof_received()

    # --- reading ---------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return  # dropped: the connection was answered 503
        super().data_received(data)
        if (
            self._timer is None
            and self._phase in (_HEAD, _BODY)
            and not self.transport.is_closing()
        ):
            self._arm(
                self.limits.header_timeout_s if self._phase == _HEAD else self.limits.body_timeout_s
            )

    def on_message_begin(self) -> None:
        if self._phase != _NEW:  # the first request's deadline counts from the opening
            self._since = self.loop.time()
        self._phase = _HEAD
        self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise _HeadTooLarge  # stops the parser: uvicorn answers through send_400_response

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        err = tw.InvalidRequestError(
            f"the request line and headers exceed {MAX_HEAD_BYTES:,} bytes"
        )
        self.transport.write(raw_response(self.limits.style, 431, err, retry=False))
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._phase = _BODY
        self._since = self.loop.time()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._since = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._phase = _DONE
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._disarm()
        self._phase = _UPGRADED
        screen = self.limits.screen
        refusal = None if screen is None else screen(self.headers, "GET", websocket=True)
        if refusal is not None:
            # Refused here rather than by the app: uvicorn's WebSocket protocol logs an
            # error for every handshake an app denies with an HTTP answer.
            status, err = refusal
            self.transport.write(raw_response(self.limits.style, status, err, retry=False))
            self.transport.close()
            return
        super().handle_websocket_upgrade()
        # The WebSocket protocol owns the connection now: it gives the cap's place back
        # when the connection ends.
        ws = self.transport.get_protocol()
        source, self._source = self._source, None
        if source is None or ws is self:
            self._source = source
            return
        caps, name = self.limits.caps, self.limits.name
        lost = ws.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            caps.close(name, source)
            lost(exc)

        ws.connection_lost = connection_lost  # type: ignore[method-assign]

    # --- the deadline ----------------------------------------------------------------------------

    def _arm(self, timeout_s: float) -> None:
        delay = max(self._since + timeout_s - self.loop.time(), 0.0)
        self._timer = self.loop.call_later(delay, self._on_deadline)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_deadline(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        limits = self.limits
        now = self.loop.time()
        if self._phase in (_NEW, _HEAD):
            if now < self._since + limits.header_timeout_s:
                self._arm(limits.header_timeout_s)
                return
            self._time_out(
                f"the request's line and headers did not arrive within "
                f"http_header_timeout_ms={round(limits.header_timeout_s * 1000):,}",
                answer=self._phase == _HEAD,
            )
        elif self._phase == _BODY:
            if self.flow.read_paused:  # the broker is not reading: not the client's delay
                self._since = now
            if now < self._since + limits.body_timeout_s:
                self._arm(limits.body_timeout_s)
                return
            self._time_out(
                f"the request body stopped arriving for http_body_timeout_ms="
                f"{round(limits.body_timeout_s * 1000):,}",
                answer=True,
            )

    def _time_out(self, why: str, *, answer: bool) -> None:
        cycle = self.cycle  # in _HEAD: the request before (if any); in _BODY: this one
        if self._phase == _HEAD and cycle is not None and not cycle.response_complete:
            # A pipelined request is late while the one before is still being handled: let
            # that one be answered, then close (uvicorn closes after an answer without
            # keep-alive).
            cycle.keep_alive = False
            self.flow.pause_reading()
            return
        if answer and (self._phase == _HEAD or cycle is None or not cycle.response_started):
            err = tw.RequestTimedOutError(why)
            self.transport.write(raw_response(self.limits.style, 408, err, retry=False))
        self.transport.close()
