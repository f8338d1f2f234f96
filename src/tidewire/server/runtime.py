"""What a running broker was started with, for the routes that report it: the settings in
effect (with where each came from) and the listeners serving it.

``tidewire serve`` and :class:`~tidewire.embedded.EmbeddedBroker` record them here once their
listeners are up (:func:`record`); ``GET /v1/settings`` and ``/healthz/listeners`` read them
(:func:`runtime_of`). A broker started some other way has nothing recorded, and those routes
say so.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidewire.broker import Broker, BrokerConfig
    from tidewire.config import Settings
    from tidewire.security.config import SecurityConfig, TlsConfig
    from tidewire.server import ServerConfig
    from tidewire.server.http import HttpConfig
    from tidewire.server.http.gateway import HttpGateway
    from tidewire.server.kafka.listener import KafkaServer
    from tidewire.server.tcp import TcpServer

__all__ = ["Listener", "Runtime", "given_settings", "listeners_of", "record", "runtime_of"]


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket.

    Attributes:
        name: ``binary`` (the TCP protocol), ``kafka`` (Kafka's wire protocol), or the HTTP
            listener's name (``native``, ``msgbus``, ``ipubsub``).
        host: the address it binds.
        port: the port it is bound to.
        tls: whether it speaks TLS.
    """

    name: str
    host: str
    port: int
    tls: bool


@dataclass(slots=True)
class Runtime:
    """What :func:`record` recorded for one broker (empty until then)."""

    settings: Settings | None = None
    listeners: list[Listener] = field(default_factory=list)


_RUNTIMES: weakref.WeakKeyDictionary[Broker, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(broker: Broker) -> Runtime:
    """What was recorded for ``broker`` (an empty :class:`Runtime` when nothing was)."""
    return _RUNTIMES.get(broker) or Runtime()


def record(broker: Broker, settings: Settings, listeners: list[Listener]) -> None:
    """Record ``broker``'s settings in effect and its listeners (replacing what was)."""
    _RUNTIMES[broker] = Runtime(settings, list(listeners))


def listeners_of(
    server: TcpServer | None,
    gateway: HttpGateway | None,
    *,
    tls: bool,
    kafka: KafkaServer | None = None,
) -> list[Listener]:
    """The listeners of a TCP server, an HTTP gateway and a Kafka listener (each may be
    None)."""
    out: list[Listener] = []
    if server is not None:
        out.append(Listener("binary", server.config.host, server.port, tls))
    if kafka is not None:
        out.append(Listener("kafka", kafka.host, kafka.port, tls))
    if gateway is not None:
        for name in gateway.names:
            out.append(Listener(name, gateway.host_of(name), gateway.port_of(name), tls))
    return out


def given_settings(
    broker: BrokerConfig,
    server: ServerConfig,
    http: HttpConfig,
    tls: TlsConfig,
    security: SecurityConfig,
    *,
    origin: str,
) -> Settings:
    """The :class:`~tidewire.config.Settings` of config objects a program built itself: a
    value that differs from its default came from ``origin``."""
    from tidewire.config import SETTINGS, Settings  # noqa: PLC0415 (config imports the server)

    s = Settings(broker=broker, server=server, http=http, origins={}, tls=tls, security=security)
    origins = {x.key: "default" if s.value(x.key) == x.default else origin for x in SETTINGS}
    return replace(s, origins=origins)
