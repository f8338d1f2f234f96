"""The settings of ``tidewire serve``: defaults, then a TOML file, then ``TIDEWIRE_*``
environment variables, then command-line flags (each later source wins).

Every setting is one row of :data:`SETTINGS`: its TOML section and key, its environment
variable (``TIDEWIRE_`` + the key in capitals: ``port`` -> ``TIDEWIRE_PORT``), its flag, its
default (taken from :class:`~tidewire.broker.BrokerConfig`,
:class:`~tidewire.storage.LogConfig`, :class:`~tidewire.server.ServerConfig` and
:class:`~tidewire.server.http.HttpConfig`, whose
validation decides what is in range) and a one-line meaning. The file looks like::

    [broker]
    data_dir = "./tidewire-data"
    default_partitions = 3

    [log]
    fsync = "always"

    [server]
    port = 7400

    [http]
    http_port = 8080

:func:`load_settings` builds the :class:`Settings`; a bad value raises
:class:`~tidewire.errors.InvalidConfigError` whose message says where the value came from
(the file and key, the environment variable, or the flag) and what is allowed.
:func:`default_toml` writes a commented file of every key at its default.

A renamed setting keeps its old name as a deprecated alias (:data:`DEPRECATED`) in the file,
the environment and the flags: it still works, and :attr:`Settings.warnings` says what to
write instead.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from tidewire.broker import BrokerConfig
from tidewire.errors import InvalidConfigError
from tidewire.security.config import SecurityConfig, TlsConfig
from tidewire.server import ServerConfig
from tidewire.server.http import HttpConfig
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage.manager import MAX_PARTITION

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEPRECATED",
    "ENV_PREFIX",
    "SECTIONS",
    "SETTINGS",
    "Setting",
    "Settings",
    "default_toml",
    "load_settings",
    "toml_value",
    "unknown_env_vars",
]

#: Where the logs live unless configured: relative to the directory ``serve`` runs in.
DEFAULT_DATA_DIR = "./tidewire-data"
#: Prefix of every environment variable tidewire reads.
ENV_PREFIX = "TIDEWIRE_"
#: Environment variables with the prefix that are not ``serve`` settings: the client
#: commands' broker address, the config file's path, and the test scripts' interpreter.
OTHER_ENV_VARS = frozenset(
    {
        "TIDEWIRE_ADDR",
        "TIDEWIRE_CONFIG",
        # tidewire log-level's HTTP API
        "TIDEWIRE_HTTP_URL",
        "TIDEWIRE_PYTHON",
        # the client commands' TLS options (--tls, --tls-ca, ...)
        "TIDEWIRE_TLS",
        "TIDEWIRE_TLS_CA",
        "TIDEWIRE_TLS_CERT",
        "TIDEWIRE_TLS_KEY",
        "TIDEWIRE_TLS_SERVER_NAME",
    }
)

Section = Literal["broker", "log", "server", "http", "tls", "security"]
Kind = Literal["int", "float", "bool", "str", "fsync"]
SECTIONS: tuple[Section, ...] = ("broker", "log", "server", "http", "tls", "security")

_BROKER_DEFAULTS = BrokerConfig(DEFAULT_DATA_DIR)
_LOG_DEFAULTS = LogConfig()
_SERVER_DEFAULTS = ServerConfig()
_HTTP_DEFAULTS = HttpConfig()
_TLS_DEFAULTS = TlsConfig()
_SECURITY_DEFAULTS = SecurityConfig()


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of ``tidewire serve``.

    Attributes:
        section: its TOML table.
        key: its TOML key.
        kind: the type of its value.
        flag: its command-line flag.
        help: what it means, in one line.
        field: the field of the config class it sets (its key unless they differ).
    """

    section: Section
    key: str
    kind: Kind
    flag: str
    help: str
    field: str = ""

    def __post_init__(self) -> None:
        if not self.field:
            object.__setattr__(self, "field", self.key)

    @property
    def env(self) -> str:
        """Its environment variable: ``TIDEWIRE_`` and the key in capitals."""
        return ENV_PREFIX + self.key.upper()

    @property
    def default(self) -> object:
        """Its default value."""
        source: object = {
            "broker": _BROKER_DEFAULTS,
            "log": _LOG_DEFAULTS,
            "server": _SERVER_DEFAULTS,
            "http": _HTTP_DEFAULTS,
            "tls": _TLS_DEFAULTS,
            "security": _SECURITY_DEFAULTS,
        }[self.section]
        return getattr(source, self.field)


