"""Reading a partition's records for the HTTP API: whole batches from the broker, decoded,
the records before the offset asked for left out; a record as the Message JSON document."""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

from tidewire.broker import Broker
from tidewire.records import iter_batches, read_records

__all__ = ["DEFAULT_READ_BYTES", "StoredRecord", "message_doc", "read_partition"]

#: Bytes of batches read per request: enough for thousands of small messages, small enough
#: that one read never holds the loop for long.
DEFAULT_READ_BYTES = 1024 * 1024


class StoredRecord(NamedTuple):
    """One record as read back (the field order :func:`read_records` fills)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def read_partition(
    broker: Broker,
    topic: str,
    partition: int,
    offset: int,
    *,
    limit: int,
    max_bytes: int = DEFAULT_READ_BYTES,
) -> tuple[list[StoredRecord], int]:
    """Up to ``limit`` records from ``offset`` on (below the high watermark), and the offset
    to read next.

    Raises:
        UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError,
        PartitionCorruptError: as :meth:`Broker.read_partition`.
    """
    r = broker.read_partition(topic, partition, offset, max_bytes)
    out: list[StoredRecord] = []
    data = r.data
    for start, h in iter_batches(data, verify=False):  # the log checked them on append
        if h.last_offset < offset:
            continue
        out += read_records(data, start, h, StoredRecord, topic, partition, offset)
        if len(out) >= limit:
            break
    if len(out) > limit:
        del out[limit:]
    if out:  # the metrics' messages and bytes out, once per read (as fetch counts them)
        broker.count_delivered(topic, partition, len(out), len(data))
    return out, out[-1].offset + 1 if out else offset


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def message_doc(rec: StoredRecord, encoding: str) -> dict[str, Any]:
    """A stored record as the Message document: UTF-8 text when every field is valid
    UTF-8 (and base64 was not asked for), else base64."""
    if encoding != "base64":
        try:
            return {
                "partition": rec.partition,
                "offset": rec.offset,
                "timestamp": rec.timestamp,
                "key": _text(rec.key),
                "value": _text(rec.value),
                "headers": {k: _text(v) for k, v in rec.headers},
                "encoding": "utf-8",
            }
        except UnicodeDecodeError:
            pass
    return {
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "key": _b64(rec.key),
        "value": _b64(rec.value),
        "headers": {k: _b64(v) for k, v in rec.headers},
        "encoding": "base64",
    }
