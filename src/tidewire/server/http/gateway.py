"""The HTTP listeners: ASGI apps served by uvicorn inside the broker's own event loop.

One :class:`HttpGateway` runs one uvicorn server per app, each on its own port, all as tasks
of the running loop (the loop that owns the broker; no thread, no second loop). uvicorn
installs no signal handlers here and runs no lifespan: the program that owns the loop (``tidewire
serve``, :class:`~tidewire.embedded.EmbeddedBroker`) decides when to stop, and drains every
listener (:meth:`HttpGateway.close` does it alone; ``tidewire serve`` does it step by step,
with the binary listener, see :mod:`tidewire.server.drain`):

1. :meth:`~HttpGateway.stop_accepting`: the listening sockets close, new connections are
   refused;
2. :meth:`~HttpGateway.begin_drain`: ``closing`` is set, so long-polls answer at once with
   what they have, SSE streams end and WebSocket streams close with 1001 (going away); idle
   keep-alive connections close, the others close after the answer in flight
   (``Connection: close``);
3. :meth:`~HttpGateway.wait_in_flight`: the requests in flight finish, up to a deadline;
4. :meth:`~HttpGateway.finish`: connections still open are aborted (their requests see the
   client gone and end), a request still running :data:`FINAL_CLOSE_S` later is cancelled,
   and the uvicorn servers end.

:meth:`HttpGateway.for_broker` assembles the listeners the configuration asks for: the native
API on ``http_port`` and the compatibility modes on their own ports.

Every connection is served by :class:`~tidewire.server.http.protocol.GuardedProtocol`
(request deadlines, connection caps), and every request of the listeners ``for_broker`` makes
passes :class:`~tidewire.server.http.guard.RequestGuard` first (allowed hosts and origins,
content types, body limits and the gateway's body budget).

TLS (``tls=``): every listener of the gateway speaks HTTPS (and WSS) with the same context.
Each request's and WebSocket's ASGI scope carries ``scope["tidewire.tls"]`` (whether the
connection is TLS) and ``scope["tidewire.cert_principal"]`` (the principal its verified client
certificate names, or None), on plaintext listeners too (False, None).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tidewire._tasks import cancel_and_wait
from tidewire.broker import Broker
from tidewire.errors import InvalidConfigError
from tidewire.security.config import TlsConfig
from tidewire.security.tls import HANDSHAKE_TIMEOUT_S, listener_context
from tidewire.server.http.app import asgi_app, create_app
from tidewire.server.http.config import OFF, HttpConfig
from tidewire.server.http.guard import (
    IPUBSUB_POLICY,
    MSGBUS_POLICY,
    NATIVE_POLICY,
    BodyBudget,
    ErrorStyle,
    ListenerPolicy,
    RequestGuard,
)
from tidewire.server.http.protocol import (
    TLS_STATE,
    ConnectionCaps,
    ListenerLimits,
    guarded_protocol,
)
from tidewire.server.listening import close_listener
from tidewire.server.tls import tls_protocol_factory

__all__ = ["IPUBSUB", "MSGBUS", "NATIVE", "HttpGateway", "TlsScope"]

log = logging.getLogger("tidewire.http")

#: Name of the native API's listener.
NATIVE = "native"
#: Names of the compatibility modes' listeners.
MSGBUS = "msgbus"
IPUBSUB = "ipubsub"
#: Name of the listener of ``metrics_port`` (``GET /metrics`` only).
METRICS = "metrics"
#: How long :meth:`HttpGateway.close` lets requests in flight finish before cancelling them
#: (seconds); long-polls are woken at once, so only real work is waited for.
DEFAULT_GRACE_S = 10.0
#: How long :meth:`HttpGateway.start` waits for one listener to come up (seconds).
START_TIMEOUT_S = 30.0
#: At the end of a drain, how long requests on aborted connections get to notice it before
#: they are cancelled (seconds).
FINAL_CLOSE_S = 1.0
#: How often :meth:`HttpGateway.wait_in_flight` looks whether the connections closed (seconds;
#: uvicorn has no event for it, and polls at 0.1 s itself).
_POLL_S = 0.02
#: Connections speaking HTTP (not upgraded): told to close after their answer in flight.
_HTTP_PROTOCOLS = (HttpToolsProtocol, H11Protocol)

#: Keep-alive connections idle for this long are closed (seconds): long enough for a load
#: generator's or a browser's next request, short enough not to hoard sockets.
KEEP_ALIVE_S = 30

#: An ASGI application.
AsgiApp = Callable[..., Any]


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling (the loop's owner has its own), telling
    when it listens, and whose shutdown leaves the draining to :class:`HttpGateway`."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()
        #: Set by :meth:`HttpGateway.finish`: no connection is left, the server may end.
        self.drained = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    def stop_accepting(self) -> None:
        for server in getattr(self, "servers", ()):
            close_listener(server)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn's own waits out its grace period polling, then cancels what runs with an
        # ERROR and a traceback each; the gateway drains instead (answering long-polls and
        # ending streams at once), and this only ends the server once it has.
        self.stop_accepting()
        for sock in sockets or []:
            sock.close()
        await self.drained.wait()
        for server in getattr(self, "servers", ()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), FINAL_CLOSE_S)
        if not self.force_exit:
            await self.lifespan.shutdown()


class TlsScope:
    """ASGI middleware: sets ``scope["tidewire.tls"]`` and ``scope["tidewire.cert_principal"]``
    from what the connection's protocol left in the scope's ``state`` (see
    :data:`~tidewire.server.http.protocol.TLS_STATE`)."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        state = scope.get("state")
        peer = state.pop(TLS_STATE, None) if state else None
        if peer is None:
            scope["tidewire.tls"], scope["tidewire.cert_principal"] = False, None
        else:
            scope["tidewire.tls"], scope["tidewire.cert_principal"] = peer
        await self.app(scope, receive, send)


