"""The producer's settings, checked once when a producer is made (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from tidewire.errors import InvalidConfigError
from tidewire.protocol.messages import ACKS_DURABLE, ACKS_LEADER, ACKS_NONE
from tidewire.records import BATCH_OVERHEAD, Codec

__all__ = [
    "ACKS",
    "COMPRESSION",
    "DEFAULT_BATCH_BYTES",
    "MAX_IDEMPOTENT_IN_FLIGHT",
    "ProducerSettings",
    "check_ints",
]

#: ``acks`` names and their wire values.
ACKS = {"none": ACKS_NONE, "leader": ACKS_LEADER, "durable": ACKS_DURABLE}
#: ``compression`` names and their codecs.
COMPRESSION = {
    "none": Codec.NONE,
    "gzip": Codec.GZIP,
    "snappy": Codec.SNAPPY,
    "lz4": Codec.LZ4,
    "zstd": Codec.ZSTD,
}
#: The broker remembers the last 5 batches of each producer per partition: an idempotent
#: producer may have no more in flight, or a resend could be too old to recognise.
MAX_IDEMPOTENT_IN_FLIGHT = 5
#: The longest writer id in UTF-8 bytes (the broker's limit, docs/protocol.md).
MAX_WRITER_ID = 255
#: A batch is sent once it holds this much (unless its linger ends first). The broker's work
#: per produce request and, under fsync=always, per group commit is fixed (~0.5-0.9 ms), so
#: it is spread over as many messages as a batch holds: 1 MiB batches instead of 64 KiB cut the
#: broker's CPU per 1 KiB message under fsync=always from ~14 to ~4.5 µs and the producer's
#: from ~9 to ~5 (benchmarks/results/speed-producer2.md). A lone message is not held longer:
#: ``linger_ms`` still sends a batch that does not fill.
DEFAULT_BATCH_BYTES = 1024 * 1024
#: The largest batch the producer builds, whatever a topic allows: a request holds at least
#: one batch and must stay well within the protocol's 64 MiB frame limit.
MAX_BATCH_BYTES = 32 * 1024 * 1024


def check_ints(*options: tuple[str, object, int]) -> None:
    """Check ``(name, value, lowest)`` options of a consumer: each an int (not a bool) of at
    least ``lowest``.

    Raises:
        ValueError: naming the first option that is not.
    """
    for name, value, low in options:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, not {value!r}")


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfigError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidConfigError(f"{name}={value:,} must be within {low:,}..{high:,}")
    return value


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """Every option of :class:`~tidewire.client.AsyncProducer`, checked (see its docstring)."""

    linger_ms: int = 5
    batch_bytes: int = DEFAULT_BATCH_BYTES
    buffer_bytes: int = 32 * 1024 * 1024
    max_block_ms: int = 60_000
    compression: str = "none"
    acks: str = "durable"
    idempotence: bool = True
    retries: int = 2**31 - 1
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 100
    max_in_flight_per_partition: int = 5
    pipeline_partial_batches: bool = False
    request_timeout_ms: int = 30_000
    max_request_bytes: int = 1024 * 1024
    metadata_max_age_ms: int = 300_000
    connect_timeout_ms: int = 10_000
    writer_id: str | None = None

    def __post_init__(self) -> None:
        day = 86_400_000
        _int("linger_ms", self.linger_ms, 0, 60_000)
        _int("batch_bytes", self.batch_bytes, BATCH_OVERHEAD + 16, MAX_BATCH_BYTES)
        _int("buffer_bytes", self.buffer_bytes, self.batch_bytes, 2**40)
        _int("max_block_ms", self.max_block_ms, 0, day)
        if self.compression not in COMPRESSION:
            raise InvalidConfigError(
                f"compression={self.compression!r} must be one of {', '.join(COMPRESSION)}"
            )
        if self.acks not in ACKS:
            raise InvalidConfigError(f"acks={self.acks!r} must be one of {', '.join(ACKS)}")
        if not isinstance(self.idempotence, bool):
            raise InvalidConfigError("idempotence must be True or False")
        _int("retries", self.retries, 0, 2**31 - 1)
        _int("request_timeout_ms", self.request_timeout_ms, 1, day)
        _int("retry_backoff_ms", self.retry_backoff_ms, 0, 60_000)
        _int("delivery_timeout_ms", self.delivery_timeout_ms, 1, day)
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise InvalidConfigError(
                f"delivery_timeout_ms={self.delivery_timeout_ms:,} must be at least linger_ms + "
                f"request_timeout_ms = {self.linger_ms + self.request_timeout_ms:,}"
            )
        most = MAX_IDEMPOTENT_IN_FLIGHT if self.idempotence else 1000
        _int("max_in_flight_per_partition", self.max_in_flight_per_partition, 1, most)
        if not isinstance(self.pipeline_partial_batches, bool):
            raise InvalidConfigError("pipeline_partial_batches must be True or False")
        _int("max_request_bytes", self.max_request_bytes, 1024, MAX_BATCH_BYTES)
        _int("metadata_max_age_ms", self.metadata_max_age_ms, 0, day)
        _int("connect_timeout_ms", self.connect_timeout_ms, 1, day)
        if self.idempotence and self.acks == "none":
            raise InvalidConfigError(
                'idempotence needs the broker\'s answers: use acks="leader" or "durable", '
                "or idempotence=False"
            )
        if self.writer_id is not None:
            if not isinstance(self.writer_id, str):
                raise InvalidConfigError(
                    f"writer_id must be a str, not {type(self.writer_id).__name__}"
                )
            n = len(self.writer_id.encode())
            if not 1 <= n <= MAX_WRITER_ID:
                raise InvalidConfigError(
                    f"writer_id has {n:,} bytes of UTF-8; it must have 1..{MAX_WRITER_ID}"
                )
            if not self.idempotence:
                raise InvalidConfigError("a writer_id needs idempotence=True")

    @property
    def codec(self) -> Codec:
        return COMPRESSION[self.compression]

    @property
    def acks_value(self) -> int:
        return ACKS[self.acks]
