"""Build with :class:`BatchBuilder`, read back with :func:`decode_batch`: every record and
every header field survives, for every codec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.records._batches import (
    SUPPORTED_CODECS,
    BatchSpec,
    RecordSpec,
    batch_specs,
    build,
    expected_records,
    raw_batch,
    raw_record,
)
from tidewire.records import (
    BATCH_OVERHEAD,
    BatchBuilder,
    Codec,
    TimestampType,
    build_batch,
    check_batch,
    crc32c,
    decode_batch,
    iter_records,
    parse_header,
    peek_base_offset,
    peek_batch_size,
)

ATTRIBUTES_START = 21  # where the CRC-covered region starts


@settings(deadline=None)
@given(batch_specs(min_records=1, max_records=12))
def test_round_trip(spec: BatchSpec) -> None:
    batch = build(spec)
    h, records = decode_batch(batch)

    assert records == expected_records(spec)
    assert [r.offset for r in records] == list(range(spec.base_offset, h.next_offset))
    n = len(spec.records)
    timestamps = [r.timestamp for r in spec.records]
    assert h.base_offset == spec.base_offset
    assert h.batch_length == len(batch) - 12
    assert h.size == len(batch)
    assert h.partition_leader_epoch == spec.partition_leader_epoch
    assert h.magic == 2
    assert h.crc == crc32c(batch[ATTRIBUTES_START:])
    assert h.codec is spec.codec
    assert h.timestamp_type == spec.timestamp_type
    assert h.attributes == int(spec.codec) | (0x08 if spec.timestamp_type else 0)
    assert h.records_count == n
    assert h.last_offset_delta == n - 1
    assert h.last_offset == spec.base_offset + n - 1
    assert h.first_timestamp == timestamps[0]
    assert h.max_timestamp == max(timestamps)
    assert h.producer_id == spec.producer_id
    assert h.producer_epoch == spec.producer_epoch
    assert h.base_sequence == spec.base_sequence

    # the cheap checks agree with the full decode, and bytearray / memoryview read the same
    assert check_batch(batch) == h
    assert parse_header(batch) == h
    assert peek_batch_size(batch) == len(batch)
    assert peek_base_offset(batch) == spec.base_offset
    assert list(iter_records(batch)) == records
    assert decode_batch(bytearray(batch)) == (h, records)
    assert decode_batch(memoryview(batch)) == (h, records)


@settings(deadline=None)
@given(batch_specs(min_records=0, max_records=6))
def test_builder_size_and_length_bookkeeping(spec: BatchSpec) -> None:
    b = BatchBuilder(codec=spec.codec)
    assert len(b) == 0
    assert b.size_in_bytes == BATCH_OVERHEAD
    for i, r in enumerate(spec.records):
        assert b.append(r.value, timestamp_ms=r.timestamp, key=r.key, headers=r.headers) == i
        assert len(b) == i + 1
    uncompressed = b.size_in_bytes
    batch = b.build()
    if spec.codec is Codec.NONE:
        assert uncompressed == len(batch)  # documented as exact without compression
    with pytest.raises(RuntimeError, match="after build"):
        b.append(b"late", timestamp_ms=0)


@given(st.lists(st.none() | st.binary(max_size=50), max_size=10), st.sampled_from(SUPPORTED_CODECS))
def test_build_batch_convenience(values: list[bytes | None], codec: Codec) -> None:
    batch = build_batch(values, timestamp_ms=1_000, codec=codec, key=b"k")
    h, records = decode_batch(batch)
    assert h.codec is codec
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (i, 1_000, b"k", v, ()) for i, v in enumerate(values)
    ]


def test_non_monotonic_timestamps_keep_first_and_max() -> None:
    ts = [5_000, 1_000, 9_000, 0, 7_000]
    spec = BatchSpec(records=tuple(RecordSpec(t, None, b"x", ()) for t in ts))
    h, records = decode_batch(build(spec))
    assert [r.timestamp for r in records] == ts
    assert (h.first_timestamp, h.max_timestamp) == (5_000, 9_000)


def test_null_and_empty_are_distinct() -> None:
    spec = BatchSpec(
        records=(
            RecordSpec(1, None, None, ()),
            RecordSpec(1, b"", b"", (("", b""), ("h", None))),
        )
    )
    assert decode_batch(build(spec))[1] == expected_records(spec)


def test_log_append_time_sets_attribute_bit_3() -> None:
    b = BatchBuilder(timestamp_type=TimestampType.LOG_APPEND_TIME)
    b.append(b"v", timestamp_ms=1)
    h, _ = decode_batch(b.build())
    assert h.attributes & 0x08
    assert h.timestamp_type == TimestampType.LOG_APPEND_TIME


@pytest.mark.parametrize("codec", SUPPORTED_CODECS)
def test_empty_batch(codec: Codec) -> None:
    # The builder does not refuse an empty batch. What it writes and what decode makes of it:
    # no records, first/max timestamp -1 ("no timestamp"), and last_offset_delta 0 (the
    # builder clamps count - 1 at 0).
    batch = BatchBuilder(codec=codec).build()
    h, records = decode_batch(batch)
    assert records == []
    assert h.records_count == 0
    assert h.last_offset_delta == 0
    assert (h.first_timestamp, h.max_timestamp) == (-1, -1)
    assert h.codec is codec
    if codec is Codec.NONE:
        assert len(batch) == BATCH_OVERHEAD


def test_snappy_builder_writes_xerial_framing() -> None:
    # Kafka's Java client writes snappy in snappy-java's (xerial) framing and every Kafka
    # consumer reads it, so that is what the builder writes too.
    b = BatchBuilder(codec=Codec.SNAPPY)
    b.append(b"v" * 100_000, key=b"k", timestamp_ms=1)
    batch = b.build()
    assert b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01" in batch
    assert decode_batch(batch)[1][0].value == b"v" * 100_000


@settings(deadline=None)
@given(batch_specs(min_records=0, max_records=6))
def test_reference_encoder_agrees_with_builder(spec: BatchSpec) -> None:
    # The hand encoder that the malformed-input tests use writes exactly what the builder
    # writes, so those tests start from realistic bytes.
    first = spec.records[0].timestamp if spec.records else -1
    raws = [
        raw_record(
            value=r.value,
            key=r.key,
            timestamp_delta=r.timestamp - first,
            offset_delta=i,
            headers=[(k.encode(), v) for k, v in r.headers],
        )
        for i, r in enumerate(spec.records)
    ]
    expected = build(spec._replace(base_offset=0, partition_leader_epoch=-1))
    got = raw_batch(
        raws,
        codec=spec.codec,
        first_timestamp=first,
        max_timestamp=max((r.timestamp for r in spec.records), default=-1),
        attributes=int(spec.codec) | (0x08 if spec.timestamp_type else 0),
        producer_id=spec.producer_id,
        producer_epoch=spec.producer_epoch,
        base_sequence=spec.base_sequence,
    )
    if spec.codec is Codec.NONE:
        assert got == expected
    else:  # compressed bytes may legitimately differ; the records may not
        assert decode_batch(got) == decode_batch(expected)


def test_negative_timestamps_get_a_true_max_timestamp_or_are_refused() -> None:
    b = BatchBuilder()
    try:
        b.append(b"a", timestamp_ms=-5_000)
        b.append(b"b", timestamp_ms=-10_000)
    except ValueError:
        return  # refusing pre-epoch timestamps (as Kafka does) is also a correct answer
    h, records = decode_batch(b.build())
    assert [r.timestamp for r in records] == [-5_000, -10_000]
    assert h.max_timestamp == -5_000
