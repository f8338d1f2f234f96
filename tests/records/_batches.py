"""Shared test helpers for the record-batch codec: hypothesis strategies for batches, a
reference encoder for raw (possibly malformed) records, and header patching that can re-seal
a batch (fix its length and CRC-32C) so a test reaches the check it aims at, not the CRC's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from hypothesis import strategies as st

from tidewire.records import BatchBuilder, BatchHeader, Codec, Record, crc32c, varint
from tidewire.records.batch import ATTRIBUTES_OFFSET, BATCH_OVERHEAD, CRC_OFFSET, HEADER
from tidewire.records.compression import compress

#: The codecs tidewire reads and writes: all of Kafka's.
SUPPORTED_CODECS = (Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)
COMPRESSED_CODECS = (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)

INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

#: 2100-01-01 in ms: timestamps stay well inside what a 64-bit delta can express.
MAX_TIMESTAMP_MS = 4_102_444_800_000


class RecordSpec(NamedTuple):
    """One record as a producer appends it."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class BatchSpec(NamedTuple):
    """Everything :class:`BatchBuilder` is given to build one batch."""

    records: tuple[RecordSpec, ...]
    codec: Codec = Codec.NONE
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    partition_leader_epoch: int = -1
    timestamp_type: int = 0
    base_offset: int = 0


def build(spec: BatchSpec) -> bytes:
    """Build ``spec`` with :class:`BatchBuilder`."""
    b = BatchBuilder(
        codec=spec.codec,
        producer_id=spec.producer_id,
        producer_epoch=spec.producer_epoch,
        base_sequence=spec.base_sequence,
        partition_leader_epoch=spec.partition_leader_epoch,
        timestamp_type=spec.timestamp_type,
        base_offset=spec.base_offset,
    )
    for i, r in enumerate(spec.records):
        assert b.append(r.value, timestamp_ms=r.timestamp, key=r.key, headers=r.headers) == i
    return b.build()


def expected_records(spec: BatchSpec) -> list[Record]:
    """The records :func:`decode_batch` must return for a batch built from ``spec``."""
    return [
        Record(spec.base_offset + i, r.timestamp, r.key, r.value, r.headers)
        for i, r in enumerate(spec.records)
    ]


def relative(records: Sequence[Record], base_offset: int) -> list[Record]:
    """``records`` with offsets made relative to ``base_offset`` (which lies outside the CRC)."""
    return [r._replace(offset=r.offset - base_offset) for r in records]


# --- strategies ---------------------------------------------------------------------------------


def nullable_bytes(max_size: int) -> st.SearchStrategy[bytes | None]:
    return st.none() | st.binary(max_size=max_size)


timestamps = st.integers(0, MAX_TIMESTAMP_MS)
header_keys = st.text(st.characters(codec="utf-8"), max_size=12)
headers = st.lists(st.tuples(header_keys, nullable_bytes(16)), max_size=4).map(tuple)

record_specs = st.builds(
    RecordSpec,
    timestamp=timestamps,
    key=nullable_bytes(32),
    value=nullable_bytes(200),
    headers=headers,
)


def batch_specs(*, min_records: int = 1, max_records: int = 12) -> st.SearchStrategy[BatchSpec]:
    """Random batches: records, codec and every producer-controlled header field."""
    return st.builds(
        BatchSpec,
        records=st.lists(record_specs, min_size=min_records, max_size=max_records).map(tuple),
        codec=st.sampled_from(SUPPORTED_CODECS),
        producer_id=st.integers(*INT64),
        producer_epoch=st.integers(*INT16),
        base_sequence=st.integers(*INT32),
        partition_leader_epoch=st.integers(*INT32),
        timestamp_type=st.sampled_from((0, 1)),
        base_offset=st.integers(0, 2**62),
    )


# --- raw bytes ----------------------------------------------------------------------------------


def header_of(batch: bytes | bytearray) -> BatchHeader:
    """Unpack the 61-byte header without any check."""
    return BatchHeader._make(HEADER.unpack_from(batch, 0))


def patch_header(batch: bytes, **fields: int) -> bytes:
    """Return ``batch`` with header ``fields`` replaced (length and CRC left as they are)."""
    buf = bytearray(batch)
    HEADER.pack_into(buf, 0, *header_of(buf)._replace(**fields))
    return bytes(buf)


def reseal(batch: bytes | bytearray) -> bytes:
    """Return ``batch`` with ``batch_length`` and the CRC-32C rewritten to match its bytes."""
    buf = bytearray(batch)
    buf[8:12] = (len(buf) - 12).to_bytes(4, "big", signed=True)
    buf[CRC_OFFSET:ATTRIBUTES_OFFSET] = crc32c(bytes(buf[ATTRIBUTES_OFFSET:])).to_bytes(4, "big")
    return bytes(buf)


def with_section(batch: bytes, section: bytes, **fields: int) -> bytes:
    """Replace the (already compressed) records section and header ``fields``, then reseal."""
    return reseal(patch_header(batch[:BATCH_OVERHEAD], **fields) + section)


def raw_bytes(data: bytes | None) -> bytes:
    return varint.encode(-1) if data is None else varint.encode(len(data)) + data


def raw_record(
    *,
    value: bytes | None = b"v",
    key: bytes | None = None,
    timestamp_delta: int = 0,
    offset_delta: int = 0,
    headers: Sequence[tuple[bytes | None, bytes | None]] = (),
    attributes: int = 0,
    length_prefix: bytes | None = None,
    body_suffix: bytes = b"",
) -> bytes:
    """Encode one record by hand, independently of :class:`BatchBuilder`.

    Header keys are raw bytes (so a test can write one that is not UTF-8, or null);
    ``length_prefix`` replaces the record's length varint; ``body_suffix`` adds bytes after
    the fields that the length then counts.
    """
    hparts = [varint.encode(len(headers))]
    for hk, hv in headers:
        hparts.append(raw_bytes(hk))
        hparts.append(raw_bytes(hv))
    body = (
        bytes([attributes])
        + varint.encode(timestamp_delta)
        + varint.encode(offset_delta)
        + raw_bytes(key)
        + raw_bytes(value)
        + b"".join(hparts)
        + body_suffix
    )
    prefix = varint.encode(len(body)) if length_prefix is None else length_prefix
    return prefix + body


def raw_batch(
    records: Sequence[bytes],
    *,
    codec: Codec = Codec.NONE,
    first_timestamp: int = 1_700_000_000_000,
    **fields: int,
) -> bytes:
    """A sealed batch around hand-encoded ``records`` (header ``fields`` may override)."""
    n = len(records)
    header = BatchBuilder(codec=codec).build()[:BATCH_OVERHEAD]
    defaults = {
        "records_count": n,
        "last_offset_delta": max(n - 1, 0),
        "first_timestamp": first_timestamp,
        "max_timestamp": first_timestamp,
    }
    section = compress(codec, b"".join(records))
    return with_section(header, section, **(defaults | fields))
