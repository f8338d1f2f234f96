"""The reading options of the ``tidewire`` source, checked once on the driver.

Spark hands a data source its options with the keys lower-cased and every value a string;
:func:`read_options` turns them into a :class:`ReadOptions`, refusing a missing, conflicting
or malformed option with a message naming it. The names follow Spark's Kafka source
(``subscribe``, ``startingOffsets``, ``failOnDataLoss``, ...), with ``tidewire.``-prefixed
settings of the connection in place of ``kafka.``-prefixed ones. docs/spark.md has the table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tidewire.client import Credentials, TlsOptions
from tidewire.errors import InvalidConfigError, TidewireError

__all__ = [
    "EARLIEST",
    "LATEST",
    "Assign",
    "OffsetSpec",
    "PartitionOffsets",
    "PartitionTimestamps",
    "ReadOptions",
    "Subscribe",
    "SubscribePattern",
    "Subscription",
    "TimestampSpec",
    "TopicPartition",
    "credential_options",
    "parse_bool",
    "read_options",
    "tls_options",
]

TopicPartition = tuple[str, int]

#: The default of ``tidewire.fetch.max.bytes``: bytes one fetch request brings back. Large
#: enough that a fetch carries thousands of records (one Arrow batch each), small enough that
#: a task's memory stays a few of them.
DEFAULT_FETCH_MAX_BYTES = 8 * 1024 * 1024
#: The largest ``tidewire.fetch.max.bytes`` accepted: a fetch response is held whole in a
#: task's memory, and must fit the client's largest frame (64 MiB) with room to spare.
MAX_FETCH_MAX_BYTES = 32 * 1024 * 1024
#: The default of ``tidewire.request.timeout.ms``.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``subscribe``: these topics, every partition."""

    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SubscribePattern:
    """``subscribePattern``: every topic whose whole name matches the regular expression."""

    pattern: str


@dataclass(frozen=True, slots=True)
class Assign:
    """``assign``: exactly these partitions."""

    partitions: tuple[TopicPartition, ...]


Subscription = Subscribe | SubscribePattern | Assign

#: ``earliest``: the log start of each partition.
EARLIEST: Literal["earliest"] = "earliest"
#: ``latest``: the high watermark (the next offset to be written) of each partition.
LATEST: Literal["latest"] = "latest"