class _DropCancelled(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" for a request the drain cancelled
    (the drain reports how many, once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


@dataclass(slots=True)
class _Listener:
    name: str
    app: AsgiApp
    host: str
    port: int  # as configured (0: any free); the bound one once started
    style: ErrorStyle = ErrorStyle.NATIVE  # how refusals by the protocol are worded
    guard: RequestGuard | None = None  # the checks of its requests (policy given)
    server: _Server | None = None
    task: asyncio.Task[None] | None = None


class HttpGateway:
    """HTTP listeners, each an ASGI app on its own port, served in the running event loop.

    Args:
        grace_s: how long :meth:`close` lets requests in flight finish (seconds).
        config: the limits every listener enforces (header and body timeouts, connection
            caps, the body budget, allowed hosts and origins); the defaults when None.
        tls: TLS of every listener (on when ``tls.enabled``), or a server-side SSL context;
            None: plaintext.

    Raises:
        InvalidConfigError: a TLS file cannot be loaded (the message names it).

    Use::

        gateway = HttpGateway.for_broker(broker, config)   # or HttpGateway() + add_app()
        await gateway.start()                              # returns once every port listens
        gateway.port                                       # the native API's bound port
        ...
        await gateway.close()                              # drain, bounded by grace_s
    """

    def __init__(
        self,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        config: HttpConfig | None = None,
        tls: TlsConfig | ssl.SSLContext | None = None,
    ) -> None:
        self.grace_s = grace_s
        self.config = config if config is not None else HttpConfig()
        #: The listeners' SSL context (None: plaintext), and which client certificate field
        #: names a principal.
        self.ssl: ssl.SSLContext | None = None
        self.tls_principal_field = "CN"
        self.require_cert = False  # refused after the handshake (see listener_context)
        if isinstance(tls, ssl.SSLContext):
            self.ssl = tls
        elif tls is not None and tls.enabled:
            self.ssl, self.require_cert = listener_context(tls)
            self.tls_principal_field = tls.tls_principal_field
        #: Connections open per listener and per client address (protocol.py).
        self.caps = ConnectionCaps(
            self.config.http_max_connections, self.config.http_max_connections_per_source
        )
        #: Bytes of request bodies in flight over every listener (guard.py).
        self.budget = BodyBudget(self.config.inflight_body_bytes)
        #: Set when :meth:`close` begins: apps stop long-polls and report not ready.
        self.closing = asyncio.Event()
        #: HTTP connections the drain has shut down (told to close once idle).
        self._told: weakref.WeakSet[Any] = weakref.WeakSet()
        self._listeners: dict[str, _Listener] = {}
        self._started = False

    @classmethod
    def for_broker(
        cls,
        broker: Broker,
        config: HttpConfig,
        *,
        tls: TlsConfig | ssl.SSLContext | None = None,
    ) -> HttpGateway:
        """The listeners ``config`` asks for: the native API (``http_port``) and the
        compatibility modes (``http_msgbus_port``, ``http_ipubsub_port``), all with ``tls``.

        Raises:
            InvalidConfigError: no listener is configured, or one this build lacks, or a
                TLS file cannot be loaded.
        """
        if not config.enabled:
            raise InvalidConfigError("no HTTP listener is configured (http_port = -1)")
        gateway = cls(config=config, tls=tls)
        # /metrics reads the open connections of every HTTP listener at scrape time.
        from tidewire.observability.metrics import metrics_for  # noqa: PLC0415

        metrics_for(broker).http_gateways.add(gateway)
        if config.http_port != OFF:
            app = create_app(broker, config, closing=gateway.closing)
            gateway.add_app(
                NATIVE,
                _gated(asgi_app(app), broker, NATIVE, config),
                config.http_host,
                config.http_port,
                policy=NATIVE_POLICY,
            )
        if config.metrics_port != OFF:
            from tidewire.server.http.metrics_routes import create_metrics_app  # noqa: PLC0415

            gateway.add_app(
                METRICS,
                _gated(create_metrics_app(broker), broker, METRICS, config),
                config.http_host,
                config.metrics_port,
                policy=NATIVE_POLICY,
            )
        # The compatibility modes (docs/http-compat.md), each on its own port.
        if config.http_msgbus_port != OFF:
            from tidewire.server.http.compat.msgbus import create_msgbus_app  # noqa: PLC0415

            msgbus = create_msgbus_app(
                broker,
                max_payload_bytes=min(
                    config.http_msgbus_max_payload_bytes, config.http_max_body_bytes
                ),
                ttl_ms=config.http_msgbus_ttl_ms,
                closing=gateway.closing,
            )
            gateway.add_app(
                MSGBUS,
                _gated(msgbus, broker, MSGBUS, config),
                config.http_host,
                config.http_msgbus_port,
                policy=MSGBUS_POLICY,
            )
        if config.http_ipubsub_port != OFF:
            from tidewire.server.http.compat.ipubsub import create_ipubsub_app  # noqa: PLC0415

            ipubsub = create_ipubsub_app(
                broker, max_body_bytes=config.http_max_body_bytes, closing=gateway.closing
            )
            gateway.add_app(
                IPUBSUB,
                _gated(ipubsub, broker, IPUBSUB, config),
                config.http_host,
                config.http_ipubsub_port,
                policy=IPUBSUB_POLICY,
            )
        return gateway

    def add_app(
        self,
        name: str,
        app: AsgiApp,
        host: str,
        port: int,
        *,
        policy: ListenerPolicy | None = None,
    ) -> None:
        """Serve ``app`` on ``host:port`` (``port`` 0: any free port; see :meth:`port_of`).
        Must be called before :meth:`start`. With ``policy``, every request passes the
        checks of :class:`~tidewire.server.http.guard.RequestGuard` first (allowed hosts and
        origins, content types, body limits); every connection is under the protocol's
        timeouts and caps in any case.

        Raises:
            ValueError: ``name`` is taken.
            RuntimeError: the gateway has started.
        """
        if self._started:
            raise RuntimeError("add_app() after start()")
        if name in self._listeners:
            raise ValueError(f"an HTTP listener named {name!r} exists already")
        if policy is None:
            self._listeners[name] = _Listener(name, app, host, port)
            return
        guard = RequestGuard(app, policy, self.config, self.budget)
        self._listeners[name] = _Listener(name, guard, host, port, policy.style, guard)

    @property
    def names(self) -> list[str]:
        """The listeners' names, in the order they were added."""
        return list(self._listeners)

    def port_of(self, name: str) -> int:
        """The port listener ``name`` is bound to (once started; before, as configured).

        Raises:
            KeyError: no such listener.
        """
        return self._listeners[name].port

    def host_of(self, name: str) -> str:
        """The address listener ``name`` binds."""
        return self._listeners[name].host

    @property
    def port(self) -> int:
        """The native API's bound port.

        Raises:
            KeyError: the native API is not served.
        """
        return self.port_of(NATIVE)

    async def start(self) -> None:
        """Bind every listener and start serving; return once all of them listen.

        Raises:
            OSError: a port could not be bound (nothing is left listening).
        """
        if self._started:
            raise RuntimeError("the HTTP gateway was started already")
        self._started = True
        try:
            for listener in self._listeners.values():
                await self._start_one(listener)
        except BaseException:
            await self.close()
            raise

    def _protocol(self, listener: _Listener) -> Any:
        """The protocol (factory) of ``listener``'s connections, under TLS if configured
        (see :mod:`tidewire.server.tls`)."""
        protocol = guarded_protocol(
            ListenerLimits.of(
                listener.name,
                listener.style,
                self.caps,
                self.config,
                None if listener.guard is None else listener.guard.screen,
            ),
            self.tls_principal_field,
            require_cert=self.require_cert,
        )
        if self.ssl is None:
            return protocol
        return tls_protocol_factory(protocol, self.ssl, handshake_timeout_s=HANDSHAKE_TIMEOUT_S)

    async def _start_one(self, listener: _Listener) -> None:
        try:
            sock = _bind(listener.host, listener.port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"HTTP {listener.name}: cannot listen on {listener.host}:{listener.port}: "
                f"{exc.strerror}",
            ) from None
        listener.port = sock.getsockname()[1]
        config = uvicorn.Config(
            TlsScope(listener.app),
            loop="none",  # the broker's loop, already running
            lifespan="off",  # the broker's lifecycle is the owner's, not the app's
            # httptools, one send() per answer (coalesce.py), with request deadlines and
            # connection caps (protocol.py)
            http=self._protocol(listener),
            ws="auto",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,  # X-Forwarded-* are not interpreted: no rewriting layer
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=max(int(self.grace_s), 1),
        )
        server = _Server(config)
        listener.server = server
        task = asyncio.get_running_loop().create_task(
            server.serve(sockets=[sock]), name=f"http listener {listener.name}"
        )
        listener.task = task
        task.add_done_callback(_log_failure)
        ready = asyncio.get_running_loop().create_task(server.ready.wait())
        try:
            await asyncio.wait(
                {ready, task}, timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
        finally:
            await cancel_and_wait(ready)
        if not server.ready.is_set():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise OSError(f"HTTP listener {listener.name} failed: {task.exception()}")
            raise OSError(f"HTTP listener {listener.name} did not start in {START_TIMEOUT_S} s")
        log.info(
            "HTTP %s listening on %s:%d%s",
            listener.name,
            listener.host,
            listener.port,
            " (TLS)" if self.ssl is not None else "",
        )

    # --- draining (see the module docstring) ------------------------------------------------------

    def _servers(self) -> list[_Server]:
        return [li.server for li in self._listeners.values() if li.server is not None]

    def stop_accepting(self) -> None:
        """Close every listening socket now: new connections are refused from here on."""
        for server in self._servers():
            server.stop_accepting()

    def connections(self) -> int:
        """Open connections, on every listener."""
        return sum(len(s.server_state.connections) for s in self._servers())

    def in_flight(self) -> int:
        """Requests (and WebSocket sessions) running, on every listener."""
        return sum(len(s.server_state.tasks) for s in self._servers())

    def begin_drain(self) -> None:
        """Set ``closing`` (long-polls answer, streams end), close idle keep-alive
        connections and mark the others to close after their answer."""
        self.closing.set()
        for server in self._servers():
            server.should_exit = True
        self._shut_down_new()

    def _shut_down_new(self) -> None:
        """Close the idle HTTP connections not told yet, and mark the busy ones to close after
        their answer: at the drain's start, and for a connection the loop accepted just
        before the listener stopped, which joins its server a step later (see
        :mod:`tidewire.server.listening`)."""
        for server in self._servers():
            for conn in list(server.server_state.connections):
                # A WebSocket is closed by its session, with 1001 (going away); uvicorn's
                # shutdown() would close it with 1012 first.
                if isinstance(conn, _HTTP_PROTOCOLS) and conn not in self._told:
                    self._told.add(conn)
                    conn.shutdown()

    async def wait_in_flight(self, deadline: float) -> int:
        """Wait until every connection has closed, or the loop time ``deadline``; return how
        many requests still run."""
        loop = asyncio.get_running_loop()
        while True:
            self._shut_down_new()
            tasks = {t for s in self._servers() for t in s.server_state.tasks}
            left = deadline - loop.time()
            if (not tasks and not self.connections()) or left <= 0:
                return len(tasks)
            if tasks:
                await asyncio.wait(tasks, timeout=min(left, _POLL_S))
            else:
                await asyncio.sleep(min(left, _POLL_S))

    async def finish(self) -> int:
        """End the drain: abort the connections still open, cancel a request still running
        :data:`FINAL_CLOSE_S` later, end the servers. Return how many requests were cut."""
        self.closing.set()
        cut = 0
        for server in self._servers():
            for conn in list(server.server_state.connections):
                cut += 1
                conn.transport.abort()
        tasks = {t for s in self._servers() for t in s.server_state.tasks}
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=FINAL_CLOSE_S)
            if pending:
                log.warning(
                    "cancelling %d HTTP request(s) still running after the drain", len(pending)
                )
                quiet = _DropCancelled()
                uvicorn_log = logging.getLogger("uvicorn.error")
                uvicorn_log.addFilter(quiet)
                try:
                    for t in pending:
                        t.cancel()
                    await asyncio.wait(pending)
                finally:
                    uvicorn_log.removeFilter(quiet)
        for server in self._servers():
            server.should_exit = True
            server.drained.set()
        for listener in self._listeners.values():
            task, listener.task = listener.task, None
            if task is None:
                continue
            try:
                await asyncio.wait_for(asyncio.shield(task), FINAL_CLOSE_S + 1.0)
            except TimeoutError:
                await cancel_and_wait(task)
            except Exception as exc:  # already logged by _log_failure
                log.debug("HTTP listener %s ended with %r", listener.name, exc)
        return cut

    async def close(self) -> None:
        """Drain every listener: stop accepting, close idle connections, answer long-polls
        and end streams, let requests in flight finish (up to ``grace_s``), then cut what
        is left."""
        deadline = asyncio.get_running_loop().time() + self.grace_s
        self.stop_accepting()
        self.begin_drain()
        await self.wait_in_flight(deadline)
        await self.finish()

    async def __aenter__(self) -> HttpGateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _gated(app: AsgiApp, broker: Broker, name: str, config: HttpConfig) -> AsgiApp:
    """``app`` behind the gate, with the route table of listener ``name``."""
    from tidewire.server.http.auth import ROUTE_NEEDS, HttpAuth  # noqa: PLC0415
    from tidewire.server.http.metrics_routes import HttpMetrics  # noqa: PLC0415

    gated = HttpAuth(
        app,
        broker,
        ROUTE_NEEDS[name],
        max_body_bytes=config.http_max_body_bytes,
        session_idle_ms=config.http_session_idle_ms,
        max_sessions=config.http_max_sessions,
    )
    return HttpMetrics(gated, broker, "http" if name == NATIVE else f"http-{name}")


def _bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv6 when ``host`` is).

    Made with ``IPPROTO_TCP`` explicitly: asyncio sets TCP_NODELAY only on sockets whose
    protocol says TCP, and without it every answer written in two parts (headers, body)
    waits out the peer's delayed ACK, about 40 ms.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("HTTP listener task %s failed", task.get_name(), exc_info=task.exception())
