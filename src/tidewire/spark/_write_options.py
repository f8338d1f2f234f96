"""The writing options of the ``tidewire`` sink and the columns it takes, checked once on the
driver.

Spark hands the options with lower-cased keys and string values; :func:`write_options` turns
them into a :class:`WriteOptions` and :func:`write_columns` checks the DataFrame's schema
against the columns of Spark's Kafka sink, each refused with a message naming it::

    value      binary or string   required (a null value is a tombstone)
    key        binary or string   optional; routes the record by its hash
    topic      string             optional; the record's topic unless the option topic is set
    partition  int                optional; an explicit partition (else by key, else rotating)
    headers    array<struct<key: string, value: binary or string>>   optional

Other columns are ignored, as by Spark's Kafka sink. docs/spark.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from tidewire.client import Credentials, TlsOptions
from tidewire.client._settings import ACKS, COMPRESSION, MAX_WRITER_ID, ProducerSettings
from tidewire.errors import InvalidConfigError
from tidewire.spark._options import credential_options, tls_options

__all__ = ["WriteColumns", "WriteOptions", "write_columns", "write_options"]


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """The checked writing options of one query."""

    server: str
    topic: str | None
    acks: str
    compression: str
    batch_bytes: int
    buffer_bytes: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    max_request_bytes: int
    #: ``tidewire.writerId`` of a batch write: the name of a job that may run again.
    writer_id: str | None
    #: ``tidewire.tls``, ``tidewire.tls.ca``, ...: TLS to the broker (None: plaintext).
    tls: TlsOptions | None = None
    #: ``tidewire.api.key`` and ``tidewire.sasl.mechanism`` (None: no authentication).
    credentials: Credentials | None = None

    def producer_settings(self) -> dict[str, object]:
        """The keyword arguments of the producer each task writes with."""
        return {
            "acks": self.acks,
            "compression": self.compression,
            "batch_bytes": self.batch_bytes,
            "buffer_bytes": self.buffer_bytes,
            "request_timeout_ms": self.request_timeout_ms,
            "delivery_timeout_ms": self.delivery_timeout_ms,
            "max_request_bytes": self.max_request_bytes,
        }


@dataclass(frozen=True, slots=True)
class WriteColumns:
    """Which of the sink's columns the DataFrame has: their positions (None: absent) and
    whether ``value`` / ``key`` / the header values are strings (UTF-8 encoded)."""

    value: int
    value_is_str: bool
    key: int | None
    key_is_str: bool
    topic: int | None
    partition: int | None
    headers: int | None
    header_value_is_str: bool


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return options.get(name) if value is None else value


def _int(options: Mapping[str, str], name: str, default: int) -> int:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {raw!r}") from None


def write_options(options: Mapping[str, str], *, streaming: bool) -> WriteOptions:
    """Check the options of a batch (``streaming=False``) or streaming write.

    Raises:
        ValueError: an option missing or malformed (the message names it).
    """
    servers = _get(options, "tidewire.servers")
    if servers is None or not servers.strip():
        raise ValueError('option tidewire.servers is required ("HOST:PORT", or a comma list)')
    server = servers.split(",")[0].strip()
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"option tidewire.servers: {server!r} is not HOST:PORT")
    topic = _get(options, "topic")
    if topic is not None and not topic.strip():
        raise ValueError("option topic is empty")
    acks = (_get(options, "tidewire.acks") or "durable").strip().lower()
    if acks not in ACKS or acks == "none":
        raise ValueError(
            f"option tidewire.acks must be durable or leader, not {acks!r} (exactly-once "
            "needs the broker's answers)"
        )
    compression = (_get(options, "tidewire.compression") or "none").strip().lower()
    if compression not in COMPRESSION:
        raise ValueError(
            f"option tidewire.compression must be one of {', '.join(COMPRESSION)}, "
            f"not {compression!r}"
        )
    writer_id = _get(options, "tidewire.writerId")
    if writer_id is not None:
        if streaming:
            raise ValueError(
                "option tidewire.writerId is for batch writes; a streaming query's writers "
                "are named after its query id and batch ids"
            )
        # room for "b/" and "/<partition>" within the broker's limit
        if not 1 <= len(writer_id.encode()) <= MAX_WRITER_ID - 16:
            raise ValueError(
                f"option tidewire.writerId must have 1..{MAX_WRITER_ID - 16} bytes of UTF-8"
            )
    defaults = ProducerSettings()
    opts = WriteOptions(
        server=server,
        topic=topic.strip() if topic is not None else None,
        acks=acks,
        compression=compression,
        batch_bytes=_int(options, "tidewire.batch.bytes", 256 * 1024),
        buffer_bytes=_int(options, "tidewire.buffer.bytes", defaults.buffer_bytes),
        request_timeout_ms=_int(
            options, "tidewire.request.timeout.ms", defaults.request_timeout_ms
        ),
        delivery_timeout_ms=_int(
            options, "tidewire.delivery.timeout.ms", defaults.delivery_timeout_ms
        ),
        max_request_bytes=_int(options, "tidewire.max.request.bytes", defaults.max_request_bytes),
        writer_id=writer_id,
        tls=tls_options(options),
        credentials=credential_options(options),
    )
    try:
        ProducerSettings(**opts.producer_settings(), writer_id="check")  # type: ignore[arg-type]
    except InvalidConfigError as exc:
        raise ValueError(f"option tidewire.{exc.message}") from None
    return opts


def _is_text_or_binary(t: DataType) -> bool:
    return isinstance(t, BinaryType | StringType)


def write_columns(schema: StructType, *, topic_option: str | None) -> WriteColumns:
    """Find and check the sink's columns in ``schema`` (names compared case-insensitively).

    Raises:
        ValueError: ``value`` missing, no topic (neither the option nor a column), or a
            column of the wrong type.
    """
    found: dict[str, tuple[int, DataType]] = {}
    for i, field in enumerate(schema.fields):
        name = field.name.lower()
        if name in ("value", "key", "topic", "partition", "headers") and name not in found:
            found[name] = (i, field.dataType)

    def bad(name: str, want: str) -> ValueError:
        return ValueError(f"column {name} must be {want}, not {found[name][1].simpleString()}")

    if "value" not in found:
        raise ValueError(
            "the DataFrame written to tidewire needs a value column (binary or string); "
            f"it has {', '.join(schema.fieldNames()) or 'no columns'}"
        )
    value_i, value_t = found["value"]
    if not _is_text_or_binary(value_t):
        raise bad("value", "binary or string")
    key_i: int | None = None
    key_is_str = False
    if "key" in found:
        key_i, key_t = found["key"]
        if not _is_text_or_binary(key_t):
            raise bad("key", "binary or string")
        key_is_str = isinstance(key_t, StringType)
    topic_i: int | None = None
    if "topic" in found:
        topic_i, topic_t = found["topic"]
        if not isinstance(topic_t, StringType):
            raise bad("topic", "string")
    if topic_option is None and topic_i is None:
        raise ValueError(
            "no topic to write to: set the option topic, or give the DataFrame a topic column"
        )
    if topic_option is not None:
        topic_i = None  # the option wins over the column, as in Spark's Kafka sink
    partition_i: int | None = None
    if "partition" in found:
        partition_i, partition_t = found["partition"]
        if not isinstance(partition_t, IntegerType | ShortType | ByteType | LongType):
            raise bad("partition", "int")
    headers_i: int | None = None
    header_value_is_str = False
    if "headers" in found:
        headers_i, headers_t = found["headers"]
        element = headers_t.elementType if isinstance(headers_t, ArrayType) else None
        names = [f.name.lower() for f in element.fields] if isinstance(element, StructType) else []
        if not isinstance(element, StructType) or names != ["key", "value"]:
            raise bad("headers", "array<struct<key: string, value: binary>>")
        assert isinstance(element, StructType)
        if not isinstance(element.fields[0].dataType, StringType) or not _is_text_or_binary(
            element.fields[1].dataType
        ):
            raise bad("headers", "array<struct<key: string, value: binary>>")
        header_value_is_str = isinstance(element.fields[1].dataType, StringType)
    return WriteColumns(
        value=value_i,
        value_is_str=isinstance(value_t, StringType),
        key=key_i,
        key_is_str=key_is_str,
        topic=topic_i,
        partition=partition_i,
        headers=headers_i,
        header_value_is_str=header_value_is_str,
    )
