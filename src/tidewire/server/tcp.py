"""The TCP listener of the binary protocol: sockets in, broker calls, sockets out.

One :class:`TcpServer` accepts connections; each connection drives a sans-IO
:class:`~tidewire.protocol.Connection` and runs one task per request (requests on one
connection are answered in any order, matched by correlation id), except on a single node
with no principal and no tracing: the common produce request is appended in the read callback
and answered from the step that settles it (``_produce_now``), a fetch with data there is
answered in the read callback (``_fetch_now``), and a caught-up reader's long-poll waits on
the partitions' wake-ups as a callback (``_park_fetch``). Bounds:

- ``max_connections``: beyond it a new connection is closed at once. Each connection holds a
  descriptor: at start the server checks that ``max_connections``, the broker's log files
  (``max_open_files``) and :data:`RESERVED_DESCRIPTORS` fit under the descriptor limit. A
  ``max_connections`` left at its default is lowered to fit (with a warning); one set
  explicitly above it is refused, naming the numbers;
- the connection's ``max_in_flight``: beyond it the socket is not read until a response is
  sent, so a client that pipelines without limit fills only its own buffers;
- ``max_unsent_bytes``: the answers a connection's fetches may hold, written but not yet taken
  by the client, plus those being read for it (each counted at its ``max_bytes``, capped by
  the broker's ``fetch_max_bytes``); a fetch that would pass it waits until the client has
  taken enough, and meanwhile (the write buffer being full) nothing more is read from it, as
  push subscriptions wait for credit. So a client that pipelines big fetches and never reads
  the answers costs the broker about this much, not its in-flight count times the answers;
- ``max_frame_bytes``: a longer frame closes that connection (with an error frame);
- ``idle_timeout_s``: a connection that sends nothing for that long is closed;
- ``max_subscriptions``: push subscriptions one connection may hold (see ``push.py``); a
  subscription never sends more than its credit and waits while the write buffer is full;
- ``frame_timeout_s``: a frame begun but not finished within that long closes the connection;
  a connection being closed whose peer has not taken what is left to send (its answers, the
  error frame) within that long is reset, since a peer that never reads would otherwise keep
  it, and the bytes waiting for it, for ever.

A malformed frame gets an error frame and closes that connection only.

Draining (:meth:`TcpServer.stop_accepting`, :meth:`TcpServer.begin_drain`,
:meth:`TcpServer.wait_in_flight`, :meth:`TcpServer.finish`; :meth:`TcpServer.close` does all
four): the listening socket is closed first, so new connections are refused at once; push
subscriptions end; a connection with nothing in flight gets a ``ShuttingDownError`` error frame
and is closed; on the others every new request is answered with ``ShuttingDownError``
(retriable: nothing of it was done) and the requests in flight finish, up to a grace period,
after which they are cancelled; each connection says goodbye the same way once its last
answer is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import math
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar, cast

import msgspec

from tidewire import _step
from tidewire.broker import Broker, FetchResult
from tidewire.broker.core import DEFAULT_FETCH_MAX_BYTES, ParkedFetch
from tidewire.errors import (
    AuthenticationFailedError,
    InvalidConfigError,
    ProtocolError,
    ShuttingDownError,
    TidewireError,
    UnknownApiError,
    UnknownError,
)
from tidewire.observability import logs, tracing
from tidewire.observability.metrics import metrics_for
from tidewire.protocol import (
    NEED_DATA,
    PAUSED,
    Connection,
    ConnectionClosed,
    RequestReceived,
    RequestRejected,
    Role,
)
from tidewire.protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    Buffer,
    BufferedFrameDecoder,
    FramePool,
)
from tidewire.protocol.messages import (
    ApiKey,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    SubscribeResponse,
    WhoAmIResponse,
)
from tidewire.security.config import TlsConfig
from tidewire.security.tls import (
    CERT_REQUIRED_MESSAGE,
    HANDSHAKE_TIMEOUT_S,
    listener_context,
    peer_of,
)
from tidewire.server.envelope import serve_envelope
from tidewire.server.gate import SESSION_APIS, Session, gate_for, source_of
from tidewire.server.handlers import (
    HANDLERS,
    ServerInfo,
    fetch,
    fetch_answer,
    fetch_now,
    produce,
    produce_soon,
)
from tidewire.server.listening import close_listener
from tidewire.server.needs import API_NEEDS
from tidewire.server.push import MAX_SUBSCRIPTIONS, PUSH_APIS, Subscriptions
from tidewire.server.queue_handlers import QUEUE_APIS, QueueSession
from tidewire.server.tls import tls_protocol_factory

__all__ = ["EVENT_LOOPS", "ServerConfig", "TcpServer", "loop_factory"]

#: A request body, as a fast path takes it (:meth:`_ClientProtocol._inline`).
_Body = TypeVar("_Body")

log = logging.getLogger("tidewire.server")
#: Numbers the connections of the process, for log lines.
_CONNECTION_IDS = itertools.count(1)

#: API key -> name, the label of request metrics.
_API_NAMES = {int(k): k.name for k in ApiKey}
#: API key -> member: a lookup, not an enum call, once a request.
_API_KEYS = {int(k): k for k in ApiKey}
_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)

#: The event loops ``tidewire serve`` can run on.
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(event_loop: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The name and the factory of the event loop ``event_loop`` asks for: ``auto`` takes
    uvloop when it is installed (a loop written in C over libuv: less CPU per socket
    operation), else asyncio's own.

    Raises:
        InvalidConfigError: ``uvloop`` asked for and not installed, or an unknown name.
    """
    if event_loop not in EVENT_LOOPS:
        raise InvalidConfigError(f"event_loop={event_loop!r}: one of {', '.join(EVENT_LOOPS)}")
    if event_loop != "asyncio":
        try:
            import uvloop  # noqa: PLC0415 (optional: not on every platform)
        except ImportError:
            if event_loop == "uvloop":
                raise InvalidConfigError("event_loop=uvloop but uvloop is not installed") from None
        else:
            return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


#: The default of max_connections.
DEFAULT_MAX_CONNECTIONS = 10_000
#: Descriptors kept for what is neither a client connection nor a log file: the standard
#: streams, the event loop, listening sockets, checkpoint and index files being written,
#: worker threads' files, the HTTP gateway's own connections beyond a handful (see http.md).
RESERVED_DESCRIPTORS = 64
#: Bytes of each connection's buffer for frame headers and small requests (read into by the
#: socket): a frame this large or larger (a produce request's batches) is read straight into
#: a buffer of its own exact size instead (from the server's :class:`FramePool`), never
#: joined from pieces. Small, as every connection holds one.
READ_HEAD_BYTES = 16 * 1024

