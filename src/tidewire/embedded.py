"""Embedded mode: a whole broker inside your program.

The same broker core and TCP server that ``tidewire serve`` runs, started by a Python
program, in its own event loop or on a background thread::

    from tidewire.embedded import EmbeddedBroker

    async with EmbeddedBroker("./data") as eb:          # listens on 127.0.0.1, a free port
        async with eb.client() as client:                # an AsyncClient connected to it
            await client.produce("events", 0, [Message(b"hello")])
        eb.broker.describe("events")                     # or call the broker core directly

    with EmbeddedBroker("./data").running() as eb:       # from plain synchronous code
        with Client(eb.addr) as client:
            client.produce("events", 0, [Message(b"hello")])

``http_port=0`` also serves the HTTP API (docs/http.md) on a free port, at
:attr:`EmbeddedBroker.http_url`; ``kafka_port=0`` serves Kafka's wire protocol (docs/kafka.md)
on a free port, at :attr:`EmbeddedBroker.kafka_bootstrap`.
``tls=TlsConfig(tls_cert_file=..., tls_key_file=...)`` puts every listener under TLS
(docs/security.md).

Leaving the ``async with`` (or the ``with``) drains like a SIGTERM to the server: every
listener stops accepting at once, long-polls and streams are answered, in-flight requests
finish (within ``drain_timeout_s`` of the ``server`` settings), every log is flushed and the
clean-shutdown marker is written. ``listen=False`` runs the broker core alone (no socket),
for programs that call it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tidewire.broker import Broker, BrokerConfig, BrokerStats
from tidewire.client import AsyncClient
from tidewire.errors import InvalidConfigError
from tidewire.security.config import SecurityConfig, TlsConfig
from tidewire.security.tls import server_context
from tidewire.server import ServerConfig, TcpServer
from tidewire.server.descriptors import fit_broker_listeners
from tidewire.server.drain import drain
from tidewire.server.http import HttpConfig
from tidewire.server.kafka.listener import KafkaServer
from tidewire.server.runtime import given_settings, listeners_of, record

if TYPE_CHECKING:
    from tidewire.server.http.gateway import HttpGateway

__all__ = ["EmbeddedBroker"]

#: How long :meth:`EmbeddedBroker.running` waits for the broker to start or to stop (s).
THREAD_TIMEOUT_S = 120.0


class EmbeddedBroker:
    """A broker (and, unless ``listen=False``, its TCP server) in this process.

    Args:
        data_dir: where the logs live (created if missing).
        host, port: where the server listens (``port=0``: a free port; see :attr:`addr`).
        listen: start the TCP server; ``False``: the broker core only.
        server: listener settings (``host``/``port`` above override its own).
        http_port: serve the HTTP API on this port too (0: a free one; see
            :attr:`http_url`); None: no HTTP, unless ``http`` enables it.
        http: the HTTP gateway's settings (``http_port`` above overrides its own; its
            ``http_host`` defaults to ``host``).
        kafka_port: serve Kafka's wire protocol on this port too (0: a free one; see
            :attr:`kafka_bootstrap`); None: as ``server`` says (``kafka_port``, off by
            default). It binds ``server.kafka_host``, else ``host``.
        security: authentication, authorization, audit and quotas (docs/security.md).
        tls: TLS of every listener (on when ``tls.enabled``; see docs/security.md).
        **broker_settings: :class:`~tidewire.broker.BrokerConfig` fields (for example
            ``default_partitions=3``, ``log=LogConfig(fsync=FsyncPolicy.ALWAYS)``).

    Raises:
        InvalidConfigError: a setting out of its range, or a TLS file that cannot be loaded.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        listen: bool = True,
        server: ServerConfig | None = None,
        http_port: int | None = None,
        http: HttpConfig | None = None,
        kafka_port: int | None = None,
        security: SecurityConfig | None = None,
        tls: TlsConfig | None = None,
        **broker_settings: Any,
    ) -> None:
        try:
            self.config = BrokerConfig(data_dir=str(data_dir), **broker_settings)
        except TypeError as exc:
            raise InvalidConfigError(f"not a broker setting: {exc}") from None
        self.server_config = replace(server or ServerConfig(), host=host, port=port)
        if kafka_port is not None:
            self.server_config = replace(self.server_config, kafka_port=kafka_port)
        http_config = http or HttpConfig(http_host=host)
        if http_port is not None:
            http_config = replace(http_config, http_port=http_port)
        self.http_config = http_config
        self.listen = listen
        self.tls = tls if tls is not None else TlsConfig()
        if self.tls.enabled:
            server_context(self.tls)  # a file that cannot be loaded is reported now
        self.broker = Broker(self.config, security=security)
        self.server: TcpServer | None = None
        self.gateway: HttpGateway | None = None
        self.kafka: KafkaServer | None = None

    @property
    def addr(self) -> str:
        """``"HOST:PORT"`` the server listens on (once started).

        Raises:
            RuntimeError: not listening.
        """
        if self.server is None:
            raise RuntimeError("the embedded broker is not listening")
        return f"{self.server_config.host}:{self.server.port}"

    @property
    def kafka_bootstrap(self) -> str:
        """``"HOST:PORT"`` of the Kafka listener (once started): a Kafka client's
        ``bootstrap.servers``.

        Raises:
            RuntimeError: Kafka's protocol is not served.
        """
        if self.kafka is None:
            raise RuntimeError("the embedded broker does not serve Kafka's protocol")
        return f"{self.kafka.advertised_host}:{self.kafka.advertised_port}"

    @property
    def http_url(self) -> str:
        """``"http://HOST:PORT"`` (``https://`` with TLS) of the HTTP API (once started).

        Raises:
            RuntimeError: the HTTP API is not served.
        """
        if self.gateway is None or "native" not in self.gateway.names:
            raise RuntimeError("the embedded broker does not serve the HTTP API")
        scheme = "https" if self.tls.enabled else "http"
        return f"{scheme}://{self.http_config.http_host}:{self.gateway.port}"

    async def start(self) -> None:
        """Open the data directory, then start listening (TCP, then HTTP if configured)."""
        await self.broker.start()
        try:
            # Every listener's connections under the descriptor limit (docs/configuration.md).
            self.server_config, self.http_config = fit_broker_listeners(
                self.broker, self.server_config, self.http_config, binary=self.listen
            )
            if self.listen:
                server = TcpServer(self.broker, self.server_config, tls=self.tls)
                await server.start()
                self.server = server
            if self.server_config.kafka_port != -1:
                kafka = KafkaServer(self.broker, self.server_config, tls=self.tls)
                await kafka.start()
                self.kafka = kafka
            if self.http_config.enabled:
                from tidewire.server.http.gateway import HttpGateway  # noqa: PLC0415 (heavy)

                gateway = HttpGateway.for_broker(self.broker, self.http_config, tls=self.tls)
                await gateway.start()
                self.gateway = gateway
            settings = given_settings(
                self.config,
                self.server_config,
                self.http_config,
                self.tls,
                self.broker.security_config,
                origin="program (EmbeddedBroker)",
            )
            listeners = listeners_of(
                self.server, self.gateway, tls=self.tls.enabled, kafka=self.kafka
            )
            record(self.broker, settings, listeners)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Drain as ``tidewire serve`` does at SIGTERM (:mod:`tidewire.server.drain`): every
        listener stops accepting at once, long-polls and streams are answered, requests in
        flight get up to the server's ``drain_timeout_s``, the logs are flushed and closed.

        Raises:
            StorageError: a log could not be flushed (the clean-shutdown marker is then not
                written, so the next start recovers).
        """
        gateway, self.gateway = self.gateway, None
        server, self.server = self.server, None
        kafka, self.kafka = self.kafka, None
        await drain(
            self.broker, server, gateway, grace_s=self.server_config.drain_timeout_s, kafka=kafka
        )

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> BrokerStats:
        """A copy of the broker's counters since it started: messages ``published``,
        ``delivered`` (to readers over the binary protocol: fetch, group consumers and push
        subscriptions) and ``dropped`` (skipped by best-effort subscriptions that lagged
        beyond their ``max_lag_bytes``; nothing else is dropped)."""
        return replace(self.broker.stats)

    def client(self, **options: Any) -> AsyncClient:
        """An :class:`~tidewire.client.AsyncClient` for this broker (``options``: its own;
        with TLS, give it ``tls=TlsOptions(ca_file=...)``)."""
        return AsyncClient(self.addr, **options)

    @contextlib.contextmanager
    def running(self) -> Iterator[EmbeddedBroker]:
        """Run the broker on a background thread with its own event loop, for synchronous
        programs; leaving the ``with`` drains it and joins the thread.

        Raises:
            InvalidConfigError, StorageError, OSError: it could not start (raised here).
        """
        loop = asyncio.new_event_loop()
        #: The background thread's loop (while running), for work on the broker from here.
        self.loop = loop
        started = threading.Event()
        failure: list[BaseException] = []
        stop: asyncio.Event | None = None

        async def main() -> None:
            nonlocal stop
            stop = asyncio.Event()
            try:
                await self.start()
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            await stop.wait()
            try:
                await self.close()
            except BaseException as exc:  # raised to the caller after the thread ends
                failure.append(exc)

        thread = threading.Thread(
            target=loop.run_until_complete, args=(main(),), name="tidewire embedded broker"
        )
        thread.start()
        try:
            if not started.wait(THREAD_TIMEOUT_S):
                raise TimeoutError(f"the embedded broker did not start in {THREAD_TIMEOUT_S} s")
            if failure:
                raise failure.pop()
            yield self
        finally:
            if stop is not None:
                loop.call_soon_threadsafe(stop.set)
            thread.join(THREAD_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()
        if failure:  # the drain failed (a log could not be flushed)
            raise failure.pop()