def _s(
    section: Section, key: str, kind: Kind, help: str, flag: str = "", *, field: str = ""
) -> Setting:
    return Setting(section, key, kind, flag or "--" + key.replace("_", "-"), help, field)


#: Every setting, in the order of the file ``tidewire config init`` writes.
SETTINGS: tuple[Setting, ...] = (
    _s("broker", "data_dir", "str", "Directory of the logs (created if missing)."),
    _s(
        "broker",
        "default_partitions",
        "int",
        f"Partitions of a topic created without a count (1..{MAX_PARTITION:,}).",
        "--partitions",
    ),
    _s(
        "broker",
        "auto_create_topics",
        "bool",
        "Create a topic on its first publish, with default_partitions partitions.",
        "--auto-create",
    ),
    _s(
        "broker",
        "max_fetch_waiters",
        "int",
        "Long-poll fetches waiting at once; more are refused as backpressure (>= 1).",
    ),
    _s("broker", "max_wait_ms", "int", "The longest a fetch may wait for data, ms (0..3,600,000)."),
    _s(
        "broker",
        "max_open_files",
        "int",
        "Log files kept open at once (0: a quarter of the descriptor limit, at most 10,000).",
    ),
    _s("broker", "max_partitions", "int", "Partitions of all topics together (>= 1)."),
    _s(
        "broker",
        "stream_partitions",
        "int",
        "Partitions of __streams, the persistent stream messages' log (1..1,024; fixed once made).",
    ),
    _s(
        "broker",
        "stream_segment_bytes",
        "int",
        "Segment size of __streams, bytes (1,024..1,073,741,824); expired ones go whole.",
    ),
    _s(
        "broker",
        "stream_default_ttl_ms",
        "int",
        "TTL of a stream message sent without one, ms (1..stream_max_ttl_ms).",
    ),
    _s(
        "broker",
        "stream_max_ttl_ms",
        "int",
        "The longest TTL a stream message may ask for, ms.",
    ),
    _s(
        "broker",
        "stream_ring_size",
        "int",
        "Messages that may wait in a stream unless its first request says (0..1,000,000).",
    ),
    _s(
        "broker",
        "stream_idle_ms",
        "int",
        "An empty stream nobody waits on is forgotten after this long, ms.",
    ),
    _s(
        "broker",
        "stream_dedup_window",
        "int",
        "Message uuids remembered per stream for deduplication (0..1,000,000).",
    ),
    _s(
        "broker",
        "stream_max_count",
        "int",
        "Streams at once; a send or receive that would create more is refused (>= 1).",
    ),
    _s(
        "broker",
        "stream_max_receivers",
        "int",
        "Stream receives and reads waiting at once; more are refused as backpressure (>= 1).",
    ),
    _s(
        "broker",
        "stream_max_wait_ms",
        "int",
        "The longest a stream receive, read or blocked send may wait, ms (0..3,600,000).",
    ),
    _s(
        "broker",
        "stream_max_message_bytes",
        "int",
        "The largest stream message value, bytes (1..268,435,456).",
    ),
    _s(
        "broker",
        "preallocate_bytes",
        "int",
        "Zeros written ahead of a busy fsync=always partition's appends, bytes (0: off).",
    ),
    _s(
        "broker",
        "fetch_max_bytes",
        "int",
        "The most data one fetch answer carries, bytes (1,024..1,073,741,824).",
    ),
    _s(
        "log",
        "fsync",
        "fsync",
        "Durability of new topics: always (ack after fsync), interval, never.",
    ),
    _s("log", "flush_interval_ms", "int", "fsync period under fsync = interval, ms."),
    _s("log", "segment_bytes", "int", "Roll to a new segment beyond this size, bytes (>= 1,024)."),
    _s("log", "segment_ms", "int", "Roll to a new segment when the active one is this old, ms."),
    _s("log", "retention_ms", "int", "Delete segments whose newest record is older, ms; -1: keep."),
    _s(
        "log", "retention_bytes", "int", "Delete oldest segments beyond this size, bytes; -1: keep."
    ),
    _s(
        "log",
        "max_message_bytes",
        "int",
        "The largest message (record batch) a topic accepts, bytes (61..268,435,456).",
        field="max_batch_bytes",
    ),
    _s("server", "host", "str", "Address the binary protocol listens on."),
    _s("server", "port", "int", "TCP port of the binary protocol (0: any free port)."),
    _s("server", "max_connections", "int", "Client connections at once; more are closed."),
    _s("server", "max_frame_bytes", "int", "The longest protocol frame accepted, bytes."),
    _s("server", "max_in_flight", "int", "Requests per connection in flight before reads pause."),
    _s(
        "server",
        "max_unsent_bytes",
        "int",
        "Per connection: bytes of fetch answers being read or unsent before fetches wait.",
    ),
    _s("server", "idle_timeout_s", "float", "Close a connection silent for this long, seconds."),
    _s("server", "frame_timeout_s", "float", "Close a connection whose frame takes this long, s."),
    _s("server", "event_loop", "str", "auto (uvloop when installed), asyncio or uvloop."),
    _s(
        "server",
        "drain_timeout_s",
        "float",
        "At a stop, how long requests in flight may take to finish, s (0..3,600).",
    ),
    _s("server", "log_format", "str", "Log lines as text, or json (one object per line)."),
    _s("server", "log_level", "str", "Log from this level: DEBUG, INFO, WARNING, ERROR, CRITICAL."),
    _s(
        "server",
        "tracing_enabled",
        "bool",
        "Export OpenTelemetry traces over OTLP (needs tidewire[otel]).",
    ),
    _s("server", "otlp_endpoint", "str", "OTLP/HTTP endpoint of the traces (http://host:4318)."),
    _s("server", "kafka_port", "int", "Port of Kafka's wire protocol (-1: off, 0: any free port)."),
    _s("server", "kafka_host", "str", "Address the Kafka listener binds (empty: host's)."),
    _s(
        "server",
        "kafka_advertised_host",
        "str",
        "Host Kafka clients are told to connect to (empty: the bound one, or this machine's name).",
    ),
    _s(
        "server",
        "kafka_advertised_port",
        "int",
        "Port Kafka clients are told to connect to (0: the bound one).",
    ),
    _s("http", "http_host", "str", "Address the HTTP listeners bind."),
    _s("http", "http_port", "int", "Port of the HTTP API (-1: off, 0: any free port)."),
    _s("http", "http_max_body_bytes", "int", "The longest HTTP request body accepted, bytes."),
    _s("http", "http_msgbus_port", "int", "Port of the msgbus-compatible API (-1: off, 0: any)."),
    _s("http", "http_ipubsub_port", "int", "Port of the iPubSub-compatible API (-1: off, 0: any)."),
    _s("http", "http_msgbus_max_payload_bytes", "int", "The largest msgbus message, bytes (413)."),
    _s("http", "http_msgbus_ttl_ms", "int", "A msgbus message expires unpopped after this, ms."),
    _s(
        "http",
        "http_cluster_routing",
        "str",
        "In a cluster: forward a request to the node that serves it, or redirect (307) there.",
    ),
    _s(
        "http",
        "http_max_inflight_body_bytes",
        "int",
        "Bytes of HTTP request bodies in flight at once; beyond: 503 + Retry-After.",
    ),
    _s("http", "http_header_timeout_ms", "int", "A request's headers must arrive within this, ms."),
    _s("http", "http_body_timeout_ms", "int", "The longest silence in a request body, ms."),
    _s(
        "http", "http_max_connections", "int", "HTTP connections per listener; beyond: 503, closed."
    ),
    _s(
        "http",
        "http_max_connections_per_source",
        "int",
        "HTTP connections from one client address; beyond: 503, closed.",
    ),
    _s(
        "http",
        "http_allowed_hosts",
        "str",
        "Host names the HTTP listeners answer to, comma-separated (IPs always); '*': any.",
    ),
    _s(
        "http",
        "http_allowed_origins",
        "str",
        "Web origins whose pages may call the HTTP listeners, comma-separated; '*': any.",
    ),
    _s("http", "http_session_idle_ms", "int", "A browser session ends after this idle, ms."),
    _s("http", "http_max_sessions", "int", "Browser sessions kept at once (oldest ended first)."),
    _s("http", "metrics_enabled", "bool", "Serve /metrics and the recent samples; count for them."),
    _s("http", "metrics_port", "int", "A port serving only /metrics (-1: off, 0: any free port)."),
    _s(
        "http",
        "metrics_max_partition_series",
        "int",
        "Partitions with their own /metrics series; beyond: per-topic aggregates only.",
    ),
    _s("http", "metrics_sample_interval_s", "float", "Seconds between the dashboard's samples."),
    _s("tls", "tls_cert_file", "str", "PEM certificate chain of every listener ('': no TLS)."),
    _s("tls", "tls_key_file", "str", "PEM private key of tls_cert_file."),
    _s("tls", "tls_ca_file", "str", "PEM CAs that client certificates are verified against."),
    _s("tls", "tls_min_version", "str", "Oldest TLS version accepted: 1.2 or 1.3."),
    _s("tls", "tls_client_auth", "str", "Client certificates: none, optional or required."),
    _s("tls", "tls_principal_field", "str", "Certificate subject field naming the principal."),
    _s("security", "authentication", "bool", "Require an authenticated principal everywhere."),
    _s(
        "security",
        "allow_anonymous",
        "bool",
        "Allow a non-loopback listener with authentication off (warned at each start).",
    ),
    _s("security", "superusers", "str", "Principals allowed everything, comma-separated."),
    _s(
        "security",
        "allow_plain_without_tls",
        "bool",
        "Accept SASL PLAIN (the key itself) on connections without TLS.",
    ),
    _s("security", "scram_iterations", "int", "PBKDF2 iterations of new SCRAM credentials."),
    _s(
        "security",
        "auth_failures_per_minute",
        "int",
        "Failed logins per address and per principal a minute before refusing.",
    ),
    _s(
        "security",
        "auth_failure_delay_ms",
        "int",
        "Hold back the answer to a failed login this long, ms.",
    ),
    _s("security", "audit_retention_ms", "int", "Keep audit records this long, ms; -1: forever."),
    _s(
        "security",
        "quota_produce_bytes_per_s",
        "int",
        "Default produce quota per principal, bytes/s (0: none).",
    ),
    _s(
        "security",
        "quota_fetch_bytes_per_s",
        "int",
        "Default fetch quota per principal, bytes/s (0: none).",
    ),
    _s(
        "security",
        "quota_requests_per_s",
        "int",
        "Default request quota per principal, requests/s (0: none).",
    ),
)
_BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}

