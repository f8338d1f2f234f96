"""The Kafka listener (``kafka_port``): Kafka's wire protocol over the broker core.

Per connection: a 4-byte big-endian size, then the frame (bounded by ``max_frame_bytes``;
a larger or negative size closes the connection, logged), decoded by
:func:`~tidewire.protocol.kafka.decode_request`. Each request runs as a task of its own,
so a long-polling Fetch holds back neither the other connections nor the reading of this
one's next requests (up to ``max_in_flight``); the answers go out in the requests' order,
as Kafka promises.

What is not served:

- an ApiVersions of a version above the advertised ones is answered UNSUPPORTED_VERSION in
  the v0 layout with the supported ranges, so the client retries with one it finds there
  (KIP-511);
- another API at a version outside its advertised range is answered UNSUPPORTED_VERSION
  where the response has an error code of its own; an API key that is not served at all,
  or a version without that field, closes the connection (Kafka's broker does the same);
- a frame that cannot be decoded closes the connection, logged.

Authentication: with ``authentication`` on, a connection may send only ApiVersions,
SaslHandshake and SaslAuthenticate until it has authenticated (or its TLS client
certificate names a principal); anything else closes it, as Kafka's broker does. SASL:
SaslHandshake v1 then SaslAuthenticate requests (what current clients send), or
SaslHandshake v0 then the raw SASL tokens each framed by a 4-byte size (the legacy
exchange). PLAIN and SCRAM-SHA-256/512 go through the gate: the SCRAM username is an API
key's id and the password its secret; PLAIN takes the same, or any username with the whole
key as password (docs/security.md). A failed exchange closes the connection after its
answer. Authorization is per resource: see :mod:`tidewire.server.kafka.needs`.

Connections silent for ``idle_timeout_s`` (with nothing in flight) are closed; a frame
must arrive whole within ``frame_timeout_s``. Draining (SIGTERM, :mod:`~tidewire.server.
drain`) stops accepting, stops reading requests, lets those in flight be answered up to the
grace period and closes every connection; a Kafka client reconnects elsewhere or later.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import socket
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

from tidewire.broker import Broker
from tidewire.cluster import cluster_node
from tidewire.errors import AuthenticationFailedError, AuthorizationFailedError, TidewireError
from tidewire.observability.kafka_metrics import kafka_stats_for
from tidewire.protocol.kafka import (
    SUPPORTED,
    ApiKey,
    ErrorCode,
    KafkaCodecError,
    RequestHeader,
    decode_request,
    encode_response,
    encode_response_parts,
)
from tidewire.protocol.kafka.schema import layout
from tidewire.security.config import TlsConfig
from tidewire.security.model import Principal
from tidewire.security.tls import HANDSHAKE_TIMEOUT_S, listener_context, peer_of
from tidewire.server.gate import Session, gate_for, source_of
from tidewire.server.kafka.context import KafkaContext
from tidewire.server.kafka.dispatch import registry
from tidewire.server.kafka.handlers import ACKS0_FAILED
from tidewire.server.kafka.sasl import CLOSE_AFTER, RAW_SASL, sasl_step
from tidewire.server.listening import close_listener
from tidewire.server.needs import AUTHENTICATED, PUBLIC, Need, Requirement
from tidewire.server.tcp import _WILDCARDS, FINAL_CLOSE_S, ServerConfig
from tidewire.server.tls import tls_protocol_factory

__all__ = ["KafkaServer", "cluster_id_of"]

log = logging.getLogger("tidewire.kafka")

#: The APIs a connection may use before it has authenticated.
_BEFORE_AUTH = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
#: The node id of this broker in Metadata (also the controller's).
NODE_ID = 0
#: Read buffer of a connection's stream (frames longer than it are read in parts).
_READ_LIMIT = 64 * 1024


@functools.cache
def kafka_cluster_id(name: str) -> str:
    """The cluster id the Kafka listeners of the nodes of cluster ``name`` all answer."""
    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"tidewire-cluster:{name}").bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cluster_id_of(broker: Broker) -> str:
    """The cluster id Metadata answers: stable for a data directory (22 characters of URL-safe
    base64, like Kafka's)."""
    path = str(Path(broker.config.data_dir).resolve())
    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"tidewire:{path}").bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class _Close(Exception):
    """Internal: close the connection (the reason is logged where raised)."""


#: An answer: one frame, or a frame in parts (see encode_response_parts).
_Answer = bytes | list[bytes | bytearray | memoryview]


async def _ready(data: bytes) -> _Answer | None:
    return data