#: Kafka's sentinels inside an offsets JSON.
_EARLIEST_SENTINEL = -2
_LATEST_SENTINEL = -1


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Offsets given per partition as JSON; -2 means earliest and -1 latest. Partitions not
    named take ``default``."""

    offsets: Mapping[TopicPartition, int]
    default: Literal["earliest", "latest"]


@dataclass(frozen=True, slots=True)
class TimestampSpec:
    """One timestamp (ms since the epoch) for every partition: the first record at or after
    it (the partition's end when there is none)."""

    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PartitionTimestamps:
    """A timestamp per partition (``startingOffsetsByTimestamp``); partitions not named take
    ``default``."""

    timestamps: Mapping[TopicPartition, int]
    default: Literal["earliest", "latest"]


OffsetSpec = Literal["earliest", "latest"] | PartitionOffsets | TimestampSpec | PartitionTimestamps


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The checked reading options of one query."""

    servers: tuple[str, ...]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_offsets_per_trigger: int | None
    group_id: str | None
    fetch_max_bytes: int
    request_timeout_ms: int
    tls: TlsOptions | None = None
    #: ``tidewire.api.key`` and ``tidewire.sasl.mechanism`` (None: no authentication). Its
    #: repr shows the key id only.
    credentials: Credentials | None = None


def _get(options: Mapping[str, str], name: str) -> str | None:
    """The value of option ``name`` (Spark lower-cases the keys; so does this lookup)."""
    value = options.get(name.lower())
    if value is None:
        value = options.get(name)
    return value


def parse_bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    """Option ``name`` as a boolean (``true`` / ``false``, any case).

    Raises:
        ValueError: another value.
    """
    raw = _get(options, name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, not {raw!r}")
    return text == "true"


def _parse_int(
    options: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None
) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum:,}" if maximum is None else f"{minimum:,}..{maximum:,}"
        raise ValueError(f"option {name} must be {bound}, not {value:,}")
    return value


def _parse_json_object(name: str, raw: str) -> dict[str, object]:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"option {name} is not valid JSON ({exc.msg}): {raw!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"option {name} must be a JSON object, not {raw!r}")
    return parsed


def _partition_number(name: str, topic: str, text: object) -> int:
    try:
        partition = int(str(text))
    except ValueError:
        raise ValueError(f"option {name}: {text!r} of topic {topic!r} is not a partition") from None
    if partition < 0:
        raise ValueError(f"option {name}: partition {partition} of topic {topic!r} is negative")
    return partition


def _per_partition(name: str, raw: str) -> dict[TopicPartition, int]:
    """``{"topic": {"0": 12, "1": -2}}`` as ``{("topic", 0): 12, ("topic", 1): -2}``."""
    out: dict[TopicPartition, int] = {}
    for topic, partitions in _parse_json_object(name, raw).items():
        if not isinstance(partitions, dict):
            raise ValueError(
                f'option {name}: topic {topic!r} must map to {{"partition": number}}, '
                f"not {partitions!r}"
            )
        for p, value in partitions.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"option {name}: {topic}/{p} must be an integer, not {value!r}")
            out[(topic, _partition_number(name, topic, p))] = value
    return out


def _parse_assign(raw: str) -> Assign:
    """``{"topic": [0, 1]}``."""
    tps: list[TopicPartition] = []
    for topic, partitions in _parse_json_object("assign", raw).items():
        if not isinstance(partitions, list) or not partitions:
            raise ValueError(
                f"option assign: topic {topic!r} must map to a non-empty list of partitions, "
                f"not {partitions!r}"
            )
        tps += [(topic, _partition_number("assign", topic, p)) for p in partitions]
    if not tps:
        raise ValueError("option assign names no partition")
    return Assign(tuple(sorted(set(tps))))


def _parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = {n: _get(options, n) for n in ("subscribe", "subscribePattern", "assign")}
    present = [n for n, v in given.items() if v is not None]
    if len(present) != 1:
        raise ValueError(
            "exactly one of the options subscribe, subscribePattern and assign must be given"
            + (f" (got {', '.join(present)})" if present else "")
        )
    (which,) = present
    raw = given[which]
    assert raw is not None
    if which == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise ValueError(f"option subscribe names no topic: {raw!r}")
        return Subscribe(tuple(dict.fromkeys(topics)))
    if which == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise ValueError(
                f"option subscribePattern is not a regular expression: {exc}"
            ) from None
        return SubscribePattern(raw)
    return _parse_assign(raw)


def _parse_offsets(
    options: Mapping[str, str], which: Literal["starting", "ending"], *, streaming: bool
) -> OffsetSpec:
    """startingOffsets / endingOffsets with the timestamp variants, which take precedence:
    ``...Timestamp`` over ``...OffsetsByTimestamp`` over ``...Offsets`` (as in Kafka)."""
    default: Literal["earliest", "latest"]
    if which == "starting":
        default = LATEST if streaming else EARLIEST
    else:
        default = LATEST
    timestamp = _parse_int(options, f"{which}Timestamp", minimum=0)
    if timestamp is not None:
        return TimestampSpec(timestamp)
    by_ts_name = f"{which}OffsetsByTimestamp"
    by_ts = _get(options, by_ts_name)
    if by_ts is not None:
        stamps = _per_partition(by_ts_name, by_ts)
        for (topic, p), ts in stamps.items():
            if ts < 0:
                raise ValueError(f"option {by_ts_name}: {topic}/{p} has a negative timestamp")
        return PartitionTimestamps(stamps, default)
    name = f"{which}Offsets"
    raw = _get(options, name)
    if raw is None:
        return default
    text = raw.strip()
    if text.lower() in (EARLIEST, LATEST):
        return EARLIEST if text.lower() == EARLIEST else LATEST
    offsets = _per_partition(name, text)
    for (topic, p), offset in offsets.items():
        if offset < _EARLIEST_SENTINEL:
            raise ValueError(
                f"option {name}: {topic}/{p} is {offset}; an offset is -2 (earliest), "
                "-1 (latest) or at least 0"
            )
    return PartitionOffsets(offsets, default)


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check the options of a batch (``streaming=False``) or streaming read.

    Raises:
        ValueError: an option missing, conflicting with another, or malformed (the message
            names it).
    """
    servers_raw = _get(options, "tidewire.servers")
    if servers_raw is None or not servers_raw.strip():
        raise ValueError('option tidewire.servers is required ("HOST:PORT", or a comma list)')
    servers = tuple(s.strip() for s in servers_raw.split(",") if s.strip())
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"option tidewire.servers: {server!r} is not HOST:PORT")
    subscription = _parse_subscription(options)
    starting = _parse_offsets(options, "starting", streaming=streaming)
    ending = _parse_offsets(options, "ending", streaming=streaming)
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if _get(options, name) is not None:
                raise ValueError(f"option {name} is for batch queries; a stream has no end")
    else:
        if starting == LATEST:
            raise ValueError(
                "startingOffsets=latest reads nothing in a batch query; "
                "use earliest, offsets or a timestamp"
            )
        if ending == EARLIEST:
            raise ValueError("endingOffsets=earliest reads nothing in a batch query")
        for name in ("maxOffsetsPerTrigger", "tidewire.group.id"):
            if _get(options, name) is not None:
                raise ValueError(f"option {name} is for streaming queries")
    if isinstance(starting, PartitionOffsets) and not streaming:
        for (topic, p), offset in starting.offsets.items():
            if offset == _LATEST_SENTINEL:
                raise ValueError(
                    f"option startingOffsets: {topic}/{p} is -1 (latest), "
                    "which reads nothing in a batch query"
                )
    if isinstance(ending, PartitionOffsets):
        for (topic, p), offset in ending.offsets.items():
            if offset == _EARLIEST_SENTINEL:
                raise ValueError(f"option endingOffsets: {topic}/{p} is -2 (earliest)")
    group_id = _get(options, "tidewire.group.id")
    if group_id is not None and not group_id.strip():
        raise ValueError("option tidewire.group.id is empty")
    return ReadOptions(
        servers=servers,
        subscription=subscription,
        starting=starting,
        ending=ending,
        fail_on_data_loss=parse_bool(options, "failOnDataLoss", default=True),
        include_headers=parse_bool(options, "includeHeaders", default=False),
        min_partitions=_parse_int(options, "minPartitions", minimum=1),
        max_offsets_per_trigger=_parse_int(options, "maxOffsetsPerTrigger", minimum=1),
        group_id=group_id.strip() if group_id is not None else None,
        fetch_max_bytes=_parse_int(
            options, "tidewire.fetch.max.bytes", minimum=1024, maximum=MAX_FETCH_MAX_BYTES
        )
        or DEFAULT_FETCH_MAX_BYTES,
        request_timeout_ms=_parse_int(options, "tidewire.request.timeout.ms", minimum=1)
        or DEFAULT_REQUEST_TIMEOUT_MS,
        tls=tls_options(options),
        credentials=credential_options(options),
    )