#: Old names of renamed settings: old key -> the setting's key. Each still works as a key of
#: the same section, as TIDEWIRE_<OLD KEY> and as --old-key, with a warning. The topic
#: setting's name (CREATE_TOPIC, the HTTP API, tidewire topic create) was always
#: max_message_bytes, as Kafka's topic setting max.message.bytes.
DEPRECATED: Mapping[str, str] = {"max_batch_bytes": "max_message_bytes"}


def _alias_env(old: str) -> str:
    return ENV_PREFIX + old.upper()


def _alias_flag(old: str) -> str:
    return "--" + old.replace("_", "-")


def _deprecation(old_name: str, new_name: str) -> str:
    return f"{old_name} is deprecated, use {new_name} (the same setting)"


@dataclass(frozen=True, slots=True)
class Settings:
    """The settings ``tidewire serve`` runs with.

    Attributes:
        broker: the broker's settings (with the default log settings of new topics).
        server: the TCP listener's settings.
        http: the HTTP gateway's settings.
        tls: TLS of every listener.
        security: authentication, authorization, audit and quotas.
        origins: for each key of :data:`SETTINGS`, where its value came from: ``"default"``,
            ``"FILE [section] key"``, ``"environment variable TIDEWIRE_KEY"`` or
            ``"flag --key"``.
        warnings: one line for each deprecated name used (:data:`DEPRECATED`), saying what
            to use instead.
    """

    broker: BrokerConfig
    server: ServerConfig
    http: HttpConfig
    origins: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    tls: TlsConfig = field(default_factory=TlsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def value(self, key: str) -> object:
        """The value of one setting of :data:`SETTINGS` by its key."""
        setting = _BY_KEY[key]
        section, field = setting.section, setting.field
        if section == "log":
            return getattr(self.broker.log, field)
        if section == "http":
            return getattr(self.http, field)
        if section == "tls":
            return getattr(self.tls, field)
        if section == "security":
            return getattr(self.security, field)
        return getattr(self.broker if section == "broker" else self.server, field)


# --- loading ----------------------------------------------------------------------------------


def load_settings(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Settings:
    """Resolve the settings: defaults < the TOML file at ``path`` < ``env`` < ``flags``.

    Args:
        path: a TOML file (None: none).
        env: environment variables (None: ``os.environ``); only ``TIDEWIRE_<KEY>`` of a
            setting is read, other variables are ignored (see :func:`unknown_env_vars`).
        flags: values given on the command line by setting key (or a deprecated key of
            :data:`DEPRECATED`), already of the setting's type (None values mean "not
            given").

    Raises:
        InvalidConfigError: an unreadable or malformed file, an unknown section or key, a
            value of the wrong type or out of range; the message names where it came from.
    """
    values: dict[str, Any] = {s.key: s.default for s in SETTINGS}
    origins: dict[str, str] = dict.fromkeys(values, "default")
    warnings: list[str] = []

    def take(setting: Setting, value: Any, origin: str) -> None:
        _check_range(setting, value, origin)
        values[setting.key] = value
        origins[setting.key] = origin

    if path is not None:
        for setting, value, origin in _read_file(path, warnings):
            take(setting, value, origin)
    environ = os.environ if env is None else env
    for setting in SETTINGS:
        names = [setting.env] + [
            _alias_env(old) for old, new in DEPRECATED.items() if new == setting.key
        ]
        given_env = [n for n in names if environ.get(n) is not None]
        if len(given_env) > 1:
            raise InvalidConfigError(
                f"environment variables {' and '.join(given_env)} are the same setting: "
                f"set only {setting.env}"
            )
        for name in given_env:
            if name != setting.env:
                warnings.append(_deprecation(f"environment variable {name}", setting.env))
            origin = f"environment variable {name}"
            take(setting, _parse_env(setting, environ[name], origin), origin)
    given_flags = {k: v for k, v in (flags or {}).items() if v is not None}
    for name, given in given_flags.items():
        flag, key = None, DEPRECATED.get(name, name)
        if name in DEPRECATED:
            flag = _alias_flag(name)
            if given_flags.get(key) is not None:
                raise InvalidConfigError(
                    f"flags {flag} and {_BY_KEY[key].flag} are the same setting: "
                    f"give only {_BY_KEY[key].flag}"
                )
            warnings.append(_deprecation(f"flag {flag}", _BY_KEY[key].flag))
        setting = _BY_KEY[key]
        value = float(given) if setting.kind == "float" and isinstance(given, int) else given
        take(setting, value, f"flag {flag or setting.flag}")

    def of(section: Section) -> dict[str, Any]:
        return {s.field: values[s.key] for s in SETTINGS if s.section == section}

    # Each value was checked on its own above; building the whole catches what depends on
    # several of them together, and names every source involved.
    try:
        log = LogConfig(**of("log"))
        broker = BrokerConfig(**of("broker"), log=log)
        server = ServerConfig(**of("server"))
        http = HttpConfig(**of("http"))
        tls = TlsConfig(**of("tls"))
        security = SecurityConfig(**of("security"))
    except InvalidConfigError as exc:
        where = "; ".join(sorted({o for o in origins.values() if o != "default"})) or "defaults"
        raise InvalidConfigError(f"{where}: {exc.message}") from None
    return Settings(
        broker=broker,
        server=server,
        http=http,
        origins=origins,
        warnings=tuple(warnings),
        tls=tls,
        security=security,
    )


def unknown_env_vars(env: Mapping[str, str] | None = None) -> list[str]:
    """Names in ``env`` (None: ``os.environ``) that start with ``TIDEWIRE_`` but name no
    setting: most likely a typo, which :func:`load_settings` would silently ignore."""
    environ = os.environ if env is None else env
    known = {s.env for s in SETTINGS} | {_alias_env(old) for old in DEPRECATED} | OTHER_ENV_VARS
    return sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known)


def _read_file(path: Path, warnings: list[str]) -> list[tuple[Setting, Any, str]]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise InvalidConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise InvalidConfigError(f"{path}: not valid TOML: the file is not UTF-8") from None
    found: list[tuple[Setting, Any, str]] = []
    names = ", ".join(f"[{s}]" for s in SECTIONS)
    for section, table in doc.items():
        if not isinstance(table, dict):
            if section in _BY_KEY:
                raise InvalidConfigError(
                    f"{path}: key {section!r} is outside any section; "
                    f"put it under [{_BY_KEY[section].section}]"
                )
            raise InvalidConfigError(
                f"{path}: key {section!r} is outside any section; the sections are {names}"
            )
        if section not in SECTIONS:
            raise InvalidConfigError(
                f"{path}: unknown section [{section}]{_did_you_mean(section, SECTIONS)}; "
                f"the sections are {names}"
            )
        for key, value in table.items():
            origin = f"{path} [{section}] {key}"
            setting = _BY_KEY.get(DEPRECATED.get(key, key))
            if key in DEPRECATED and setting is not None and setting.section == section:
                if setting.key in table:
                    raise InvalidConfigError(
                        f"{path} [{section}]: {key} and {setting.key} are the same setting: "
                        f"keep only {setting.key}"
                    )
                warnings.append(_deprecation(f"{path} [{section}] {key}", setting.key))
            if setting is None or setting.section != section:
                keys = [s.key for s in SETTINGS if s.section == section]
                hint = (
                    f"; it belongs under [{setting.section}]"
                    if setting is not None
                    else _did_you_mean(key, keys)
                )
                raise InvalidConfigError(
                    f"{path}: unknown key {key!r} in [{section}]{hint}; "
                    f"the keys of [{section}] are {', '.join(keys)}"
                )
            found.append((setting, _check_toml_type(setting, value, origin), origin))
    return found


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_KIND_NAMES: dict[Kind, str] = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "fsync": "one of 'always', 'interval', 'never'",
}


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # dates and times


