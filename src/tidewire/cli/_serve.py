"""``tidewire serve`` and ``tidewire config``: run a broker with settings from a TOML file,
``TIDEWIRE_*`` environment variables and flags (see :mod:`tidewire.config`), and write the
default configuration file."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidewire import __version__
from tidewire.broker import Broker
from tidewire.config import (
    SECTIONS,
    SETTINGS,
    Settings,
    default_toml,
    load_settings,
    toml_value,
    unknown_env_vars,
)
from tidewire.errors import InvalidConfigError, StorageError, TidewireError
from tidewire.observability.logs import configure_logging
from tidewire.observability.tracing import setup_tracing
from tidewire.security.config import check_exposure
from tidewire.security.tls import server_context
from tidewire.server import TcpServer
from tidewire.server.descriptors import fit_broker_listeners
from tidewire.server.drain import drain
from tidewire.server.runtime import listeners_of, record
from tidewire.server.tcp import loop_factory
from tidewire.storage import FsyncPolicy

from ._common import EXIT_ERROR, EXIT_USAGE, echo_json, fail

if TYPE_CHECKING:
    from tidewire.cluster.fetcher import Connect
    from tidewire.cluster.node import ClusterNode
    from tidewire.server.http.gateway import HttpGateway
    from tidewire.server.kafka.listener import KafkaServer

#: Kept in step with tidewire.cluster.node (not imported: etcd's client loads only for a
#: cluster).
DEFAULT_SESSION_TIMEOUT_S = 6

__all__ = ["config_app", "serve"]

log = logging.getLogger("tidewire")

config_app = typer.Typer(
    name="config",
    help="The configuration file of tidewire serve.",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar="TIDEWIRE_CONFIG",
        show_envvar=True,
        help="A TOML configuration file (see: tidewire config init).",
        dir_okay=False,
    ),
]


def _help(key: str, text: str) -> str:
    """An option's help: ``text``, then the setting's default and environment variable (from
    :data:`~tidewire.config.SETTINGS`, so --help shows what the config classes say)."""
    setting = _SETTINGS[key]
    default = setting.default
    if isinstance(default, bool):
        shown = setting.flag if default else "--no-" + setting.flag.removeprefix("--")
    elif isinstance(default, int) and abs(default) >= 10_000:  # not ports
        shown = f"{default:,}"
    else:
        shown = str(default)
    return f"{text}  [default: {shown}; env: {setting.env}]"


_SETTINGS = {s.key: s for s in SETTINGS}


def serve(
    config: ConfigOption = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help=_help("data_dir", "Where the logs live (created if missing)."),
            show_default=False,
        ),
    ] = None,
    default_partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            help=_help("default_partitions", "Partitions of a topic created without a count."),
            show_default=False,
        ),
    ] = None,
    auto_create_topics: Annotated[
        bool | None,
        typer.Option(
            "--auto-create/--no-auto-create",
            help=_help("auto_create_topics", "Create a topic on its first publish."),
            show_default=False,
        ),
    ] = None,
    max_fetch_waiters: Annotated[
        int | None,
        typer.Option(
            help=_help("max_fetch_waiters", "Long-poll fetches waiting at once."),
            show_default=False,
        ),
    ] = None,
    max_wait_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("max_wait_ms", "The longest a fetch may wait for data (ms)."),
            show_default=False,
        ),
    ] = None,
    max_open_files: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "max_open_files", "Log files kept open at once (0: from the descriptor limit)."
            ),
            show_default=False,
        ),
    ] = None,
    max_partitions: Annotated[
        int | None,
        typer.Option(
            help=_help("max_partitions", "Partitions of all topics together."),
            show_default=False,
        ),
    ] = None,
    stream_partitions: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "stream_partitions",
                "Partitions of the streams' shared log (fixed at its creation).",
            ),
            show_default=False,
        ),
    ] = None,
    stream_segment_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_segment_bytes", "Segment size of the streams' log, bytes."),
            show_default=False,
        ),
    ] = None,
    stream_default_ttl_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_default_ttl_ms", "TTL of a stream message sent without one, ms."),
            show_default=False,
        ),
    ] = None,
    stream_max_ttl_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_max_ttl_ms", "The longest TTL of a stream message, ms."),
            show_default=False,
        ),
    ] = None,
    stream_ring_size: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_ring_size", "Messages that may wait in a stream (its ring)."),
            show_default=False,
        ),
    ] = None,
    stream_idle_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_idle_ms", "Forget an empty, idle stream after this long, ms."),
            show_default=False,
        ),
    ] = None,
    stream_dedup_window: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_dedup_window", "Uuids remembered per stream for deduplication."),
            show_default=False,
        ),
    ] = None,
    stream_max_count: Annotated[
        int | None,
        typer.Option(help=_help("stream_max_count", "Streams at once."), show_default=False),
    ] = None,
    stream_max_receivers: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_max_receivers", "Stream receives and reads waiting at once."),
            show_default=False,
        ),
    ] = None,
    stream_max_wait_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_max_wait_ms", "The longest a stream long-poll may wait, ms."),
            show_default=False,
        ),
    ] = None,
    stream_max_message_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("stream_max_message_bytes", "The largest stream message value, bytes."),
            show_default=False,
        ),
    ] = None,
    fetch_max_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("fetch_max_bytes", "The most data one fetch answer carries (bytes)."),
            show_default=False,
        ),
    ] = None,
    preallocate_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "preallocate_bytes",
                "Zeros written ahead of a busy fsync=always partition's appends, so that its "
                "fsyncs need not grow the file (bytes; 0: off).",
            ),
            show_default=False,
        ),
    ] = None,
    fsync: Annotated[
        FsyncPolicy | None,
        typer.Option(
            help=_help(
                "fsync",
                "Durability of new topics: always (ack after fsync, group commit), "
                "interval (fsync every --flush-interval-ms), never.",
            ),
            show_default=False,
        ),
    ] = None,
    flush_interval_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("flush_interval_ms", "fsync period under --fsync interval (ms)."),
            show_default=False,
        ),
    ] = None,
    segment_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("segment_bytes", "Segment size of new topics."), show_default=False
        ),
    ] = None,
    segment_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("segment_ms", "Segment age of new topics (ms)."), show_default=False
        ),
    ] = None,
    retention_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("retention_ms", "Retention by age of new topics (ms; -1: keep)."),
            show_default=False,
        ),
    ] = None,
    retention_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("retention_bytes", "Retention by size of new topics (bytes; -1: keep)."),
            show_default=False,
        ),
    ] = None,
    max_message_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "max_message_bytes", "The largest message (record batch) new topics accept."
            ),
            show_default=False,
        ),
    ] = None,
    max_batch_bytes: Annotated[
        int | None,
        typer.Option(help="Deprecated: --max-message-bytes.", hidden=True),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help=_help("host", "Address to listen on."), show_default=False),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help=_help("port", "TCP port of the binary protocol (0: any free)."),
            show_default=False,
        ),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help=_help("max_connections", "Client connections at once."), show_default=False
        ),
    ] = None,
    max_frame_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("max_frame_bytes", "The longest protocol frame accepted."),
            show_default=False,
        ),
    ] = None,
    max_in_flight: Annotated[
        int | None,
        typer.Option(
            help=_help("max_in_flight", "Requests per connection before reads pause."),
            show_default=False,
        ),
    ] = None,
    max_unsent_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "max_unsent_bytes",
                "Per connection: bytes of fetch answers unsent before fetches wait.",
            ),
            show_default=False,
        ),
    ] = None,
    idle_timeout_s: Annotated[
        float | None,
        typer.Option(
            help=_help("idle_timeout_s", "Close a connection silent for this long (s)."),
            show_default=False,
        ),
    ] = None,
    frame_timeout_s: Annotated[
        float | None,
        typer.Option(
            help=_help("frame_timeout_s", "Close a connection whose frame takes this long (s)."),
            show_default=False,
        ),
    ] = None,
    drain_timeout_s: Annotated[
        float | None,
        typer.Option(
            help=_help(
                "drain_timeout_s", "At a stop, how long requests in flight may take to finish (s)."
            ),
            show_default=False,
        ),
    ] = None,
    event_loop: Annotated[
        str | None,
        typer.Option(
            help=_help("event_loop", "auto (uvloop when installed), asyncio or uvloop."),
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            help=_help("log_format", "Log lines as text, or json (one object per line)."),
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            help=_help("log_level", "Log from this level: DEBUG, INFO, WARNING, ERROR, CRITICAL."),
            show_default=False,
        ),
    ] = None,
    tracing_enabled: Annotated[
        bool | None,
        typer.Option(
            help=_help(
                "tracing_enabled",
                "Export OpenTelemetry traces over OTLP (needs tidewire[otel]); OTEL_* "
                "variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER) turn it on too.",
            ),
            show_default=False,
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            help=_help("otlp_endpoint", "OTLP/HTTP endpoint of the traces (http://host:4318)."),
            show_default=False,
        ),
    ] = None,
    kafka_port: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "kafka_port", "Port of Kafka's wire protocol (-1: off; 0: any free; Kafka: 9092)."
            ),
            show_default=False,
        ),
    ] = None,
    kafka_host: Annotated[
        str | None,
        typer.Option(
            help=_help("kafka_host", "Address the Kafka listener binds (empty: --host's)."),
            show_default=False,
        ),
    ] = None,
    kafka_advertised_host: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "kafka_advertised_host",
                "Host Kafka clients are told to connect to (empty: the bound one).",
            ),
            show_default=False,
        ),
    ] = None,
    kafka_advertised_port: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "kafka_advertised_port", "Port Kafka clients are told to connect to (0: bound)."
            ),
            show_default=False,
        ),
    ] = None,
    http_host: Annotated[
        str | None,
        typer.Option(
            help=_help("http_host", "Address the HTTP listeners bind."), show_default=False
        ),
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            help=_help("http_port", "Port of the HTTP API (-1: off; 0: any free)."),
            show_default=False,
        ),
    ] = None,
    http_max_body_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help("http_max_body_bytes", "The longest HTTP request body accepted."),
            show_default=False,
        ),
    ] = None,
    http_cluster_routing: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "http_cluster_routing",
                "In a cluster: 'forward' a request another node serves to it (default), or "
                "'redirect' (307) the client there.",
            ),
            show_default=False,
        ),
    ] = None,
    http_msgbus_port: Annotated[
        int | None,
        typer.Option(
            help=_help("http_msgbus_port", "Port of the msgbus-compatible HTTP API (-1: off)."),
            show_default=False,
        ),
    ] = None,
    http_ipubsub_port: Annotated[
        int | None,
        typer.Option(
            help=_help("http_ipubsub_port", "Port of the iPubSub-compatible HTTP API (-1: off)."),
            show_default=False,
        ),
    ] = None,
    http_msgbus_max_payload_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_msgbus_max_payload_bytes",
                "The largest msgbus message (bytes; msgbus': 8,192).",
            ),
            show_default=False,
        ),
    ] = None,
    http_msgbus_ttl_ms: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_msgbus_ttl_ms", "A msgbus message expires unpopped after this (ms; 0: never)."
            ),
            show_default=False,
        ),
    ] = None,
    http_max_inflight_body_bytes: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_max_inflight_body_bytes", "Bytes of HTTP request bodies in flight at once."
            ),
            show_default=False,
        ),
    ] = None,
    http_header_timeout_ms: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_header_timeout_ms", "A request's headers must arrive within this (ms)."
            ),
            show_default=False,
        ),
    ] = None,
    http_body_timeout_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("http_body_timeout_ms", "The longest silence in a request body (ms)."),
            show_default=False,
        ),
    ] = None,
    http_max_connections: Annotated[
        int | None,
        typer.Option(
            help=_help("http_max_connections", "HTTP connections per listener."),
            show_default=False,
        ),
    ] = None,
    http_max_connections_per_source: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_max_connections_per_source", "HTTP connections from one client address."
            ),
            show_default=False,
        ),
    ] = None,
    http_allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "http_allowed_hosts",
                "Host names the HTTP listeners answer to, comma-separated ('*': any).",
            ),
            show_default=False,
        ),
    ] = None,
    http_allowed_origins: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "http_allowed_origins",
                "Web origins whose pages may call the HTTP listeners, comma-separated "
                "(same-origin, '*': any).",
            ),
            show_default=False,
        ),
    ] = None,
    http_session_idle_ms: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_session_idle_ms", "A browser session (/v1/session) ends after this idle (ms)."
            ),
            show_default=False,
        ),
    ] = None,
    metrics_enabled: Annotated[
        bool | None,
        typer.Option(
            help=_help("metrics_enabled", "Serve /metrics and the dashboard's recent samples."),
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help=_help("metrics_port", "A port serving only /metrics (-1: off)."),
            show_default=False,
        ),
    ] = None,
    metrics_max_partition_series: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "metrics_max_partition_series",
                "Partitions with their own /metrics series (beyond: per-topic aggregates).",
            ),
            show_default=False,
        ),
    ] = None,
    http_max_sessions: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "http_max_sessions",
                "Browser sessions kept at once; one more ends the least recently used.",
            ),
            show_default=False,
        ),
    ] = None,
    metrics_sample_interval_s: Annotated[
        float | None,
        typer.Option(
            help=_help("metrics_sample_interval_s", "Seconds between the dashboard's samples."),
            show_default=False,
        ),
    ] = None,
    tls_cert_file: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "tls_cert_file", "PEM certificate chain of every listener (TLS on when set)."
            ),
            show_default=False,
        ),
    ] = None,
    tls_key_file: Annotated[
        str | None,
        typer.Option(
            help=_help("tls_key_file", "PEM private key of --tls-cert-file."), show_default=False
        ),
    ] = None,
    tls_ca_file: Annotated[
        str | None,
        typer.Option(
            help=_help("tls_ca_file", "PEM CAs that client certificates are verified against."),
            show_default=False,
        ),
    ] = None,
    tls_min_version: Annotated[
        str | None,
        typer.Option(
            help=_help("tls_min_version", "Oldest TLS version accepted: 1.2 or 1.3."),
            show_default=False,
        ),
    ] = None,
    tls_client_auth: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "tls_client_auth", "Client certificates (mTLS): none, optional or required."
            ),
            show_default=False,
        ),
    ] = None,
    tls_principal_field: Annotated[
        str | None,
        typer.Option(
            help=_help(
                "tls_principal_field",
                "Client certificate subject field naming the principal: CN or DN.",
            ),
            show_default=False,
        ),
    ] = None,
    authentication: Annotated[
        bool | None,
        typer.Option(
            help=_help("authentication", "Require an authenticated principal on every listener."),
            show_default=False,
        ),
    ] = None,
    allow_anonymous: Annotated[
        bool | None,
        typer.Option(
            help=_help(
                "allow_anonymous",
                "Allow non-loopback listeners without authentication, warned at each start.",
            ),
            show_default=False,
        ),
    ] = None,
    superusers: Annotated[
        str | None,
        typer.Option(
            help=_help("superusers", "Principals allowed everything, comma-separated."),
            show_default=False,
        ),
    ] = None,
    allow_plain_without_tls: Annotated[
        bool | None,
        typer.Option(
            help=_help("allow_plain_without_tls", "Accept SASL PLAIN on connections without TLS."),
            show_default=False,
        ),
    ] = None,
    scram_iterations: Annotated[
        int | None,
        typer.Option(
            help=_help("scram_iterations", "PBKDF2 iterations of new SCRAM credentials."),
            show_default=False,
        ),
    ] = None,
    auth_failures_per_minute: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "auth_failures_per_minute", "Failed logins per address and per principal a minute."
            ),
            show_default=False,
        ),
    ] = None,
    auth_failure_delay_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("auth_failure_delay_ms", "Hold back the answer to a failed login, ms."),
            show_default=False,
        ),
    ] = None,
    audit_retention_ms: Annotated[
        int | None,
        typer.Option(
            help=_help("audit_retention_ms", "Keep audit records this long, ms (-1: forever)."),
            show_default=False,
        ),
    ] = None,
    quota_produce_bytes_per_s: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "quota_produce_bytes_per_s",
                "Default produce quota per principal, bytes/s (0: none).",
            ),
            show_default=False,
        ),
    ] = None,
    quota_fetch_bytes_per_s: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "quota_fetch_bytes_per_s", "Default fetch quota per principal, bytes/s (0: none)."
            ),
            show_default=False,
        ),
    ] = None,
    quota_requests_per_s: Annotated[
        int | None,
        typer.Option(
            help=_help(
                "quota_requests_per_s", "Default request quota per principal, requests/s (0: none)."
            ),
            show_default=False,
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="Run as a node of the cluster whose metadata is in this etcd: "
            "etcd://HOST:PORT[,HOST:PORT...] (docs/cluster.md). Without it: a single node.",
            show_default=False,
        ),
    ] = None,
    node_id: Annotated[
        int | None,
        typer.Option(
            "--node-id",
            min=0,
            help="This node's id in the cluster (unique among its live nodes; with --cluster).",
            show_default=False,
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            "--advertise",
            help="HOST:PORT where other nodes and clients reach this node (with --cluster; "
            "default: --host and the bound port).",
            show_default=False,
        ),
    ] = None,
    cluster_id: Annotated[
        str,
        typer.Option(
            "--cluster-id", help="The cluster's name in etcd (several can share one etcd)."
        ),
    ] = "default",
    session_timeout: Annotated[
        int,
        typer.Option(
            "--session-timeout",
            min=2,
            help="Seconds without contact with etcd after which this node is presumed gone "
            "and its partitions are led by others (its etcd lease).",
        ),
    ] = DEFAULT_SESSION_TIMEOUT_S,
    default_replication_factor: Annotated[
        int,
        typer.Option(
            "--default-replication-factor",
            min=1,
            help="Copies of each partition of a topic created without a count (at most the "
            "live nodes).",
        ),
    ] = 3,
    min_insync_replicas: Annotated[
        int,
        typer.Option(
            "--min-insync-replicas",
            min=1,
            help="Fewest in-sync replicas (the leader included) with which acks=all "
            "produce is accepted.",
        ),
    ] = 1,
    replica_lag_max_ms: Annotated[
        int,
        typer.Option(
            "--replica-lag-max-ms",
            min=1,
            help="A follower that has not caught up for this long leaves the ISR (ms).",
        ),
    ] = 10_000,
    scrub_bytes_per_s: Annotated[
        int,
        typer.Option(
            "--scrub-bytes-per-s",
            min=0,
            help="With --cluster: the rate (bytes/s) at which the node CRC-checks the sealed "
            "segments of its replicas in the background, so damage nobody reads is found and "
            "repaired from another replica (0: off).",
        ),
    ] = 1024 * 1024,
    node_api_key_file: Annotated[
        Path | None,
        typer.Option(
            "--node-api-key-file",
            help="File holding the API key this node authenticates to its partitions' "
            "leaders with (with --cluster and authentication on): a principal allowed "
            "cluster_action on the cluster (docs/cluster.md, Security).",
            show_default=False,
        ),
    ] = None,
    node_tls_ca_file: Annotated[
        Path | None,
        typer.Option(
            "--node-tls-ca-file",
            help="PEM CAs the leaders' certificates are verified against when this node's "
            "listener uses TLS (with --cluster; default: --tls-ca-file, else the system's).",
            show_default=False,
        ),
    ] = None,
    node_tls_cert_file: Annotated[
        Path | None,
        typer.Option(
            "--node-tls-cert-file",
            help="PEM client certificate (with its key, or --node-tls-key-file) this node "
            "presents to its leaders (with --cluster, TLS on): its subject names the node's "
            "principal where listeners take client certificates.",
            show_default=False,
        ),
    ] = None,
    node_tls_key_file: Annotated[
        Path | None,
        typer.Option(
            "--node-tls-key-file",
            help="PEM private key of --node-tls-cert-file.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a broker until SIGTERM or SIGINT, then drain and stop cleanly: every listener
    stops accepting at once, long-polls and streams are answered, requests in flight get up
    to --drain-timeout-s to finish, every log is flushed and the clean-shutdown marker
    written (not if a flush failed: the next start then recovers).

    Settings come from the defaults, then --config FILE, then TIDEWIRE_* environment
    variables, then these flags (each wins over the ones before).
    """
    flags: dict[str, object] = {
        "data_dir": None if data_dir is None else str(data_dir),
        "default_partitions": default_partitions,
        "auto_create_topics": auto_create_topics,
        "max_fetch_waiters": max_fetch_waiters,
        "max_wait_ms": max_wait_ms,
        "max_open_files": max_open_files,
        "max_partitions": max_partitions,
        "fetch_max_bytes": fetch_max_bytes,
        "preallocate_bytes": preallocate_bytes,
        "stream_partitions": stream_partitions,
        "stream_segment_bytes": stream_segment_bytes,
        "stream_default_ttl_ms": stream_default_ttl_ms,
        "stream_max_ttl_ms": stream_max_ttl_ms,
        "stream_ring_size": stream_ring_size,
        "stream_idle_ms": stream_idle_ms,
        "stream_dedup_window": stream_dedup_window,
        "stream_max_count": stream_max_count,
        "stream_max_receivers": stream_max_receivers,
        "stream_max_wait_ms": stream_max_wait_ms,
        "stream_max_message_bytes": stream_max_message_bytes,
        "fsync": fsync,
        "flush_interval_ms": flush_interval_ms,
        "segment_bytes": segment_bytes,
        "segment_ms": segment_ms,
        "retention_ms": retention_ms,
        "retention_bytes": retention_bytes,
        "max_message_bytes": max_message_bytes,
        "max_batch_bytes": max_batch_bytes,  # the deprecated name: load_settings warns
        "host": host,
        "port": port,
        "max_connections": max_connections,
        "max_frame_bytes": max_frame_bytes,
        "max_in_flight": max_in_flight,
        "max_unsent_bytes": max_unsent_bytes,
        "idle_timeout_s": idle_timeout_s,
        "frame_timeout_s": frame_timeout_s,
        "drain_timeout_s": drain_timeout_s,
        "event_loop": event_loop,
        "log_format": log_format,
        "log_level": log_level,
        "tracing_enabled": tracing_enabled,
        "otlp_endpoint": otlp_endpoint,
        "kafka_port": kafka_port,
        "kafka_host": kafka_host,
        "kafka_advertised_host": kafka_advertised_host,
        "kafka_advertised_port": kafka_advertised_port,
        "http_host": http_host,
        "http_port": http_port,
        "http_max_body_bytes": http_max_body_bytes,
        "http_msgbus_port": http_msgbus_port,
        "http_cluster_routing": http_cluster_routing,
        "http_ipubsub_port": http_ipubsub_port,
        "http_msgbus_max_payload_bytes": http_msgbus_max_payload_bytes,
        "http_msgbus_ttl_ms": http_msgbus_ttl_ms,
        "http_max_inflight_body_bytes": http_max_inflight_body_bytes,
        "http_header_timeout_ms": http_header_timeout_ms,
        "http_body_timeout_ms": http_body_timeout_ms,
        "http_max_connections": http_max_connections,
        "http_max_connections_per_source": http_max_connections_per_source,
        "http_allowed_hosts": http_allowed_hosts,
        "http_allowed_origins": http_allowed_origins,
        "http_session_idle_ms": http_session_idle_ms,
        "http_max_sessions": http_max_sessions,
        "metrics_enabled": metrics_enabled,
        "metrics_port": metrics_port,
        "metrics_max_partition_series": metrics_max_partition_series,
        "metrics_sample_interval_s": metrics_sample_interval_s,
        "tls_cert_file": tls_cert_file,
        "tls_key_file": tls_key_file,
        "tls_ca_file": tls_ca_file,
        "tls_min_version": tls_min_version,
        "tls_client_auth": tls_client_auth,
        "tls_principal_field": tls_principal_field,
        "authentication": authentication,
        "allow_anonymous": allow_anonymous,
        "superusers": superusers,
        "allow_plain_without_tls": allow_plain_without_tls,
        "scram_iterations": scram_iterations,
        "auth_failures_per_minute": auth_failures_per_minute,
        "auth_failure_delay_ms": auth_failure_delay_ms,
        "audit_retention_ms": audit_retention_ms,
        "quota_produce_bytes_per_s": quota_produce_bytes_per_s,
        "quota_fetch_bytes_per_s": quota_fetch_bytes_per_s,
        "quota_requests_per_s": quota_requests_per_s,
    }
    try:
        settings = load_settings(config, flags=flags)
    except InvalidConfigError as exc:
        fail(exc.message, EXIT_USAGE)
    node: NodeOptions | None = None
    if cluster is None:
        if (
            node_id is not None
            or advertise is not None
            or node_api_key_file is not None
            or node_tls_ca_file is not None
            or node_tls_cert_file is not None
            or node_tls_key_file is not None
        ):
            fail(
                "--node-id and --advertise go with --cluster etcd://HOST:PORT (so do --node-*)",
                EXIT_USAGE,
            )
    else:
        if node_id is None:
            fail("--cluster needs --node-id N (unique among the cluster's nodes)", EXIT_USAGE)
        from tidewire.cluster.node import parse_cluster_url  # noqa: PLC0415 (clusters only)

        try:
            node = NodeOptions(
                node_id=node_id,
                etcd=parse_cluster_url(cluster),
                advertise=None if advertise is None else _host_port(advertise),
                cluster_id=cluster_id,
                session_timeout_s=session_timeout,
                default_replication_factor=default_replication_factor,
                min_insync_replicas=min_insync_replicas,
                replica_lag_max_ms=replica_lag_max_ms,
                scrub_bytes_per_s=scrub_bytes_per_s,
                api_key=None if node_api_key_file is None else _read_node_key(node_api_key_file),
                tls_ca_file=None if node_tls_ca_file is None else str(node_tls_ca_file),
                tls_cert_file=None if node_tls_cert_file is None else str(node_tls_cert_file),
                tls_key_file=None if node_tls_key_file is None else str(node_tls_key_file),
            )
        except InvalidConfigError as exc:
            fail(exc.message, EXIT_USAGE)
        # Topics are created through etcd: a first publish to an unknown topic is refused.
        settings = replace(settings, broker=replace(settings.broker, auto_create_topics=False))
    configure_logging(settings.server.log_format, settings.server.log_level)  # both checked
    try:
        setup_tracing(
            enabled=settings.server.tracing_enabled, endpoint=settings.server.otlp_endpoint
        )
    except (ImportError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    for name in unknown_env_vars():
        log.warning("ignoring environment variable %s: no setting of that name", name)
    for warning in settings.warnings:
        log.warning("%s", warning)
    server = settings.server
    name, factory = loop_factory(server.event_loop)  # the setting was checked: cannot fail
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(settings, name, node))
    except TidewireError as exc:
        fail(exc.message)
    except OSError as exc:
        fail(f"cannot listen on {server.host}:{server.port}: {exc.strerror}")