#: How early a connection's timer may fire and still count as its deadline (seconds):
#: uvloop's timers have a resolution of a millisecond.
_TIMER_SLACK_S = 0.001
#: SO_LINGER on, with a timeout of 0: closing the socket sends a RST and drops what is unsent.
_LINGER_OFF = struct.pack("ii", 1, 0)
#: The default of :attr:`ServerConfig.drain_timeout_s` (seconds): long-polls and streams are
#: answered at once when a drain begins, so this bounds only real work (a produce waiting on
#: its fsync, a large fetch being written to a slow reader).
DEFAULT_DRAIN_TIMEOUT_S = 10.0
#: At the end of a drain, how long connections told to go away may take to send what is left
#: before they are reset (seconds): their answers are written already, this is the kernel
#: handing them over.
FINAL_CLOSE_S = 1.0


#: Addresses that bind every interface: never one a client can be sent to.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})

_GOING_AWAY = "the broker is shutting down; retry on another broker or once it is back"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Listener settings (see the module docstring for what each bound does), validated on
    construction.

    Raises:
        InvalidConfigError: a value out of its range.
    """

    host: str = "127.0.0.1"
    port: int = 7400
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = 256
    idle_timeout_s: float = 600.0
    frame_timeout_s: float = 30.0
    max_subscriptions: int = MAX_SUBSCRIPTIONS
    #: Per connection: bytes of fetch answers unsent or being read (see the module docstring).
    #: Four answers of the default fetch_max_bytes: enough to keep a reading client's pipe full.
    max_unsent_bytes: int = 4 * DEFAULT_FETCH_MAX_BYTES
    #: ``auto``: uvloop when it is installed, else asyncio's own loop; or ``asyncio``, ``uvloop``.
    event_loop: str = "auto"
    #: How long a drain (SIGTERM) lets requests in flight finish before cutting them (s;
    #: 0: at once). Every listener of the process drains within the same period.
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    #: ``tidewire serve``'s log lines: ``text`` or ``json`` (one object per line), from
    #: ``log_level`` up (docs/observability.md).
    log_format: str = "text"
    log_level: str = "INFO"
    #: Export traces through OpenTelemetry's SDK (the ``otel`` extra) to ``otlp_endpoint``
    #: (else to OTEL_EXPORTER_OTLP_ENDPOINT); also on when OTEL_* variables ask for it.
    tracing_enabled: bool = False
    otlp_endpoint: str = ""
    #: Kafka's wire protocol (server/kafka/): its port (-1: off, 0: any free), the address
    #: it binds ("": ``host``'s), and the address Metadata tells clients to connect to
    #: ("": the bound address, or this machine's name when that is a wildcard; 0: the
    #: bound port). The other bounds above apply to its connections too.
    kafka_port: int = -1
    kafka_host: str = ""
    kafka_advertised_host: str = ""
    kafka_advertised_port: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise InvalidConfigError(what)

        need(bool(self.host), "host must not be empty")
        need(
            self.event_loop in EVENT_LOOPS,
            f"event_loop={self.event_loop!r} must be one of {', '.join(EVENT_LOOPS)}",
        )
        need(0 <= self.port <= 65535, f"port={self.port} must be within 0..65535 (0: any free)")
        need(
            -1 <= self.kafka_port <= 65535,
            f"kafka_port={self.kafka_port} must be within -1..65535 (-1: off, 0: any free)",
        )
        need(
            0 <= self.kafka_advertised_port <= 65535,
            f"kafka_advertised_port={self.kafka_advertised_port} must be within 0..65535 "
            "(0: the port it binds)",
        )
        need(
            self.kafka_advertised_host.strip() not in _WILDCARDS - {""},
            f"kafka_advertised_host={self.kafka_advertised_host!r} is not an address a "
            "client can connect to: give this machine's name or address",
        )
        need(self.max_connections >= 1, f"max_connections={self.max_connections} must be >= 1")
        # frame_length is an int32; below 1 KiB not even an admin request fits.
        need(
            1024 <= self.max_frame_bytes <= 2**31 - 1,
            f"max_frame_bytes={self.max_frame_bytes:,} must be within 1,024..2,147,483,647",
        )
        need(self.max_in_flight >= 1, f"max_in_flight={self.max_in_flight} must be >= 1")
        need(
            self.max_unsent_bytes >= 1024,
            f"max_unsent_bytes={self.max_unsent_bytes:,} must be >= 1,024",
        )
        need(
            self.max_subscriptions >= 0,
            f"max_subscriptions={self.max_subscriptions} must be >= 0",
        )
        for name in ("idle_timeout_s", "frame_timeout_s"):
            value = getattr(self, name)
            need(
                math.isfinite(value) and value > 0,
                f"{name}={value} must be a number of seconds > 0",
            )
        need(
            self.log_format in logs.FORMATS,
            f"log_format={self.log_format!r} must be one of {', '.join(logs.FORMATS)}",
        )
        need(
            self.log_level.upper() in logs.LEVELS[:-1],
            f"log_level={self.log_level!r} must be one of {', '.join(logs.LEVELS[:-1])}",
        )
        need(
            not self.otlp_endpoint or self.otlp_endpoint.startswith(("http://", "https://")),
            f"otlp_endpoint={self.otlp_endpoint!r} must be an http:// or https:// URL",
        )
        need(
            math.isfinite(self.drain_timeout_s) and 0 <= self.drain_timeout_s <= 3600,
            f"drain_timeout_s={self.drain_timeout_s} must be a number of seconds within 0..3600",
        )


class _ClientProtocol(asyncio.BufferedProtocol):
    """One client connection. The socket is read straight into its decoder's buffers
    (``get_buffer`` / ``buffer_updated``), plain or under TLS alike."""

    def __init__(self, server: TcpServer) -> None:
        self.server = server
        #: The connection's id in log lines (``connection_id``).
        self.log_id = f"c{next(_CONNECTION_IDS)}"
        cfg = server.config
        self.decoder = BufferedFrameDecoder(
            max_frame_bytes=cfg.max_frame_bytes, head_bytes=READ_HEAD_BYTES, pool=server.frame_pool
        )
        self.conn = Connection(
            Role.SERVER,
            max_frame_bytes=cfg.max_frame_bytes,
            max_in_flight=cfg.max_in_flight,
            decoder=self.decoder,
        )
        #: Where bytes go that are read and dropped (a refused or failed connection), and
        #: whether the last get_buffer handed it out.
        self._sink: bytearray | None = None
        self._sinking = False
        self.transport: asyncio.Transport | None = None
        #: Produce answers held to go out together (:meth:`_write_held`, :meth:`send_held`).
        self._held: list[Buffer] = []
        #: Whether the connection is TLS, and the principal its verified client certificate
        #: names (``tls_principal_field``; None: no certificate, or no TLS).
        self.tls = False
        self.cert_principal: str | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        #: Produce requests handled without a task (:meth:`_produce_now`) still unanswered.
        self.inline = 0
        #: Long-poll fetches waiting without a task (:meth:`_park_fetch`).
        self.parked: set[ParkedFetch] = set()
        #: Produce requests given a task that has not yet run: until they have appended, no
        #: later produce may take the path without a task (it would be appended first).
        self._produce_tasks = 0
        self.paused = False  # reading paused: max_in_flight requests await their answer
        self.write_paused = False  # reading paused: the client does not read its answers
        self.closing = False
        #: The connection's one timeout timer (see :meth:`_arm_timer`), the loop time it is
        #: set for, the deadline it stands for now, and whether that is a frame's.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline = 0.0
        self._deadline_midframe = False
        self._frame_started: float | None = None  # loop time the pending frame began
        #: The loop the connection runs on (asked once: each ``get_running_loop`` costs a
        #: ``getpid`` system call in CPython 3.11).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._reset_timer: asyncio.TimerHandle | None = None  # armed once closing
        self._lost = False
        self._refused = False  # refused after the TLS handshake: nothing is read
        #: Why the broker closed the connection (metrics); None: the peer closed it.
        self.close_reason: str | None = None
        self._counted = False  # counted as accepted (its close is counted too)
        #: Bytes of fetch answers being read (counted at their most), under max_unsent_bytes
        #: together with the write buffer; fetches wait on ``_output_waiters`` beyond it.
        self.reserved = 0
        self._output_waiters: list[asyncio.Future[None]] = []
        #: Set while the socket's write buffer is below its high-water mark: push
        #: subscriptions send only then.
        self.writable = asyncio.Event()
        self.writable.set()
        self.session = Session(source="unknown", interface="binary")
        self.subscriptions = Subscriptions(
            server.broker,
            self.conn,
            self._write_push,
            self.writable,
            max_subscriptions=cfg.max_subscriptions,
        )
        #: Its queue consumers and the messages it holds (owner: the connection's id).
        self.queues = QueueSession(
            server.broker, self.conn, self._write_push, self.writable, self.log_id
        )

    # --- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio.Transport, but it has
        # every method of one).
        self.transport = cast(asyncio.Transport, transport)
        self.loop = asyncio.get_running_loop()
        if self.server.ssl is not None:  # called once the handshake has succeeded
            peer = peer_of(transport, self.server.tls_principal_field)
            self.tls, self.cert_principal = peer.tls, peer.principal
            if self.server.require_cert and not peer.certified:
                self._refuse(AuthenticationFailedError(CERT_REQUIRED_MESSAGE))
                return
        self.session = Session(
            source=source_of(transport.get_extra_info("peername")),
            interface="binary",
            tls=transport.get_extra_info("ssl_object") is not None,
            cert_principal=getattr(self, "cert_principal", None),
        )
        if len(self.server.connections) >= self.server.max_connections:
            log.warning("refusing a connection: max_connections reached")
            self.transport.abort()
            return
        self.server.connections.add(self)
        if self.server.metrics.enabled:
            self._counted = True
            self.server.metrics.connection_accepted("binary")
        if self.server.draining:  # accepted just before the listener closed
            self.go_away()
            return
        self._arm_timer()

    def _refuse(self, exc: TidewireError) -> None:
        """Say why (an error frame), read and drop what the client sends for up to
        ``frame_timeout_s`` so its request does not reset the connection under the answer,
        then close."""
        self.closing = True
        self._refused = True
        self.close_reason = "refused"
        assert self.transport is not None
        log.info("refusing a connection: %s", exc.message)
        self.transport.writelines(Connection.error_frame(exc))
        self._reset_timer = asyncio.get_running_loop().call_later(
            self.server.config.frame_timeout_s, self.transport.close
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        # The decoder refuses once it has failed (the connection is closing): what such a
        # connection still sends, or a refused one, is read into a small sink and dropped.
        self._sinking = self._refused or self.decoder.failed
        if not self._sinking:
            return self.decoder.get_buffer(sizehint)
        if self._sink is None:
            self._sink = bytearray(4096)
        return memoryview(self._sink)

    def buffer_updated(self, nbytes: int) -> None:
        if self._sinking:
            return
        self.decoder.buffer_updated(nbytes)
        self._process()
        self._arm_timer()

    def eof_received(self) -> bool:
        if self._refused:
            return False  # closes the connection
        self.conn.receive_data(b"")
        self._process()
        # Keep the socket half-open until in-flight responses are written; TLS has no half
        # close (asyncio warns at every True), its answers written are still flushed.
        return not self.tls

    def pause_writing(self) -> None:
        # The client does not read what it is sent: take no new requests from it, so what
        # waits in its send buffer stays within max_in_flight answers.
        self.write_paused = True
        self.writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.writable.set()
        self.subscriptions.resume()
        self._wake_output_waiters()
        self._update_reading()
        self._process()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.paused or self.write_paused:
            t.pause_reading()
        else:
            t.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._held = []
        self.server.connections.discard(self)
        if self._counted:
            reason = self.close_reason or ("error" if exc is not None else "peer")
            self.server.metrics.connection_closed("binary", reason)
        if not self.server.connections:
            self.server.all_closed.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._reset_timer is not None:
            self._reset_timer.cancel()
        for task in self.tasks:
            task.cancel()
        for parked in self.parked:
            parked.cancel()
        self.parked.clear()
        self.subscriptions.close()
        self.queues.close()  # what it held is delivered again

    # --- requests ---------------------------------------------------------------------------

    def _process(self) -> None:
        while not self.closing and not self.write_paused:
            try:
                event = self.conn.next_event()
            except ProtocolError as exc:
                self._fail(exc)
                return
            if event is NEED_DATA:
                return
            if event is PAUSED:
                if not self.paused:
                    self.paused = True
                    self._update_reading()
                return
            if isinstance(event, ConnectionClosed):
                self._close_when_done()
                return
            if isinstance(event, RequestRejected):
                self._write(self.conn.send_error(event.correlation_id, event.error))
                continue
            if isinstance(event, RequestReceived):
                if self.server.draining:
                    self.server.drain_refused += 1
                    self._write(
                        self.conn.send_error(event.correlation_id, ShuttingDownError(_GOING_AWAY))
                    )
                    continue
                if event.api_key == _PRODUCE:
                    if self._produce_now(event):
                        continue
                    self._produce_tasks += 1
                elif event.api_key == _FETCH and self._fetch_now(event):
                    continue
                self._start_task(event)

    def _start_task(self, event: RequestReceived) -> None:
        task = (self.loop or asyncio.get_running_loop()).create_task(self._handle(event))
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _produce_now(self, ev: RequestReceived) -> bool:
        """Handle a produce request in the read callback itself, without a task, when nothing
        in it needs to await: the batch is appended now and the answer written from the step
        that settles it (under ``always``, the turn its group commit's result comes back in).
        A task costs a loop turn to start and one more to resume after each wait.

        Only on a single node, for a request :func:`~tidewire.server.handlers.produce_soon`
        takes, with no principal (no ACL, quota or throttle applies), no tracing, the
        standard handler, and no earlier produce request of this connection still waiting for
        its task to run (batches are appended in the order their requests arrived). False:
        nothing was done, the request gets a task.
        """
        body = ev.body
        if (
            self._produce_tasks
            or not isinstance(body, ProduceRequest)
            or HANDLERS.get(_PRODUCE) is not produce
            or not self._fast_path()
        ):
            return False
        return self._inline(self._produce_in_context, ev, body)

    def _inline(
        self, handle: Callable[[RequestReceived, _Body], bool], ev: RequestReceived, body: _Body
    ) -> bool:
        """Run a fast path (``handle``) in the request's own context, as a task would have
        (copied: log lines and audit events of the request name it; dropped if the task
        takes the request). Returns what ``handle`` returns: whether it took the request."""
        ctx = contextvars.copy_context()
        try:
            return ctx.run(handle, ev, body)
        except Exception as exc:  # a bug: as a task's failure, the client is told
            self._handler_failed(exc)
            return True

    def _refused_inline(
        self, ev: RequestReceived, api: str, key: ApiKey, body: object, started: float
    ) -> bool:
        """The gate's check on a fast path: True if it refused the request (then answered
        with the error, and counted); else the request is admitted, and its log lines and
        audit events name it."""
        gate = self.server.gate
        try:
            gate.check(self.session, api, API_NEEDS.get(key), body)
        except TidewireError as exc:
            error = self._error(ev, exc)
            metrics = self.server.metrics
            if metrics.enabled:
                metrics.observe_request("binary", api, time.perf_counter() - started, error)
            return True
        gate.enter(self.session, None)
        logs.bind_request(self.log_id, f"{self.log_id}-{ev.correlation_id}", api, "")
        return False

    def _produce_in_context(self, ev: RequestReceived, body: ProduceRequest) -> bool:
        server = self.server
        metrics = server.metrics
        started = time.perf_counter() if metrics.enabled else 0.0
        if self._refused_inline(ev, "PRODUCE", ApiKey.PRODUCE, body, started):
            return True
        cid = ev.correlation_id

        def answer(reply: ProduceResponse | None, exc: BaseException | None) -> None:
            self.inline -= 1
            if self._lost:
                return
            if exc is not None:  # a bug: as a task's failure
                self._handler_failed(exc)
                return
            if reply is None:  # acks=0: no answer
                self.conn.discard(cid)
                self._after_response()
            elif self.inline:
                # More of this connection's produce requests wait, maybe settled in this
                # same step: their answers go out together.
                self._write_held(self.conn.send_response(cid, reply))
            else:
                # The last one (one at a time, always): at once, with those held before it.
                self._write(self.conn.send_response(cid, reply))
            if metrics.enabled:
                metrics.observe_request("binary", "PRODUCE", time.perf_counter() - started, 0)
            self._answered()

        self.inline += 1
        taken = False
        try:
            taken = produce_soon(server.broker, body, ev.data, answer)
        finally:
            if not taken:
                self.inline -= 1
        return taken

    def _fast_path(self) -> bool:
        """Whether a request may be handled in the read callback (``_produce_now``,
        ``_fetch_now``): a single node, no authentication or principal (no ACL, quota or
        throttle applies), no tracing."""
        server = self.server
        return not (
            server.broker.replication is not None
            or server.gate.enabled
            or self.session.principal_name
            or self.session.cert_principal
            or tracing.tracer() is not None
        )

    def _answered(self) -> None:
        """A request answered without a task: the connection goes away or closes now if it
        was waiting for that."""
        if not self.tasks and not self.inline and not self.parked:
            if self.server.draining:
                self.go_away()
            elif self.closing:
                self.close()

    def _fetch_now(self, ev: RequestReceived) -> bool:
        """Answer a fetch in the read callback itself, without a task, when the broker has
        its answer at once (data there, or no wait asked for: a consumer that is behind) and
        the answer fits under ``max_unsent_bytes`` now; or, for a reader caught up on every
        partition, let it wait without a task (:meth:`_park_fetch`). A task costs a loop turn
        to start, a coroutine a frame of the chain, and the answer nothing less.

        On the fast path's terms (:meth:`_fast_path`) with the standard handler. False:
        nothing was answered and nothing delivered (a partition that fails, no room for the
        answer yet, too many fetches waiting), the request gets a task, which reads again.
        """
        server = self.server
        body = ev.body
        if (
            not isinstance(body, FetchRequest)
            or HANDLERS.get(_FETCH) is not fetch
            or not self._fast_path()
        ):
            return False
        broker = server.broker
        caught_up = False
        if body.max_wait_ms > 0 and body.min_bytes > 0:
            # A reader caught up on every partition waits, without a read here that finds
            # nothing. One past the high watermark of some partition (past the log's end: an
            # error; under ``always``, a position not durable yet) goes to the task, whose
            # read tells which (errors are the task path's to give).
            try:
                ends = [broker.high_watermark(p.topic, p.partition) for p in body.partitions]
            except TidewireError:
                return False
            offsets = [p.offset for p in body.partitions]
            if any(o > end for o, end in zip(offsets, ends, strict=True)):
                return False
            caught_up = offsets == ends
        if not self._fits(self._answer_size(body)):
            return False  # the task waits for room (_reserve_output)
        if caught_up:
            return self._inline(self._park_fetch, ev, body)
        return self._inline(self._fetch_in_context, ev, body)

    def _park_fetch(self, ev: RequestReceived, body: FetchRequest) -> bool:
        """Let a caught-up reader's fetch wait for data without a task
        (:meth:`~tidewire.broker.Broker.park_fetch`): it is answered from the loop's
        callback after the wake-up, where its task would have run. False: it cannot wait so
        (too many fetches waiting): the task path refuses it.
        """
        server = self.server
        metrics = server.metrics
        started = time.perf_counter() if metrics.enabled else 0.0
        if self._refused_inline(ev, "FETCH", ApiKey.FETCH, body, started):
            return True
        wants = [(p.topic, p.partition, p.offset, p.max_bytes) for p in body.partitions]
        size = self._answer_size(body)
        parked: ParkedFetch | None = None

        def room() -> bool:
            return self._fits(size)

        def answer(results: list[FetchResult] | None) -> None:
            self.parked.discard(parked)
            if self._lost:
                return
            if results is None:  # nothing delivered: the usual way, in a task
                assert parked is not None
                # For the wait left: a fetch released, or whose wait is over, waits no more.
                left = msgspec.structs.replace(body, max_wait_ms=parked.wait_left_ms())
                self._start_task(replace(ev, body=left))
                return
            reply, data = fetch_answer(wants, results)
            assert reply is not None  # a fetch is always answered
            self._write(self.conn.send_response(ev.correlation_id, reply, data))
            if metrics.enabled:
                metrics.observe_request("binary", "FETCH", time.perf_counter() - started, 0)
            self._answered()

        def answer_in_context(results: list[FetchResult] | None) -> None:
            # Called from a callback of the broker's: in the fetch's own context, and a
            # failure is the connection's, as a task's would be.
            try:
                ctx.run(answer, results)
            except Exception as exc:
                self._handler_failed(exc)

        ctx = contextvars.copy_context()
        parked = server.broker.park_fetch(
            wants,
            answer_in_context,
            max_wait_ms=body.max_wait_ms,
            min_bytes=body.min_bytes,
            max_bytes=body.max_bytes,
            room=room,
        )
        if parked is None:
            return False
        self.parked.add(parked)
        return True

    def _fetch_in_context(self, ev: RequestReceived, body: FetchRequest) -> bool:
        server = self.server
        metrics = server.metrics
        started = time.perf_counter() if metrics.enabled else 0.0
        if self._refused_inline(ev, "FETCH", ApiKey.FETCH, body, started):
            return True
        reply = fetch_now(server.broker, body)
        if reply is None:
            return False
        answer, data = reply
        assert answer is not None  # a fetch is always answered
        self._write(self.conn.send_response(ev.correlation_id, answer, data))
        if metrics.enabled:
            metrics.observe_request("binary", "FETCH", time.perf_counter() - started, 0)
        return True

    async def _authenticate(self, ev: RequestReceived) -> bool:
        """Answer the SASL exchange and WHOAMI, which act on the connection's session;
        returns whether ``ev`` was one of them."""
        gate = self.server.gate
        body = ev.body
        try:
            if isinstance(body, SaslHandshakeRequest):
                offered = gate.sasl_start(self.session, body.mechanism)
                reply: object = SaslHandshakeResponse(mechanisms=offered)
            elif isinstance(body, SaslAuthenticateRequest):
                data, complete = await gate.sasl_step(self.session, body.auth_bytes)
                reply = SaslAuthenticateResponse(
                    auth_bytes=data,
                    complete=complete,
                    principal=self.session.principal_name if complete else "",
                )
            elif ev.api_key == ApiKey.WHOAMI:
                principal = gate.principal(self.session)
                reply = WhoAmIResponse(
                    principal=principal.name if principal is not None else "",
                    kind=principal.kind if principal is not None else "",
                    roles=list(principal.roles) if principal is not None else [],
                    mechanism=self.session.mechanism,
                    tls=self.session.tls,
                    authentication=gate.enabled,
                    superuser=principal is not None
                    and principal.name in gate.authorizer.superusers,
                )
            else:
                return False
        except TidewireError as exc:
            await gate.hold_back(exc)
            self._write(self.conn.send_error(ev.correlation_id, exc))
            return True
        self._write(self.conn.send_response(ev.correlation_id, reply))  # type: ignore[arg-type]
        return True

    async def _handle(self, ev: RequestReceived) -> None:
        if ev.api_key == _PRODUCE:
            self._produce_tasks -= 1  # appended in this step (nothing awaits before)
        metrics = self.server.metrics
        if not metrics.enabled:
            await self._answer(ev)
            return
        started = time.perf_counter()
        error = await self._answer(ev)
        name = _API_NAMES.get(ev.api_key) or str(ev.api_key)
        metrics.observe_request("binary", name, time.perf_counter() - started, error)

    def _error(self, ev: RequestReceived, exc: TidewireError) -> int:
        """Answer ``ev`` with ``exc``; its code (for metrics)."""
        self._write(self.conn.send_error(ev.correlation_id, exc))
        return exc.code

    async def _answer(self, ev: RequestReceived) -> int:
        """Handle one request; the error code it was answered with (0: none)."""
        if ev.api_key in SESSION_APIS and await self._authenticate(ev):
            return 0
        api = _API_KEYS.get(ev.api_key)
        if api is None:
            api = ApiKey(ev.api_key)
        try:
            principal = self.server.gate.check(self.session, api.name, API_NEEDS.get(api), ev.body)
        except TidewireError as exc:
            return self._error(ev, exc)
        self.server.gate.enter(self.session, principal)  # this task's own context
        logs.bind_request(
            self.log_id,
            f"{self.log_id}-{ev.correlation_id}",
            api.name,
            principal.name if principal is not None else "",
        )
        if ev.api_key in PUSH_APIS:
            try:
                reply = self.subscriptions.handle(ev.api_key, ev.body)
            except TidewireError as exc:
                return self._error(ev, exc)
            self._write(self.conn.send_response(ev.correlation_id, reply))
            if isinstance(reply, SubscribeResponse) and not reply.error_code:
                # Only now: no push of it may reach the client before this answer.
                self.subscriptions.start(reply.subscription_id)
            return 0
        if ev.api_key == ApiKey.ENVELOPE:  # a node forwarding a caller's request
            ebody, edata = await serve_envelope(
                self.server.broker,
                self.server.gate,
                sender=self.session,
                conn=self.conn,
                req=ev.body,
                data=ev.data,
            )
            self._write(self.conn.send_response(ev.correlation_id, ebody, edata))
            return ebody.error_code
        if ev.api_key in QUEUE_APIS:
            try:
                qbody, qdata = await self.queues.handle(ev.api_key, ev.body, ev.data)
                self._write(self.conn.send_response(ev.correlation_id, qbody, qdata))
            finally:
                self.queues.answered(ev.api_key)  # a consumer's deliveries may go now
            return int(getattr(qbody, "error_code", 0))
        handler = HANDLERS.get(ev.api_key)
        if handler is None:
            name = ApiKey(ev.api_key).name
            err: TidewireError = UnknownApiError(f"{name} is not implemented by this broker")
            return self._error(ev, err)
        size = 0
        if isinstance(ev.body, FetchRequest):
            size = self._answer_size(ev.body)
            await self._reserve_output(size)
        t = tracing.tracer()  # None without an SDK: nothing more is done for tracing
        span = (
            None if t is None else tracing.request_span(t, api.name, ev.body, self.session.source)
        )
        try:
            body, data = await handler(self.server.broker, self.server.info, ev.body, ev.data)
        except TidewireError as exc:
            if span is not None:
                tracing.end_span(span, exc)
            return self._error(ev, exc)
        except BaseException as exc:
            if span is not None:
                tracing.end_span(span, exc)
            raise
        finally:
            # The answer is in the write buffer from here on (counted there), or there is none.
            self._release_output(size)
        if span is not None:
            tracing.end_request_span(span, ev.body, body, ev.data, data)
        if principal is not None:
            delay = self.server.gate.throttle(
                principal,
                produced=len(ev.data) if api is ApiKey.PRODUCE else 0,
                fetched=sum(len(d) for d in data) if api is ApiKey.FETCH else 0,
            )
            if delay > 0:
                # Kafka's quota model: the answer waits, and says how long it waited.
                if isinstance(body, (ProduceResponse, FetchResponse)):
                    body.throttle_time_ms = int(delay * 1000)
                await asyncio.sleep(delay)
        if body is None:
            self.conn.discard(ev.correlation_id)
            self._after_response()
            return 0
        self._write(self.conn.send_response(ev.correlation_id, body, data))
        return 0

    def _answer_size(self, body: FetchRequest) -> int:
        """The most a fetch's answer may hold (what room is reserved for)."""
        return max(min(body.max_bytes, self.server.broker.config.fetch_max_bytes), 0)

    def _fits(self, size: int) -> bool:
        """Whether an answer of ``size`` bytes fits under ``max_unsent_bytes`` now (one
        always does when nothing is unsent)."""
        unsent = self._unsent()
        return unsent == 0 or unsent + size <= self.server.config.max_unsent_bytes

    def _unsent(self) -> int:
        t = self.transport
        buffered = t.get_write_buffer_size() if t is not None and not t.is_closing() else 0
        if self._held:
            buffered += sum(map(len, self._held))
        return self.reserved + buffered

    async def _reserve_output(self, size: int) -> None:
        """Wait until an answer of ``size`` bytes fits under ``max_unsent_bytes`` (at once if
        nothing is unsent: one answer always goes), then count it."""
        while not self._fits(size):
            fut = asyncio.get_running_loop().create_future()
            self._output_waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._output_waiters:
                    self._output_waiters.remove(fut)
        self.reserved += size

    def _release_output(self, size: int) -> None:
        if size:
            self.reserved -= size
            self._wake_output_waiters()

    def _wake_output_waiters(self) -> None:
        waiters, self._output_waiters = self._output_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _handler_failed(self, exc: BaseException) -> None:
        """A handler's bug (a task's, a fast path's, a parked fetch's answer): logged, and
        the connection fails with it, so the client does not wait for an answer that never
        comes."""
        log.error("request handler failed", exc_info=exc)
        self._fail(UnknownError(f"internal error: {exc!r}"))

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._handler_failed(exc)
            return
        if self.tasks or self.inline or self.parked:
            return
        if self.server.draining:
            self.go_away()
        elif self.closing:
            self.close()

    def _write(self, buffers: list[Buffer]) -> None:
        """Send an answer now, in one ``writelines`` with the answers held, if any."""
        if self._held:
            self._held.extend(buffers)
            self.send_held()
        else:
            t = self.transport
            if t is not None and not t.is_closing():
                t.writelines(buffers)
        self._after_response()

    def _write_held(self, buffers: list[Buffer]) -> None:
        """Send an answer settled by a group commit (or an append): held until the server's
        :meth:`TcpServer._send_held` runs (at the end of the step settling it, else in the
        loop's next callback: :meth:`TcpServer.hold`), so that the answers one commit settles
        go out together. The commit settles every produce
        request it covers in one step: written one by one, each answer was a ``write`` of
        its own (a loopback send) and the first one woke the client, which then read them
        one by one."""
        t = self.transport
        if t is not None and not self._lost and not t.is_closing():
            if not self._held:
                self.server.hold(self)
            self._held.extend(buffers)
        self._after_response()

    def send_held(self) -> None:
        """Hand the answers held (:meth:`_write_held`) to the transport, before anything else is
        written to it: the order of what the client receives is the order it was sent in."""
        held = self._held
        if not held:
            return
        self._held = []
        t = self.transport
        if t is not None and not self._lost and not t.is_closing():
            t.writelines(held)
        # Held bytes count as unsent (_unsent): a fetch waiting for room behind them must
        # learn that they left, or it waits for a release that may never come.
        if self._output_waiters:
            self._wake_output_waiters()

    def _write_push(self, buffers: list[Buffer]) -> None:
        self.send_held()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(buffers)

    def _after_response(self) -> None:
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = False
            self._update_reading()
            self._process()

    # --- closing ----------------------------------------------------------------------------

    def _fail(self, exc: TidewireError) -> None:
        """Tell the client why, then close: the connection broke the protocol."""
        log.info("closing a connection: %s", exc)
        self.closing = True
        self.close_reason = self.close_reason or "protocol"
        self.subscriptions.close()
        self.send_held()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(Connection.error_frame(exc))
            self.close()

    def drain(self) -> None:
        """The server drains: end the push subscriptions now; go away at once when nothing is
        in flight, else once the last answer is written (new requests are refused meanwhile)."""
        self.subscriptions.close()
        if not self.tasks and not self.inline and not self.parked:
            self.go_away()

    def go_away(self) -> None:
        """Tell the client the broker is shutting down (an error frame of
        ``ShuttingDownError``, retriable), then close."""
        if self.transport is None or self._lost or self.transport.is_closing():
            return
        self.closing = True
        self.close_reason = self.close_reason or "shutdown"
        self.subscriptions.close()
        if self._timer is not None:
            self._timer.cancel()
        self.send_held()
        self.transport.writelines(Connection.error_frame(ShuttingDownError(_GOING_AWAY)))
        self.close()

    def _close_when_done(self) -> None:
        self.closing = True
        self.subscriptions.close()
        if not self.tasks and not self.inline and not self.parked:
            self.close()

    def close(self) -> None:
        """Close once what was written is sent; reset the connection if the peer has not
        taken it within ``frame_timeout_s``.

        A plain close waits for the write buffer to drain, and a peer that does not read
        never drains it: the connection, its buffered answers and its slot under
        ``max_connections`` would be held for as long as that peer stays connected.
        """
        t = self.transport
        if t is None or self._lost:
            return
        self.send_held()  # a close sends what the transport holds, and nothing after it
        t.close()  # idempotent
        if self._reset_timer is None:
            delay = self.server.config.frame_timeout_s
            self._reset_timer = asyncio.get_running_loop().call_later(delay, self.reset)

    def reset(self, *, quiet: bool = False) -> None:
        """Reset the connection now (a RST), dropping what is unsent (``quiet``: the caller
        reports it)."""
        t = self.transport
        if t is None or self._lost:
            return
        if not quiet:
            log.info(
                "resetting a connection: %d bytes for it still unsent after %g s",
                t.get_write_buffer_size(),
                self.server.config.frame_timeout_s,
            )
        sock = t.get_extra_info("socket")
        if sock is not None:
            # No lingering: a RST at once, instead of a kernel that goes on offering the
            # unsent bytes to a peer that does not take them.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_OFF)
        t.abort()

    def _arm_timer(self) -> None:
        """Set the connection's deadline after a read: ``frame_timeout_s`` from the first
        byte of a frame still incomplete, else ``idle_timeout_s`` from now.

        One timer per connection, moved only when the deadline comes earlier than it is set
        for; a deadline that moves later (every read of a busy connection) is only noted, and
        the timer, when it fires before the deadline, sets itself again for it
        (:meth:`_on_timer`). Cancelling the timer and making a new one on every read cost
        more than the rest of a small request's reading.
        """
        if self.closing:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return  # nothing more is read; the reset timer bounds the rest
        cfg = self.server.config
        loop = self.loop or asyncio.get_running_loop()
        now = loop.time()
        midframe = self.conn.buffered_bytes > 0
        if midframe:
            # A frame must be whole within frame_timeout_s of its first byte, however it
            # trickles in.
            if self._frame_started is None:
                self._frame_started = now
            deadline = self._frame_started + cfg.frame_timeout_s
        else:
            self._frame_started = None
            deadline = now + cfg.idle_timeout_s
        self._deadline, self._deadline_midframe = deadline, midframe
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        """The timer fired: time the connection out if its deadline has come, else set the
        timer again for the deadline (later reads moved it)."""
        self._timer = None
        if self.closing:
            return
        loop = self.loop or asyncio.get_running_loop()
        # Within a millisecond counts as come: uvloop's timers have that resolution, and may
        # fire that much early.
        if self._deadline - loop.time() > _TIMER_SLACK_S:
            self._timer_at = self._deadline
            self._timer = loop.call_at(self._deadline, self._on_timer)
            return
        self._timed_out(self._deadline_midframe)

    def _timed_out(self, midframe: bool) -> None:
        if (
            self.tasks
            or self.inline
            or self.parked
            or ((self.subscriptions.subs or self.queues.consumers) and not midframe)
        ):
            # Waiting on the broker (a long-poll, a subscription caught up, a queue consumer
            # waiting for messages) is not idleness. A frame half-sent meanwhile gets
            # frame_timeout_s more from now (reading may have been paused for the requests
            # in flight): its deadline is past, and a timer set for it would fire every turn.
            if midframe:
                self._frame_started = (self.loop or asyncio.get_running_loop()).time()
            self._arm_timer()
            return
        what = "a frame was left half-sent" if midframe else "the connection was idle"
        self.close_reason = "timeout"
        self._fail(ProtocolError(f"{what} for too long; closing"))