def _check_toml_type(setting: Setting, value: object, origin: str) -> Any:
    kind = setting.kind
    ok = (
        (kind == "int" and isinstance(value, int) and not isinstance(value, bool))
        or (kind == "float" and isinstance(value, int | float) and not isinstance(value, bool))
        or (kind == "bool" and isinstance(value, bool))
        or (kind in ("str", "fsync") and isinstance(value, str))
    )
    if not ok:
        raise InvalidConfigError(f"{origin}: must be {_KIND_NAMES[kind]}, got {_toml_type(value)}")
    if kind == "float":
        return float(value)  # type: ignore[arg-type]
    if kind == "fsync":
        return _fsync(str(value), origin)
    return value


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _parse_env(setting: Setting, raw: str, origin: str) -> Any:
    text = raw.strip()
    try:
        if setting.kind == "int":
            return int(text)
        if setting.kind == "float":
            return float(text)
    except ValueError:
        raise InvalidConfigError(
            f"{origin}: must be {_KIND_NAMES[setting.kind]}, got {raw!r}"
        ) from None
    if setting.kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise InvalidConfigError(
            f"{origin}: must be true or false (also 1/0, yes/no, on/off), got {raw!r}"
        )
    if setting.kind == "fsync":
        return _fsync(text, origin)
    return raw