@dataclass(frozen=True)
class NodeOptions:
    """The cluster flags of ``serve`` (see :class:`~tidewire.cluster.node.ClusterNode`)."""

    node_id: int
    etcd: list[str]
    advertise: tuple[str, int] | None
    cluster_id: str
    session_timeout_s: int
    default_replication_factor: int
    min_insync_replicas: int
    replica_lag_max_ms: int
    #: the background scrub's rate (bytes/s; 0: off)
    scrub_bytes_per_s: int = 1024 * 1024
    #: the key this node authenticates to leaders with (None: none); never logged
    api_key: str | None = field(default=None, repr=False)
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None


def _read_node_key(path: Path) -> str:
    """The API key in ``path`` (surrounding blanks stripped).

    Raises:
        InvalidConfigError: unreadable, or not an API key (the message does not repeat it).
    """
    from tidewire.security.credentials import Credentials  # noqa: PLC0415

    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise InvalidConfigError(f"--node-api-key-file {path}: {exc.strerror}") from None
    try:
        Credentials(key)
    except TidewireError:
        raise InvalidConfigError(
            f"--node-api-key-file {path}: not a tidewire API key (twk_<id>_<secret>)"
        ) from None
    return key


def _replica_connect(options: NodeOptions, settings: Settings) -> Connect:
    """How this node connects to its partitions' leaders: over TLS when its own listener
    uses TLS (every node of a cluster is configured alike), with the leader's certificate
    verified against ``--node-tls-ca-file`` (default: ``--tls-ca-file``), presenting
    ``--node-tls-cert-file`` as a client certificate when given; authenticated with
    ``--node-api-key-file`` when given.

    Raises:
        InvalidConfigError: --node-tls-* without TLS on the listener, or a key without cert.
    """
    from tidewire.cluster.fetcher import node_connect  # noqa: PLC0415
    from tidewire.security.credentials import Credentials  # noqa: PLC0415
    from tidewire.security.tls import TlsOptions  # noqa: PLC0415

    t = settings.tls
    tls = None
    if t.enabled:
        tls = TlsOptions(
            ca_file=options.tls_ca_file or t.tls_ca_file or None,
            cert_file=options.tls_cert_file,
            key_file=options.tls_key_file,
            min_version=t.tls_min_version,
        )
    elif options.tls_ca_file or options.tls_cert_file or options.tls_key_file:
        raise InvalidConfigError(
            "--node-tls-* set, but this node's listener does not use TLS (--tls-cert-file): "
            "nodes speak TLS to each other when their listeners do"
        )
    credentials = None if options.api_key is None else Credentials(options.api_key)
    return node_connect(tls=tls, credentials=credentials)


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidConfigError(f"--advertise {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


async def _serve(
    settings: Settings, loop_name: str, node_options: NodeOptions | None = None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Safe defaults: no open listener on the network without authentication, unless the
    # operator says so (then warned at every start).
    hosts = [settings.server.host] + ([settings.http.http_host] if settings.http.enabled else [])
    if settings.server.kafka_port != -1:
        hosts.append(settings.server.kafka_host or settings.server.host)
    for warning in check_exposure(hosts, settings.security):
        log.warning("%s", warning)
    broker = Broker(settings.broker, security=settings.security)
    await broker.start()
    if node_options is not None:
        # Before any listener opens: no producer id is handed out from outside the node's range.
        try:
            broker.use_producer_id_range(node_options.node_id)
        except InvalidConfigError:
            await drain(broker, None, None, grace_s=0)
            raise
        from tidewire.cluster.replication import hold_back  # noqa: PLC0415 (clusters only)

        # Nor is anything served above the high watermarks the node knew last, until it joins.
        hold_back(broker, node_options.node_id)
    if broker.bootstrap_key_file is not None:
        typer.echo(
            f"created the first superuser; its API key is in {broker.bootstrap_key_file} "
            "(take it, then delete the file)"
        )
    # Every listener's connections under the descriptor limit (docs/configuration.md).
    tls = settings.tls if settings.tls.enabled else None
    try:
        server_config, http_config = fit_broker_listeners(broker, settings.server, settings.http)
        if tls is not None:
            server_context(tls)  # a file that cannot be loaded is named before any listens
    except InvalidConfigError:
        await drain(broker, None, None, grace_s=0)
        raise
    server = TcpServer(broker, server_config, tls=tls)
    gateway = None
    kafka = None
    node: ClusterNode | None = None
    try:
        await server.start()
        if server_config.kafka_port != -1:
            from tidewire.server.kafka.listener import KafkaServer  # noqa: PLC0415

            kafka = KafkaServer(broker, server_config, tls=tls)
            try:
                await kafka.start()
            except OSError as exc:
                raise InvalidConfigError(
                    f"cannot listen for Kafka on {kafka.host}:{server_config.kafka_port}: "
                    f"{exc.strerror or exc}"
                ) from None
        if http_config.enabled:
            # Imported here: FastAPI and uvicorn load only when HTTP is served.
            from tidewire.server.http.gateway import HttpGateway  # noqa: PLC0415

            gateway = HttpGateway.for_broker(broker, http_config, tls=tls)
            try:
                await gateway.start()
            except OSError as exc:
                raise InvalidConfigError(str(exc.strerror or exc)) from None
        if node_options is not None:
            node = await _join(broker, node_options, settings, server.port, gateway, kafka)
        # The settings in effect: the listeners' as fitted under the descriptor limit.
        in_effect = replace(settings, server=server_config, http=http_config)
        record(broker, in_effect, listeners_of(server, gateway, tls=tls is not None, kafka=kafka))
        # One line for people and scripts alike: where to connect.
        typer.echo(
            f"tidewire {__version__} listening on {settings.server.host}:{server.port}"
            + (" (TLS)" if tls is not None else "")
        )
        log.info("event loop: %s", loop_name)
        if node is not None:
            typer.echo(
                f"tidewire {__version__} node {node.node_id} of cluster at "
                f"{node.store.root}, advertised as {node.info.host}:{node.info.port}"
            )
        if kafka is not None:
            typer.echo(
                f"tidewire {__version__} Kafka listening on {kafka.host}:{kafka.port}, "
                f"advertised as {kafka.advertised_host}:{kafka.advertised_port}"
                + (" (TLS)" if tls is not None else "")
            )
        if gateway is not None:
            for name in gateway.names:
                host, port = gateway.host_of(name), gateway.port_of(name)
                scheme = "https" if tls is not None else "http"
                typer.echo(
                    f"tidewire {__version__} HTTP {name} listening on {scheme}://{host}:{port}"
                )
        # What start-up made (modules, the loaded stream index and its dicts) lives until
        # the end: moved out of the collector's generations, a full collection no longer
        # walks it (with 1,000,000 streams loaded, 100 ms of event-loop pause per full
        # collection before, under 1 ms after; docs/streams-storage.md).
        gc.collect()
        gc.freeze()
        await stop.wait()
        stopping = loop.time()
        if node is not None:  # leave the cluster first: the others take over at once
            await node.close()
    except BaseException:
        if node is not None:
            await node.close()
        await drain(broker, server, gateway, grace_s=0, kafka=kafka)
        raise
    try:
        report = await drain(
            broker, server, gateway, grace_s=settings.server.drain_timeout_s, kafka=kafka
        )
    except StorageError as exc:  # one line for all: the cause, and what the next start does
        log.error("stopped in %.2f s, but %s", loop.time() - stopping, exc.message)
        raise typer.Exit(EXIT_ERROR) from None
    log.info("stopped cleanly in %.2f s", report.seconds)


async def _join(
    broker: Broker,
    options: NodeOptions,
    settings: Settings,
    port: int,
    gateway: HttpGateway | None,
    kafka: KafkaServer | None,
) -> ClusterNode:
    """Start ``broker`` as a node of its cluster (registered, following the metadata)."""
    from tidewire.cluster.node import ClusterNode  # noqa: PLC0415 (etcd's client: clusters only)

    advertise = options.advertise
    if advertise is None:
        host = settings.server.host
        if host in ("0.0.0.0", "::", ""):
            raise InvalidConfigError(
                f"--host {host!r} is no address others can reach: give --advertise HOST:PORT"
            )
        advertise = (host, port)
    node = ClusterNode(
        broker,
        options.node_id,
        options.etcd,
        advertise=advertise,
        http_port=gateway.port_of(gateway.names[0]) if gateway is not None else -1,
        cluster_id=options.cluster_id,
        kafka_port=kafka.advertised_port if kafka is not None else -1,
        kafka_host=kafka.advertised_host if kafka is not None else "",
        session_timeout_s=options.session_timeout_s,
        default_replication_factor=options.default_replication_factor,
        replica_lag_max_ms=options.replica_lag_max_ms,
        scrub_bytes_per_s=options.scrub_bytes_per_s,
        min_insync_replicas=options.min_insync_replicas,
        replica_connect=_replica_connect(options, settings),
    )
    await node.start()
    return node


@config_app.command("init")
def config_init(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write to this file (refused if it exists) instead of stdout.",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Print a configuration file of every setting at its default, with a comment each."""
    text = default_toml()
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        with open(output, "x", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}")
    typer.echo(f"wrote {output}", err=True)


@config_app.command("show")
def config_show(
    config: ConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of TOML.", show_default=False)
    ] = False,
) -> None:
    """Print the settings serve would run with (file < environment), and where each came
    from."""
    try:
        settings = load_settings(config)
    except InvalidConfigError as exc:
        fail(exc.message, EXIT_USAGE)
    for warning in settings.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if as_json:
        doc: dict[str, dict[str, object]] = {s: {} for s in SECTIONS}
        for s in SETTINGS:
            value = settings.value(s.key)
            doc[s.section][s.key] = str(value) if isinstance(value, FsyncPolicy) else value
        echo_json({"settings": doc, "origins": dict(settings.origins)})
        return
    for section in SECTIONS:
        typer.echo(f"[{section}]")
        for s in SETTINGS:
            if s.section == section:
                value = toml_value(settings.value(s.key))
                typer.echo(f"{s.key} = {value}  # {settings.origins[s.key]}")
        typer.echo("")
