"""Reading a partition's records for the HTTP API: whole batches from the broker, decoded,
the records before the offset asked for left out; a record as the Message JSON document."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, NamedTuple

from tidewire.broker import Broker
from tidewire.records import iter_batches, read_records

if TYPE_CHECKING:
    from tidewire.server.http.peers import PeerClient

__all__ = [
    "DEFAULT_READ_BYTES",
    "StoredRecord",
    "fetch_remote",
    "message_doc",
    "read_partition",
    "read_remote",
]

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


async def read_remote(
    peer: PeerClient,
    topic: str,
    partition: int,
    offset: int,
    *,
    limit: int,
    max_bytes: int = DEFAULT_READ_BYTES,
) -> list[StoredRecord]:
    """As :func:`read_partition`, for a partition of a cluster that this node holds no
    replica of: up to ``limit`` records from ``offset`` on, fetched from its leader (below
    its high watermark) through this node's ``peer`` client.

    Raises:
        UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError,
        PartitionCorruptError: as the leader answers; NotLeaderError, ConnectionLostError:
        no leader answered in time.
    """
    got, _, _ = await fetch_remote(peer, topic, partition, offset, limit=limit, max_bytes=max_bytes)
    return got


async def fetch_remote(
    peer: PeerClient,
    topic: str,
    partition: int,
    offset: int,
    *,
    limit: int,
    max_bytes: int = DEFAULT_READ_BYTES,
    max_wait_ms: int = 0,
) -> tuple[list[StoredRecord], int, int]:
    """As :func:`read_remote` (long-polled on the leader up to ``max_wait_ms`` when there is
    nothing yet): the records, the offset to read next and the leader's high watermark.

    Raises:
        as :func:`read_remote`.
    """
    got = await peer.fetch(topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms)
    out: list[StoredRecord] = []
    for start, h in iter_batches(got.data, verify=False):  # the leader's log checked them
        if h.last_offset < offset:
            continue
        out += read_records(got.data, start, h, StoredRecord, topic, partition, offset)
        if len(out) >= limit:
            break
    del out[limit:]
    return out, out[-1].offset + 1 if out else offset, got.high_watermark


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
