"""The HTTP gateway's settings (the ``[http]`` table of ``tidewire serve``'s configuration)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidewire.errors import InvalidConfigError

__all__ = [
    "DEFAULT_ALLOWED_HOSTS",
    "DEFAULT_ALLOWED_ORIGINS",
    "DEFAULT_BODY_TIMEOUT_MS",
    "DEFAULT_HEADER_TIMEOUT_MS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_SOURCE",
    "DEFAULT_MAX_INFLIGHT_BODY_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MSGBUS_MAX_PAYLOAD_BYTES",
    "DEFAULT_MSGBUS_TTL_MS",
    "DEFAULT_SESSION_IDLE_MS",
    "OFF",
    "SAME_ORIGIN",
    "HttpConfig",
    "split_list",
]

#: The port value that leaves a listener off.
OFF = -1
#: The largest request body accepted by default: a message of the default ``max_batch_bytes``
#: (16 MiB) sent as base64 grows by a third, to 21.3 MiB, plus its JSON; 32 MiB holds it,
#: and bounds what one request may make the broker buffer.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
#: msgbus' own default largest payload (its ``DefaultMaxPayloadSize``, 8 KB): a larger
#: publish on the msgbus listener is answered 413, as msgbus answers it.
DEFAULT_MSGBUS_MAX_PAYLOAD_BYTES = 8192
#: msgbus' topic TTL as its README shows it (``"ttl": 60000000000``, a Go duration: 60 s): a
#: message not popped within it expires.
DEFAULT_MSGBUS_TTL_MS = 60_000
#: The longest msgbus TTL accepted, ms (ten years: "for ever" is 0).
_MAX_MSGBUS_TTL_MS = 10 * 365 * 24 * 3600 * 1000
#: Bytes of request bodies being received and handled at once, over every listener: two
#: bodies of the largest default size. The handlers hold a few copies of a body (the bytes,
#: the decoded message, the record batch), so this keeps a flood of large publishes to a few
#: hundred MB instead of growing with the number of connections (503 beyond it).
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 64 * 1024 * 1024
#: A request's line and headers must arrive within this time of its first byte (of the
#: connection's opening, for its first request), ms: a client on any real network sends them
#: in one or two packets; a slow-headers ("slowloris") connection is closed after it.
DEFAULT_HEADER_TIMEOUT_MS = 10_000
#: The longest silence while a request body is expected (the broker is reading it), ms: a
#: client that stops sending its body mid-way frees its connection and its share of
#: ``http_max_inflight_body_bytes`` after it.
DEFAULT_BODY_TIMEOUT_MS = 30_000
#: Connections open at once per listener: each holds a file descriptor and up to ~64 KiB of
#: buffers; 1,000 stays well below common descriptor limits (1,024 soft at the least, and
#: ``tidewire serve`` raises it), leaving room for the logs' segment files.
DEFAULT_MAX_CONNECTIONS = 1_000
#: Connections open at once from one client address, over every listener: far more than a
#: browser (6 per host) or a client pool uses, and a tenth of a listener's, so one client
#: cannot take every connection. Behind a reverse proxy (one address), raise it to
#: ``http_max_connections``.
DEFAULT_MAX_CONNECTIONS_PER_SOURCE = 100
#: A browser session ends after this long idle, ms: a working day (8 hours).
DEFAULT_SESSION_IDLE_MS = 8 * 3600 * 1000
#: Browser sessions kept at once: each is a few hundred bytes, so 10,000 (far more browsers
#: than an operations team has) stay within a few MB.
DEFAULT_MAX_SESSIONS = 10_000
#: Host names accepted in the ``Host`` header besides IP addresses (see :class:`HttpConfig`).
DEFAULT_ALLOWED_HOSTS = "localhost"
#: The keyword of ``http_allowed_origins`` for pages of the broker's own origin.
SAME_ORIGIN = "same-origin"
#: Browser origins allowed by default: only pages served by the listener itself.
DEFAULT_ALLOWED_ORIGINS = SAME_ORIGIN
#: Host names: letters, digits, ``-``, ``.``, ``_`` (a leading ``*.`` matches subdomains).
_HOST_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
#: An origin: scheme, host (a name or an address) and an optional port, nothing after (a
#: trailing slash, as a copied address has, is forgiven).
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?/?")


def _port_ok(port: int) -> bool:
    return port == OFF or 0 <= port <= 65535


def split_list(value: str) -> list[str]:
    """The items of a comma-separated setting, stripped, without empty ones."""
    return [item.strip() for item in value.split(",") if item.strip()]


#: The values of ``http_cluster_routing``.
CLUSTER_ROUTINGS = ("forward", "redirect")


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """Settings of the HTTP gateway, validated on construction.

    Attributes:
        http_host: the address every HTTP listener binds.
        http_port: port of the native API (``/v1``, ``/healthz``, ``/openapi.json``, ``/docs``);
            ``-1``: no HTTP listener, ``0``: any free port.
        http_max_body_bytes: the longest request body accepted (413 beyond it).
        http_msgbus_port: port of the msgbus-compatible API; ``-1``: off, ``0``: any free.
        http_ipubsub_port: port of the iPubSub-compatible API; ``-1``: off, ``0``: any free.
        http_msgbus_max_payload_bytes: the largest message the msgbus listener takes (413
            beyond it; ``http_max_body_bytes`` bounds it too); msgbus' default, 8,192.
        http_msgbus_ttl_ms: how long a message published on the msgbus listener may wait to
            be popped (then it expires: never handed out), ms; ``0``: no expiry; msgbus'
            default, 60,000.
        http_max_inflight_body_bytes: request bodies being received and handled at once,
            over every listener (bytes, counted by their length; at least
            ``http_max_body_bytes`` is taken, see :attr:`inflight_body_bytes`); a body beyond it is
            answered 503 with ``Retry-After`` before it is read. Bodies of 64 KiB or less
            are always taken (their memory is bounded by the connection caps).
        http_header_timeout_ms: a request's line and headers must arrive within this of its
            first byte (of the connection's opening for its first request); else the
            connection is closed (408 when part of a request came).
        http_body_timeout_ms: the longest silence while a request body is being read;
            then 408 and the connection is closed.
        http_max_connections: connections open at once per listener; one more is answered
            503 (``Retry-After``) and closed.
        http_max_connections_per_source: connections open at once from one client address,
            over every listener; likewise (a value above ``http_max_connections`` leaves only
            the listener's cap).
        http_allowed_hosts: comma-separated host names accepted in the ``Host`` header
            (``*.example.com``: its subdomains; ``*``: any), besides IP addresses, the name
            ``http_host`` binds and, when it binds every address, this machine's host
            name; any other ``Host`` is answered 421 (a defence against DNS rebinding).
        http_allowed_origins: comma-separated browser origins (``https://dash.example.com``)
            whose pages may call the listeners, ``same-origin`` for pages the listener
            served itself (the ``Origin`` matches the ``Host``), ``*`` for any; a request
            from another page is answered 403. Requests without ``Origin`` (curl, clients)
            are not browsers' cross-site requests and pass.
        http_session_idle_ms: a browser session (``/v1/session``) ends after this long
            without a request, ms.
        http_max_sessions: browser sessions kept at once; logging one more in ends the
            least recently used.
        http_cluster_routing: in a cluster, how a node answers a request for a partition it
            cannot serve (a publish led by another node, a read of a partition it holds no
            replica of, a consumer group it does not coordinate): ``forward`` (default) sends
            it to the node that can, as the node itself, and answers with what that node
            answered; ``redirect`` answers ``307`` to that node's HTTP listener, for clients
            that go there themselves (docs/cluster.md, "The HTTP API in a cluster").
        metrics_enabled: serve ``/metrics`` and ``/v1/metrics/recent`` and count requests
            and connections for them (docs/observability.md); ``False``: neither.
        metrics_port: a listener of its own serving only ``GET /metrics`` (behind the same
            gate: with authentication on a scrape sends an API key), for a scraper kept off
            the API's port; ``-1``: off, ``0``: any free port.
        metrics_max_partition_series: partitions (of topics, and of groups' committed
            offsets) with series of their own in ``/metrics``; beyond it only per-topic and
            per-group aggregates (a warning says so once).
        metrics_sample_interval_s: seconds between the recent samples behind the
            dashboard's charts (0.1..3,600; an hour of them is kept).

    Raises:
        InvalidConfigError: a value out of its range.
    """

    http_host: str = "127.0.0.1"
    http_port: int = OFF
    http_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    http_msgbus_port: int = OFF
    http_ipubsub_port: int = OFF
    http_msgbus_max_payload_bytes: int = DEFAULT_MSGBUS_MAX_PAYLOAD_BYTES
    http_msgbus_ttl_ms: int = DEFAULT_MSGBUS_TTL_MS
    http_max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES
    http_header_timeout_ms: int = DEFAULT_HEADER_TIMEOUT_MS
    http_body_timeout_ms: int = DEFAULT_BODY_TIMEOUT_MS
    http_max_connections: int = DEFAULT_MAX_CONNECTIONS
    http_max_connections_per_source: int = DEFAULT_MAX_CONNECTIONS_PER_SOURCE
    http_allowed_hosts: str = DEFAULT_ALLOWED_HOSTS
    http_allowed_origins: str = DEFAULT_ALLOWED_ORIGINS
    http_session_idle_ms: int = DEFAULT_SESSION_IDLE_MS
    http_max_sessions: int = DEFAULT_MAX_SESSIONS
    http_cluster_routing: str = "forward"
    metrics_enabled: bool = True
    metrics_port: int = OFF
    metrics_max_partition_series: int = 10_000
    metrics_sample_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.metrics_max_partition_series < 0:
            raise InvalidConfigError(
                f"metrics_max_partition_series={self.metrics_max_partition_series:,} must be >= 0"
            )
        if not 0.1 <= self.metrics_sample_interval_s <= 3600:
            raise InvalidConfigError(
                f"metrics_sample_interval_s={self.metrics_sample_interval_s} must be within "
                "0.1..3,600"
            )
        if not self.http_host:
            raise InvalidConfigError("http_host must not be empty")
        if self.http_cluster_routing not in CLUSTER_ROUTINGS:
            raise InvalidConfigError(
                f"http_cluster_routing={self.http_cluster_routing!r} must be one of "
                + ", ".join(CLUSTER_ROUTINGS)
            )
        for name in ("http_port", "http_msgbus_port", "http_ipubsub_port", "metrics_port"):
            value = getattr(self, name)
            if not _port_ok(value):
                raise InvalidConfigError(
                    f"{name}={value} must be within 0..65535 (0: any free port) or -1 (off)"
                )
        # Below 1 KiB not even a small JSON publish fits; above 1 GiB one request could
        # take the broker's memory.
        if not 1024 <= self.http_max_body_bytes <= 1024**3:
            raise InvalidConfigError(
                f"http_max_body_bytes={self.http_max_body_bytes:,} must be within "
                "1,024..1,073,741,824"
            )
        if not 1 <= self.http_msgbus_max_payload_bytes <= 1024**3:
            raise InvalidConfigError(
                f"http_msgbus_max_payload_bytes={self.http_msgbus_max_payload_bytes:,} must be "
                "within 1..1,073,741,824"
            )
        if not 0 <= self.http_msgbus_ttl_ms <= _MAX_MSGBUS_TTL_MS:
            raise InvalidConfigError(
                f"http_msgbus_ttl_ms={self.http_msgbus_ttl_ms:,} must be within "
                f"0..{_MAX_MSGBUS_TTL_MS:,} (ms; 0: messages never expire)"
            )
        # A body of the largest size always fits: the budget taken is at least
        # http_max_body_bytes (see inflight_body_bytes), so no pair of values is refused.
        if not 1024 <= self.http_max_inflight_body_bytes <= 64 * 1024**3:
            raise InvalidConfigError(
                f"http_max_inflight_body_bytes={self.http_max_inflight_body_bytes:,} must be "
                "within 1,024..68,719,476,736"
            )
        # Below 100 ms a client on a slow link fails; above 10 minutes a slow client holds
        # its connection (and its body's memory) for too long.
        for name in ("http_header_timeout_ms", "http_body_timeout_ms"):
            value = getattr(self, name)
            if not 100 <= value <= 600_000:
                raise InvalidConfigError(f"{name}={value:,} must be within 100..600,000 (ms)")
        if not 1 <= self.http_max_connections <= 1_000_000:
            raise InvalidConfigError(
                f"http_max_connections={self.http_max_connections:,} must be within 1..1,000,000"
            )
        if not 1 <= self.http_max_connections_per_source <= 1_000_000:
            raise InvalidConfigError(
                "http_max_connections_per_source="
                f"{self.http_max_connections_per_source:,} must be within 1..1,000,000"
            )
        for host in split_list(self.http_allowed_hosts):
            if host != "*" and not _HOST_NAME.fullmatch(host):
                raise InvalidConfigError(
                    f"http_allowed_hosts: {host!r} is not a host name (letters, digits, "
                    "'-', '.', '_'; '*.example.com' for subdomains; '*' for any)"
                )
        if not split_list(self.http_allowed_hosts):
            raise InvalidConfigError("http_allowed_hosts must name at least one host (or '*')")
        origins = split_list(self.http_allowed_origins)
        if not origins:
            raise InvalidConfigError(
                f"http_allowed_origins must name at least one origin, {SAME_ORIGIN!r} or '*'"
            )
        for origin in origins:
            if origin not in ("*", SAME_ORIGIN) and not _ORIGIN.fullmatch(origin):
                raise InvalidConfigError(
                    f"http_allowed_origins: {origin!r} is not an origin such as "
                    f"'https://dash.example.com:8443' (nor {SAME_ORIGIN!r} or '*')"
                )

        # A minute at least (a page polls more often than that); a week at most, so a
        # forgotten browser does not stay logged in for ever.
        if not 60_000 <= self.http_session_idle_ms <= 7 * 24 * 3600 * 1000:
            raise InvalidConfigError(
                f"http_session_idle_ms={self.http_session_idle_ms:,} must be within "
                "60,000..604,800,000 (ms: a minute to a week)"
            )
        if not 1 <= self.http_max_sessions <= 1_000_000:
            raise InvalidConfigError(
                f"http_max_sessions={self.http_max_sessions:,} must be within 1..1,000,000"
            )

    @property
    def inflight_body_bytes(self) -> int:
        """The body budget in force: ``http_max_inflight_body_bytes``, or
        ``http_max_body_bytes`` when that is larger (a body of the largest size must fit)."""
        return max(self.http_max_inflight_body_bytes, self.http_max_body_bytes)

    @property
    def enabled(self) -> bool:
        """Whether any HTTP listener is configured."""
        ports = (self.http_port, self.http_msgbus_port, self.http_ipubsub_port, self.metrics_port)
        return any(p != OFF for p in ports)