class TcpServer:
    """The binary-protocol listener.

    Args:
        broker: the broker requests go to (started by the caller).
        config: listener settings.
        tls: TLS settings (on when ``tls.enabled``), or a server-side SSL context; None:
            plaintext. A connection whose handshake fails (plaintext on this port, a client
            certificate missing or not verified) is closed alone, within
            :data:`~tidewire.security.tls.HANDSHAKE_TIMEOUT_S`.

    Raises:
        InvalidConfigError: a TLS file cannot be loaded (the message names it).
    """

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig | None = None,
        *,
        tls: TlsConfig | ssl.SSLContext | None = None,
    ) -> None:
        self.broker = broker
        self.config = config or ServerConfig()
        #: The listener's SSL context (None: plaintext), which certificate field names a
        #: client's principal, and whether a connection without a client certificate is
        #: refused after the handshake (see ``listener_context``).
        self.ssl: ssl.SSLContext | None = None
        self.tls_principal_field = "CN"
        self.require_cert = False
        if isinstance(tls, ssl.SSLContext):
            self.ssl = tls
        elif tls is not None and tls.enabled:
            self.ssl, self.require_cert = listener_context(tls)
            self.tls_principal_field = tls.tls_principal_field
        self.connections: set[_ClientProtocol] = set()
        #: Buffers of large requests (produce), taken again by any connection once the
        #: request they held is done with: no page faults of a fresh megabyte a request.
        self.frame_pool = FramePool()
        self.info = ServerInfo(self.config.host, self.config.port)
        self._server: asyncio.Server | None = None
        #: Set by :meth:`begin_drain`: new requests are refused with ``ShuttingDownError``.
        self.draining = False
        #: Requests refused that way.
        self.drain_refused = 0
        #: Set whenever the last connection closes.
        self.all_closed = asyncio.Event()
        #: Connections holding answers until :meth:`_send_held` runs (see
        #: ``_ClientProtocol._write`` and :meth:`hold`): once for all of them.
        self._holding: list[_ClientProtocol] = []

        #: max_connections as the descriptor limit allows (see :meth:`start`).
        self.max_connections = self.config.max_connections
        #: Authentication and authorization of every request (shared with the broker's
        #: other listeners).
        self.gate = gate_for(broker)
        #: The broker's metrics (connections and requests are counted there).
        self.metrics = metrics_for(broker)
        self.metrics.tcp_servers.add(self)
        self.metrics.security_stats = self.gate.stats

    def hold(self, conn: _ClientProtocol) -> None:
        """Send ``conn``'s held answers (with those of every connection that holds some by
        then) at the end of the step settling them, a group commit's result or a turn's
        writes (:mod:`tidewire._step`); outside one, in the loop's next callback. Sent in
        the next callback, a commit's answers waited behind every request read in between
        (200 us at the median at 5,000 msg/s)."""
        # In a step, at its end even if a callback was asked for before it (that callback
        # then finds nothing held).
        if not _step.defer(self._send_held) and not self._holding:
            (conn.loop or asyncio.get_running_loop()).call_soon(self._send_held)
        self._holding.append(conn)

    def _send_held(self) -> None:
        holding, self._holding = self._holding, []
        for conn in holding:
            conn.send_held()

    def _fit_connections(self) -> None:
        """Check max_connections against the descriptor limit (see the module docstring).

        Raises:
            InvalidConfigError: it was set explicitly above what the limit allows.
        """
        limit = self.broker.descriptor_limit
        files = self.broker.max_open_files
        allowed = max(limit - files - RESERVED_DESCRIPTORS, 1)
        wanted = self.config.max_connections
        if wanted <= allowed:
            return
        why = (
            f"the descriptor limit is {limit:,}, of which {files:,} are kept for log files "
            f"(max_open_files) and {RESERVED_DESCRIPTORS} for the broker itself"
        )
        if wanted != DEFAULT_MAX_CONNECTIONS:
            raise InvalidConfigError(
                f"max_connections={wanted:,} needs as many descriptors, but {why}: at most "
                f"{allowed:,} connections fit (raise the limit, ulimit -n, or lower "
                "max_connections or max_open_files)"
            )
        log.warning("max_connections lowered from %s to %s: %s", f"{wanted:,}", f"{allowed:,}", why)
        self.max_connections = allowed

    @property
    def port(self) -> int:
        """The port listened on (the real one when the configured port was 0)."""
        if self._server is None or not self._server.sockets:
            return self.config.port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Start listening.

        Raises:
            InvalidConfigError: max_connections does not fit under the descriptor limit.
        """
        self._fit_connections()
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.BaseProtocol] = lambda: _ClientProtocol(self)  # noqa: E731
        if self.ssl is not None:
            factory = tls_protocol_factory(
                factory, self.ssl, handshake_timeout_s=HANDSHAKE_TIMEOUT_S
            )
        self._server = await loop.create_server(factory, self.config.host, self.config.port)
        self.info = ServerInfo(self.config.host, self.port)
        log.info("listening on %s:%d%s", self.config.host, self.port, " (TLS)" if self.ssl else "")

    def stop_accepting(self) -> None:
        """Close the listening socket now: new connections are refused from here on."""
        if self._server is not None:
            close_listener(self._server)

    def in_flight(self) -> int:
        """Requests being handled, on every connection."""
        return sum(len(c.tasks) + c.inline + len(c.parked) for c in self.connections)

    def begin_drain(self) -> None:
        """Refuse new requests (``ShuttingDownError``), end push subscriptions, and close
        every connection with nothing in flight (see the module docstring). The caller wakes
        the broker's long-polls (``Broker.begin_drain`` or ``release_waiters``)."""
        self.draining = True
        for c in list(self.connections):
            c.drain()

    async def wait_in_flight(self, deadline: float) -> int:
        """Wait until every request in flight is answered, or the loop time ``deadline``;
        return how many are still running. No new one starts while draining."""
        loop = asyncio.get_running_loop()
        while (timeout := deadline - loop.time()) > 0:
            pending = [t for c in self.connections for t in c.tasks]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
            elif any(c.inline or c.parked for c in self.connections):
                # Produce requests handled without a task (answered when their append
                # settles, an fsync at most, as a task's would) and fetches waiting without
                # one (answered once the broker's long-polls are released; one may go on in
                # a task, looked for again here): polled.
                await asyncio.sleep(min(0.005, timeout))
            else:
                break
        return self.in_flight()

    async def finish(self) -> int:
        """End the drain: cancel the requests still running, tell every connection left to go
        away, give them :data:`FINAL_CLOSE_S` to take what is left, reset the rest. Return how
        many requests were cancelled."""
        self.draining = True
        pending = [t for c in self.connections for t in c.tasks]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for c in list(self.connections):
            c.go_away()
        if self.connections:
            self.all_closed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.all_closed.wait(), FINAL_CLOSE_S)
        if self.connections:
            log.info(
                "resetting %d connection(s) that did not take their last bytes in %g s",
                len(self.connections),
                FINAL_CLOSE_S,
            )
        for c in list(self.connections):
            c.reset(quiet=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), FINAL_CLOSE_S)
            self._server = None
        return len(pending)

    async def close(self, *, grace_s: float | None = None) -> None:
        """Drain this listener alone: stop accepting, answer long-polls, refuse new requests,
        let in-flight requests finish (up to ``grace_s``, by default the configured
        ``drain_timeout_s``), then close every connection."""
        grace = self.config.drain_timeout_s if grace_s is None else grace_s
        deadline = asyncio.get_running_loop().time() + grace
        self.stop_accepting()
        self.broker.release_waiters()  # long-polls answer now with what they have
        self.begin_drain()
        await self.wait_in_flight(deadline)
        await self.finish()

    async def __aenter__(self) -> TcpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