def _error_only(header: RequestHeader, code: ErrorCode) -> bytes | None:
    """An answer carrying ``code`` alone in the response's top-level error code, or None when
    that version's response has no such field."""
    lay = layout(header.api_key, "response", header.api_version)
    if lay is None or not any(f.name == "error_code" for f in lay.fields):
        return None
    return encode_response(header, {"error_code": code})


def _api_versions_refusal(header: RequestHeader) -> bytes:
    from tidewire.server.kafka.handlers import served_versions  # noqa: PLC0415

    body = {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": served_versions()}
    return encode_response(header, body, version=0)


def _evaluate(
    ctx: KafkaContext, action: str, requirement: Requirement, body: dict[str, Any]
) -> tuple[Principal | None, frozenset[Need]]:
    """The session's principal and the needs of ``requirement`` the gate refuses, each
    asked alone (audited there).

    Raises:
        AuthenticationFailedError: authentication is on and the session has no (valid)
            principal.
    """
    gate, session = ctx.gate, ctx.session
    if requirement is PUBLIC:
        return None, frozenset()
    principal = gate.principal(session)
    gate.enter(session, principal)
    if requirement is AUTHENTICATED or not callable(requirement):
        return principal, frozenset()
    denied: set[Need] = set()
    for need in requirement(body):
        try:
            gate.check(session, action, lambda _body, n=need: [n], body)
        except AuthorizationFailedError:
            denied.add(need)
    return principal, frozenset(denied)


def _records_bytes(topics: list[dict[str, Any]], parts: str) -> int:
    """Bytes of ``records`` in a Produce request's or a Fetch response's topics."""
    return sum(len(p["records"] or b"") for t in topics for p in t[parts])


class _Connection:
    """One client connection: a reading loop and an answering loop."""

    def __init__(
        self, server: KafkaServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        cfg = server.config
        #: Answers being made, in the requests' order (None: stop); at most max_in_flight
        #: (``slots``): beyond, the connection is not read until an answer is sent.
        self.pending: asyncio.Queue[asyncio.Task[_Answer | None] | None] = asyncio.Queue()
        self.slots = asyncio.Semaphore(cfg.max_in_flight)
        #: Bytes of Fetch answers this connection may be holding (each charged at its most
        #: when read, released once written out), under ``max_unsent_bytes``: a client that
        #: pipelines fetches but does not read its answers stops being read instead of
        #: making the broker hold them all (as the binary listener does).
        self.unsent = 0
        self.unsent_freed = asyncio.Event()
        self.costs: dict[asyncio.Task[_Answer | None], int] = {}
        self.tasks: set[asyncio.Task[_Answer | None]] = set()
        peer = peer_of(writer.transport, server.tls_principal_field)
        self.session = Session(
            source=source_of(writer.get_extra_info("peername")),
            interface="kafka",
            tls=peer.tls,
            cert_principal=peer.principal,
        )
        self.certified = peer.certified
        self.reading: asyncio.Task[None] | None = None

    async def run(self) -> None:
        if self.server.require_cert and not self.certified:
            log.info(
                "closing a Kafka connection from %s: no client certificate", self.session.source
            )
            self.writer.transport.abort()
            return
        loop = asyncio.get_running_loop()
        answering = loop.create_task(self._answer_loop())
        self.reading = loop.create_task(self._read_loop())
        try:
            # Ends when the peer closes, a frame is refused, or a drain stops the reading
            # (the reading task cancelled: waited for, not awaited, so that is no error).
            await asyncio.wait([self.reading])
        finally:
            if not self.reading.done():
                self.reading.cancel()
            self.pending.put_nowait(None)  # answer what is in flight, then stop
            await asyncio.wait([answering])
            for task in list(self.tasks):
                task.cancel()
            self._close()

    def stop_reading(self) -> None:
        """Read no more requests: answer those in flight, then close (a drain)."""
        if self.reading is not None and not self.reading.done():
            self.reading.cancel()

    def _close(self) -> None:
        t = self.writer.transport
        if t.is_closing():
            return
        t.close()
        loop = asyncio.get_running_loop()
        loop.call_later(FINAL_CLOSE_S + self.server.config.frame_timeout_s, t.abort)

    async def _read_loop(self) -> None:
        cfg = self.server.config
        while True:
            try:
                size = await self._read_size()
            except (asyncio.IncompleteReadError, ConnectionError, _Close):
                return
            if not 0 <= size <= cfg.max_frame_bytes:
                log.info(
                    "closing a Kafka connection from %s: a frame of %s bytes, outside "
                    "0..max_frame_bytes=%s",
                    self.session.source,
                    f"{size:,}",
                    f"{cfg.max_frame_bytes:,}",
                )
                return
            try:
                frame = await asyncio.wait_for(self.reader.readexactly(size), cfg.frame_timeout_s)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except TimeoutError:
                log.info(
                    "closing a Kafka connection from %s: a frame of %s bytes unfinished after %g s",
                    self.session.source,
                    f"{size:,}",
                    cfg.frame_timeout_s,
                )
                return
            self.server.stats.bytes_in(4 + size)
            if self.session.extra.get(RAW_SASL):
                if not await self._raw_sasl(frame):
                    return
                continue
            if not await self._request(frame):
                return

    async def _read_size(self) -> int:
        cfg = self.server.config
        while True:
            try:
                raw = await asyncio.wait_for(self.reader.readexactly(4), cfg.idle_timeout_s)
            except TimeoutError:
                if self.tasks:  # a long-poll in flight is not idleness
                    continue
                log.info(
                    "closing a Kafka connection from %s: idle for %g s",
                    self.session.source,
                    cfg.idle_timeout_s,
                )
                raise _Close from None
            return int.from_bytes(raw, "big", signed=True)

    async def _request(self, frame: bytes) -> bool:
        """Decode one request and queue its answer; whether to go on reading."""
        server = self.server
        handlers, needs = registry()
        try:
            header, body = decode_request(frame)
        except KafkaCodecError as exc:
            known = exc.header if isinstance(exc.header, RequestHeader) else None
            if exc.error_code != ErrorCode.UNSUPPORTED_VERSION or known is None:
                log.info("closing a Kafka connection from %s: %s", self.session.source, exc)
                return False
            return await self._unsupported(known)
        key = header.api_key
        span = SUPPORTED.get(key)
        if key not in handlers or span is None or not span[0] <= header.api_version <= span[1]:
            return await self._unsupported(header)
        if (
            key not in _BEFORE_AUTH
            and server.gate.enabled
            and not self.session.authenticated
            and not self.session.cert_principal
        ):
            log.info(
                "closing a Kafka connection from %s: %s before authenticating",
                self.session.source,
                ApiKey(key).name,
            )
            return False
        await self.slots.acquire()
        cost = 0
        if key == ApiKey.FETCH:
            cost = await self._charge(body)
        task = asyncio.get_running_loop().create_task(
            self._handle(header, body, handlers[key], needs.get(key))
        )
        if cost:
            self.costs[task] = cost
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.pending.put_nowait(task)
        if key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            # What comes next depends on this answer (raw tokens after a v0 handshake; a
            # failed exchange ends the connection): read on only once it is sent.
            await self.pending.join()
            return not self.session.extra.pop(CLOSE_AFTER, False)
        return True

    async def _charge(self, body: dict[str, Any]) -> int:
        """Wait until a Fetch's answer fits under ``max_unsent_bytes``; its charge."""
        limit = self.server.config.max_unsent_bytes
        fetch_max = self.server.broker.config.fetch_max_bytes
        asked = body["max_bytes"]
        cost = min(asked if asked > 0 else fetch_max, fetch_max, limit)
        while self.unsent and self.unsent + cost > limit:
            self.unsent_freed.clear()
            await self.unsent_freed.wait()
        self.unsent += cost
        return cost

    async def _unsupported(self, header: RequestHeader) -> bool:
        name = ApiKey(header.api_key).name if header.api_key in SUPPORTED else header.api_key
        if header.api_key == ApiKey.API_VERSIONS:
            data: bytes | None = _api_versions_refusal(header)
        else:
            data = _error_only(header, ErrorCode.UNSUPPORTED_VERSION)
        self.server.stats.request(
            header.api_key, header.api_version, 0.0, ErrorCode.UNSUPPORTED_VERSION
        )
        if data is None:
            log.info(
                "closing a Kafka connection from %s: API %s version %d is not served",
                self.session.source,
                name,
                header.api_version,
            )
            return False
        await self.slots.acquire()
        self.pending.put_nowait(asyncio.get_running_loop().create_task(_ready(data)))
        return True

    async def _raw_sasl(self, token: bytes) -> bool:
        """One raw SASL token after a SaslHandshake v0: the reply framed by its size alone;
        a failure closes the connection."""
        await self.pending.join()
        ctx = self._context(RequestHeader(ApiKey.SASL_AUTHENTICATE, 0, 0, None))
        try:
            reply, complete = await sasl_step(ctx, token)
        except TidewireError as exc:
            log.info(
                "closing a Kafka connection from %s: authentication failed: %s",
                self.session.source,
                exc.message,
            )
            return False
        if complete:
            self.session.extra[RAW_SASL] = False
        data = len(reply).to_bytes(4, "big") + reply
        self.writer.write(data)
        self.server.stats.bytes_out(len(data))
        await self.writer.drain()
        return True

    def _context(self, header: RequestHeader) -> KafkaContext:
        s = self.server
        node = cluster_node(s.broker)
        return KafkaContext(
            broker=s.broker,
            gate=s.gate,
            session=self.session,
            header=header,
            node_id=NODE_ID if node is None else node.node_id,
            host=s.advertised_host,
            port=s.advertised_port,
            cluster_id=s.cluster_id if node is None else kafka_cluster_id(node.cluster_id),
        )

    async def _handle(
        self,
        header: RequestHeader,
        body: dict[str, Any],
        handler: Any,
        requirement: Requirement | None,
    ) -> _Answer | None:
        started = time.perf_counter()
        ctx = self._context(header)
        name = ApiKey(header.api_key).name
        try:
            if requirement is None:  # a handler without a declaration: nobody may use it
                raise AuthorizationFailedError(f"{name} declares no permission")
            principal, ctx.denied = _evaluate(ctx, name, requirement, body)
        except (AuthenticationFailedError, AuthorizationFailedError) as exc:
            log.info("closing a Kafka connection from %s: %s", self.session.source, exc.message)
            raise _Close from None
        out = await handler(ctx, header.api_version, body)
        if self.session.extra.pop(ACKS0_FAILED, False):
            log.info(
                "closing a Kafka connection from %s: an acks=0 produce failed",
                self.session.source,
            )
            raise _Close
        if principal is not None:
            # Kafka's quota model: the answer waits, and says how long it waited.
            key = header.api_key
            delay = ctx.gate.throttle(
                principal,
                produced=_records_bytes(body["topic_data"], "partition_data")
                if key == ApiKey.PRODUCE
                else 0,
                fetched=_records_bytes(out["responses"], "partitions")
                if key == ApiKey.FETCH and out is not None
                else 0,
            )
            if delay > 0:
                if out is not None:
                    out["throttle_time_ms"] = int(delay * 1000)
                await asyncio.sleep(delay)
        error = 0 if out is None else out.get("error_code", 0)
        self.server.stats.request(
            header.api_key, header.api_version, time.perf_counter() - started, error
        )
        if out is None:
            return None
        if header.api_key == ApiKey.FETCH:
            # The records go to the socket as the log returned them, not copied into a frame.
            return encode_response_parts(header, out)
        return encode_response(header, out)

    async def _answer_loop(self) -> None:
        while True:
            task = await self.pending.get()
            try:
                if task is None:
                    return
                try:
                    data = await task
                except _Close:
                    self.stop_reading()
                    self.writer.transport.abort()
                    return
                except Exception:
                    log.exception("a Kafka request handler failed; closing its connection")
                    self.stop_reading()
                    self.writer.transport.abort()
                    return
                if data is not None:
                    if isinstance(data, list):  # a Fetch answer: the log's bytes, uncopied
                        self.writer.writelines(data)
                        self.server.stats.bytes_out(sum(len(p) for p in data))
                    else:
                        self.writer.write(data)
                        self.server.stats.bytes_out(len(data))
                    # A peer that stops reading is cut after the idle timeout, not waited
                    # for forever with its answers in memory.
                    await asyncio.wait_for(self.writer.drain(), self.server.config.idle_timeout_s)
            except ConnectionError:
                self.stop_reading()
                return
            except TimeoutError:
                log.info(
                    "closing a Kafka connection from %s: its answers unread for %g s",
                    self.session.source,
                    self.server.config.idle_timeout_s,
                )
                self.stop_reading()
                self.writer.transport.abort()
                return
            finally:
                self.pending.task_done()
                if task is not None:
                    self.slots.release()
                    cost = self.costs.pop(task, 0)
                    if cost:
                        self.unsent -= cost
                        self.unsent_freed.set()


class KafkaServer:
    """The Kafka listener of one broker.

    Args:
        broker: the broker (started by the caller).
        config: the listener settings: ``kafka_port``, ``kafka_host`` (else ``host``),
            ``kafka_advertised_host``/``port``, and the connection bounds shared with the
            binary protocol (``max_frame_bytes``, ``max_in_flight``, ``max_connections``,
            ``idle_timeout_s``, ``frame_timeout_s``, ``drain_timeout_s``).
        tls: TLS settings (on when ``tls.enabled``) or a server-side SSL context; None:
            plaintext.
    """

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        *,
        tls: TlsConfig | ssl.SSLContext | None = None,
    ) -> None:
        self.broker = broker
        self.config = config
        self.ssl: ssl.SSLContext | None = None
        self.tls_principal_field = "CN"
        self.require_cert = False
        if isinstance(tls, ssl.SSLContext):
            self.ssl = tls
        elif tls is not None and tls.enabled:
            self.ssl, self.require_cert = listener_context(tls)
            self.tls_principal_field = tls.tls_principal_field
        self.gate = gate_for(broker)
        #: What /metrics, /v1/stats/kafka and the dashboard show of this listener.
        self.stats = kafka_stats_for(broker)
        self.cluster_id = cluster_id_of(broker)
        self.host = config.kafka_host or config.host
        self.connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self.draining = False

    @property
    def port(self) -> int:
        """The port listened on (the real one when the configured port was 0)."""
        if self._server is None or not self._server.sockets:  # type: ignore[attr-defined]
            return self.config.kafka_port
        return int(self._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    @property
    def advertised_host(self) -> str:
        """The host Metadata gives clients: the configured one, else the bound address, else
        (a wildcard bound) this machine's name."""
        host = self.config.kafka_advertised_host or self.host
        return socket.gethostname() if host in _WILDCARDS else host

    @property
    def advertised_port(self) -> int:
        return self.config.kafka_advertised_port or self.port

    async def start(self) -> None:
        """Start listening on ``kafka_host:kafka_port``.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()

        def factory() -> asyncio.BaseProtocol:
            reader = asyncio.StreamReader(limit=_READ_LIMIT)
            return asyncio.StreamReaderProtocol(reader, self._connected)

        make: Any = factory
        if self.ssl is not None:
            make = tls_protocol_factory(factory, self.ssl, handshake_timeout_s=HANDSHAKE_TIMEOUT_S)
        port = max(self.config.kafka_port, 0)
        self._server = await loop.create_server(make, self.host, port)
        self.stats.listening(self.host, self.port)
        log.info(
            "Kafka listener on %s:%d%s, advertised as %s:%d",
            self.host,
            self.port,
            " (TLS)" if self.ssl else "",
            self.advertised_host,
            self.advertised_port,
        )

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.draining or len(self.connections) >= self.config.max_connections:
            log.warning("refusing a Kafka connection: max_connections or draining")
            writer.transport.abort()
            return
        conn = _Connection(self, reader, writer)
        self.connections.add(conn)
        self.stats.connection_opened()
        task = asyncio.get_running_loop().create_task(conn.run())
        self._handlers.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._handlers.discard(t)
            self.connections.discard(conn)
            self.stats.connection_closed()
            if not t.cancelled() and t.exception() is not None:
                log.error("a Kafka connection failed", exc_info=t.exception())

        task.add_done_callback(done)

    def stop_accepting(self) -> None:
        """Close the listening socket: new connections are refused from here on."""
        if self._server is not None:
            close_listener(self._server)
            self.stats.stopped()

    def in_flight(self) -> int:
        """Requests being handled, on every connection."""
        return sum(len(c.tasks) for c in self.connections)

    def begin_drain(self) -> None:
        """Read no new requests; each connection closes once its answers are sent."""
        self.draining = True
        for c in list(self.connections):
            c.stop_reading()

    async def wait_in_flight(self, deadline: float) -> int:
        """Wait until the requests in flight are answered, or the loop time ``deadline``;
        return how many still run."""
        pending = [t for c in self.connections for t in c.tasks]
        timeout = deadline - asyncio.get_running_loop().time()
        if pending and timeout > 0:
            await asyncio.wait(pending, timeout=timeout)
        return self.in_flight()

    async def finish(self) -> int:
        """Cancel what still runs, close every connection; how many requests were cut."""
        self.draining = True
        cut = [t for c in self.connections for t in c.tasks if not t.done()]
        for t in cut:
            t.cancel()
        for c in list(self.connections):
            c.stop_reading()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=FINAL_CLOSE_S)
        for c in list(self.connections):
            c.writer.transport.abort()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), FINAL_CLOSE_S)
            self._server = None
        return len(cut)

    async def close(self, *, grace_s: float | None = None) -> None:
        """Drain this listener alone (see the module docstring)."""
        grace = self.config.drain_timeout_s if grace_s is None else grace_s
        deadline = asyncio.get_running_loop().time() + grace
        self.stop_accepting()
        self.broker.release_waiters()
        self.begin_drain()
        await self.wait_in_flight(deadline)
        await self.finish()

    async def __aenter__(self) -> KafkaServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