def _fsync(text: str, origin: str) -> FsyncPolicy:
    try:
        return FsyncPolicy(text.lower())
    except ValueError:
        raise InvalidConfigError(
            f"{origin}: must be one of always, interval, never, got {text!r}"
        ) from None


def _check_range(setting: Setting, value: Any, origin: str) -> None:
    """Check one value against its config class's own validation, with only it changed."""
    try:
        if setting.kind == "str" and not str(value).strip() and setting.default != "":
            raise InvalidConfigError(f"{setting.key} must not be empty")
        if setting.kind == "float" and not math.isfinite(value):
            raise InvalidConfigError(f"{setting.key}={value} must be a finite number")
        if setting.section == "log":
            replace(_LOG_DEFAULTS, **{setting.field: value})
        elif setting.section == "broker":
            replace(_BROKER_DEFAULTS, **{setting.field: value})
        elif setting.section == "http":
            replace(_HTTP_DEFAULTS, **{setting.field: value})
        elif setting.section == "tls":
            replace(_TLS_DEFAULTS, **{setting.field: value}, check_pairs=False)
        elif setting.section == "security":
            replace(_SECURITY_DEFAULTS, **{setting.field: value})
        else:
            replace(_SERVER_DEFAULTS, **{setting.field: value})
    except InvalidConfigError as exc:
        # The config class names its field; say the setting's name where they differ.
        message = exc.message.replace(f"{setting.field}=", f"{setting.key}=")
        raise InvalidConfigError(f"{origin}: {message}") from None


