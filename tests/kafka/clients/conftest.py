"""A tidewire broker with its Kafka listener (and its own binary-protocol listener, for the
cross-protocol tests) for the real-client suites, plus the tools they share: a TCP proxy whose
connections a test can cut, and bounded waiting.

The broker runs on an event loop in a thread of its own, because the Kafka clients under test
block (kafka-python, confluent-kafka) or bring their own loop (aiokafka). Timeouts are small
so groups form in well under a second; every wait is bounded by :data:`WITHIN_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.kafka_groups import KafkaGroupConfig
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key
from tidewire.security.model import Acl, Operation, PatternType, ResourceType
from tidewire.server import TcpServer
from tidewire.server.kafka.listener import KafkaServer
from tidewire.server.tcp import ServerConfig

T = TypeVar("T")

#: The bound on anything the clients should reach (s): generous for a loaded 2-core box.
WITHIN_S = 30.0
#: Keys, values and header values of the messages the suites produce.
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class Running:
    """A broker with its Kafka and binary-protocol listeners, on a loop in its own thread.

    Args:
        tmp_path: where the data directory goes.
        security: authentication and ACLs (None: open).
        advertised_port: the port Metadata advertises (0: the listener's own), so clients
            can be sent through a proxy.
    """

    def __init__(
        self, tmp_path: Path, security: SecurityConfig | None = None, advertised_port: int = 0
    ) -> None:
        self.tmp_path = tmp_path
        self.security = security
        self.advertised_port = advertised_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.broker: Broker
        self.kafka: KafkaServer
        self.tcp: TcpServer

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the broker's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WITHIN_S)

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` on the broker's loop (the broker's state belongs to it)."""

        async def call() -> T:
            return fn()

        return self.call(call())

    def start(self) -> None:
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        cfg = BrokerConfig(
            data_dir=str(self.tmp_path / "data"),
            kafka_groups=KafkaGroupConfig(initial_rebalance_delay_ms=100),
        )
        self.broker = Broker(cfg) if self.security is None else Broker(cfg, security=self.security)
        await self.broker.start()
        self.kafka = KafkaServer(
            self.broker,
            ServerConfig(
                host="127.0.0.1", kafka_port=0, kafka_advertised_port=self.advertised_port
            ),
        )
        await self.kafka.start()
        self.tcp = TcpServer(self.broker, ServerConfig(host="127.0.0.1", port=0))
        await self.tcp.start()

    async def _stop(self) -> None:
        await self.kafka.close(grace_s=1.0)
        await self.tcp.close(grace_s=1.0)
        await self.broker.close()

    def stop(self) -> None:
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WITHIN_S)
            self.loop.close()

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the Kafka listener."""
        return f"127.0.0.1:{self.kafka.port}"

    @property
    def tidewire_addr(self) -> str:
        """``host:port`` of tidewire's binary protocol."""
        return f"127.0.0.1:{self.tcp.port}"

    def create_topic(self, name: str, partitions: int) -> None:
        self.call(self.broker.create_topic_async(name, partitions))

    def end_offsets(self, topic: str, partitions: int) -> list[int]:
        """The high watermark of each partition of ``topic``."""
        return self.on_loop(
            lambda: [self.broker.high_watermark(topic, p) for p in range(partitions)]
        )

    def new_user(self, name: str) -> tuple[str, str]:
        """A principal ``name`` with an API key: its SCRAM username and password."""

        async def make() -> str:
            await self.broker.security.create_principal(name, roles=())
            return (await self.broker.security.create_key(name))[1]

        return parse_key(self.call(make()))

    def allow(self, principal: str, topic_prefix: str, operation: Operation) -> None:
        """Let ``principal`` do ``operation`` on the topics named ``topic_prefix``*."""
        acl = Acl(
            principal=principal,
            resource_type=ResourceType.TOPIC,
            pattern=topic_prefix,
            pattern_type=PatternType.PREFIX,
            operation=operation,
        )
        self.call(self.broker.security.add_acls([acl]))


@contextlib.contextmanager
def running_broker(tmp_path: Path, **kw: Any) -> Iterator[Running]:
    r = Running(tmp_path, **kw)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    with running_broker(tmp_path) as r:
        yield r


def wait_until(what: str, ok: Callable[[], bool], within_s: float = WITHIN_S) -> None:
    """Poll ``ok`` until it holds; fail naming ``what`` after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        time.sleep(0.05)


class Proxy:
    """A TCP proxy in front of a listener, in threads; :meth:`cut` closes every connection
    through it (both sides, at once), as a network failure would, and keeps accepting.

    Args:
        upstream_port: set before the first client connects (the broker may start after the
            proxy, so that it can advertise the proxy's port).
    """

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.upstream_port = 0
        self.cuts = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self.connections += 1
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for s in socks:
                self._open.discard(s)
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def cut(self) -> int:
        """Close every connection through the proxy; returns how many sockets were open."""
        with self._lock:
            socks = list(self._open)
        self._drop(*socks)
        self.cuts += 1
        return len(socks)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.sock.close()
        self.cut()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Running, Proxy]]:
    """A broker whose Metadata advertises a proxy in front of its Kafka listener."""
    proxy = Proxy()
    try:
        with running_broker(tmp_path, advertised_port=proxy.port) as r:
            proxy.upstream_port = r.kafka.port
            yield r, proxy
    finally:
        proxy.close()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Running]:
    """A broker that requires authentication (superuser ``admin``)."""
    with running_broker(
        tmp_path,
        security=SecurityConfig(authentication=True, superusers="admin", auth_failure_delay_ms=0),
    ) as r:
        yield r