#: The TLS options of the source and the sink, and the TlsOptions field each sets.
TLS_OPTION_FIELDS = {
    "tidewire.tls.ca": "ca_file",
    "tidewire.tls.cert": "cert_file",
    "tidewire.tls.key": "key_file",
    "tidewire.tls.server.name": "server_hostname",
}


def tls_options(options: Mapping[str, str]) -> TlsOptions | None:
    """``tidewire.tls`` (true: TLS with the system's CAs) and ``tidewire.tls.ca``,
    ``.cert``, ``.key``, ``.server.name`` (any of them turns TLS on) as the client's
    :class:`~tidewire.client.TlsOptions`; None: plaintext. The files are loaded here, on the
    driver, so a wrong path fails the query at once (the executors need the same paths).

    Raises:
        ValueError: a malformed value, or a file that cannot be loaded (named).
    """
    on = parse_bool(options, "tidewire.tls", default=False)
    given = {}
    for name, field in TLS_OPTION_FIELDS.items():
        value = _get(options, name)
        if value is not None:
            if not value.strip():
                raise ValueError(f"option {name} is empty")
            given[field] = value.strip()
    if not on and not given:
        return None
    try:
        tls = TlsOptions(**given)
        tls.context()
    except InvalidConfigError as exc:
        raise ValueError(f"option tidewire.tls: {exc.message}") from None
    return tls


def credential_options(options: Mapping[str, str]) -> Credentials | None:
    """``tidewire.api.key`` (an API key, ``twk_...``) and ``tidewire.sasl.mechanism``
    (``SCRAM-SHA-256``, the default, ``SCRAM-SHA-512`` or ``PLAIN``) as the clients'
    :class:`~tidewire.client.Credentials`; None without a key. The key is checked here, on
    the driver, and never repeated in an error, a repr or a log.

    Raises:
        ValueError: not an API key, or an unknown mechanism.
    """
    key = _get(options, "tidewire.api.key")
    mechanism = (_get(options, "tidewire.sasl.mechanism") or "SCRAM-SHA-256").strip().upper()
    if key is None:
        if _get(options, "tidewire.sasl.mechanism") is not None:
            raise ValueError("option tidewire.sasl.mechanism needs tidewire.api.key")
        return None
    if not key.strip():
        raise ValueError("option tidewire.api.key is empty")
    try:
        return Credentials(key.strip(), mechanism)
    except TidewireError as exc:  # a malformed key: the message does not repeat it
        raise ValueError(f"option tidewire.api.key: {exc.message}") from None
    except ValueError as exc:
        raise ValueError(f"option tidewire.sasl.mechanism: {exc}") from None