# --- the default file -------------------------------------------------------------------------


def toml_value(value: object) -> str:
    """``value`` (a setting's) written as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, FsyncPolicy):
        return json.dumps(str(value))
    if isinstance(value, int):
        return f"{value:_}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return repr(value)
    # A JSON string is a TOML basic string: the same escapes (\\, \", \n, \uXXXX).
    return json.dumps(str(value), ensure_ascii=False)


_SECTION_HELP: dict[Section, str] = {
    "broker": "The broker: where data lives, topic creation, long-poll fetches.",
    "log": "Defaults of new topics' logs (a topic created with settings of its own keeps them).",
    "server": "The TCP listener of the binary protocol.",
    "http": "The HTTP gateway (REST API, health, OpenAPI spec); off while http_port = -1.",
    "tls": "TLS of every listener (binary protocol, HTTP, compatibility); on once a cert is set.",
    "security": "Authentication, authorization (ACLs), audit and quotas (docs/security.md).",
}


def default_toml() -> str:
    """A commented TOML file of every setting at its default value; loading it gives exactly
    the defaults."""
    lines = [
        "# tidewire configuration: tidewire serve --config FILE",
        "#",
        "# Every key is shown at its default value; delete the ones you do not change.",
        "# Precedence: command-line flags > TIDEWIRE_* environment variables > this file >",
        "# defaults. Each key's environment variable is TIDEWIRE_ and the key in capitals.",
    ]
    for section in SECTIONS:
        lines += ["", f"# {_SECTION_HELP[section]}", f"[{section}]"]
        for s in SETTINGS:
            if s.section == section:
                lines.append(f"# {s.help}  [{s.env}, {s.flag}]")
                lines.append(f"{s.key} = {toml_value(s.default)}")
    return "\n".join(lines) + "\n"
