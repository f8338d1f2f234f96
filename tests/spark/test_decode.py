"""Fetched batches to Arrow, without Spark: every field, ranges cut inside batches, every
codec, log-append time, and malformed input named by the reference decoder."""

from __future__ import annotations

import pytest

from tidewire.errors import RecordBatchError
from tidewire.records import BatchBuilder, Codec, TimestampType
from tidewire.spark import arrow_schema
from tidewire.spark._decode import decode_fetch

T0 = 1_700_000_000_000


def stored(base: int, builder: BatchBuilder) -> bytes:
    """A built batch with the base offset the broker would write into it."""
    raw = bytearray(builder.build())
    raw[0:8] = base.to_bytes(8, "big")
    return bytes(raw)


def batch(base: int, n: int, codec: Codec = Codec.NONE, **kw: object) -> bytes:
    b = BatchBuilder(codec=codec, **kw)  # type: ignore[arg-type]
    for i in range(n):
        off = base + i
        b.append(
            b"v%d" % off if off % 5 else None,
            key=b"k%d" % off if off % 3 else None,
            headers=[("h", b"%d" % off), ("n", None)] if off % 2 else [],
            timestamp_ms=T0 + off,
        )
    return stored(base, b)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD])
@pytest.mark.parametrize("headers", [False, True])
def test_every_field_and_range(codec: Codec, headers: bool) -> None:
    data = batch(0, 4, codec) + batch(4, 300, codec) + batch(304, 3, codec)
    got = decode_fetch(data, "t", 7, 2, 306, include_headers=headers)
    assert got.next_offset == 306
    assert got.batch is not None
    assert got.batch.schema.equals(arrow_schema(headers))
    rows = got.batch.to_pylist()
    assert [r["offset"] for r in rows] == list(range(2, 306))
    for r in rows:
        off = r["offset"]
        assert r["key"] == (b"k%d" % off if off % 3 else None)
        assert r["value"] == (b"v%d" % off if off % 5 else None)
        assert (r["topic"], r["partition"], r["timestampType"]) == ("t", 7, 0)
        assert int(r["timestamp"].timestamp() * 1000) == T0 + off
        if headers:
            want = [{"key": "h", "value": b"%d" % off}, {"key": "n", "value": None}]
            assert r["headers"] == (want if off % 2 else [])


def test_ends_and_partial_batches() -> None:
    data = batch(10, 5) + batch(15, 5)
    # Everything before start: the next fetch starts after it.
    assert decode_fetch(data, "t", 0, 20, 30, include_headers=False) == (None, 20)
    # A batch at or past the end stops the walk.
    got = decode_fetch(data, "t", 0, 10, 15, include_headers=False)
    assert got.batch is not None
    assert got.batch.column("offset").to_pylist() == [10, 11, 12, 13, 14]
    assert got.next_offset == 15
    # A partial batch at the end (the fetch's byte limit) is left for the next fetch.
    got = decode_fetch(data[:-3], "t", 0, 10, 30, include_headers=False)
    assert got.batch is not None
    assert got.batch.num_rows == 5
    assert got.next_offset == 15
    assert decode_fetch(b"", "t", 0, 10, 30, include_headers=False) == (None, 10)


def test_log_append_time() -> None:
    b = BatchBuilder(timestamp_type=TimestampType.LOG_APPEND_TIME)
    b.append(b"a", timestamp_ms=T0)
    b.append(b"b", timestamp_ms=T0 + 9)
    got = decode_fetch(stored(0, b) + batch(2, 1), "t", 0, 0, 3, include_headers=False)
    assert got.batch is not None
    assert got.batch.column("timestampType").to_pylist() == [1, 1, 0]
    stamps = [int(t.timestamp() * 1000) for t in got.batch.column("timestamp").to_pylist()]
    assert stamps == [T0 + 9, T0 + 9, T0 + 2]


def test_malformed_records_are_named() -> None:
    good = bytearray(batch(0, 3))
    # A record's value length that runs past the record, with a CRC that checks out.
    from tidewire.records import crc32c
    from tidewire.records.batch import CRC_OFFSET

    value_at = good.index(b"v1") - 1
    good[value_at] = 0x7E  # 63 bytes
    good[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(bytes(good[CRC_OFFSET + 4 :])).to_bytes(4, "big")
    for headers in (False, True):
        with pytest.raises(RecordBatchError):
            decode_fetch(bytes(good), "t", 0, 0, 3, include_headers=headers)
    corrupt = bytearray(batch(0, 3))
    corrupt[-1] ^= 0xFF
    with pytest.raises(RecordBatchError, match="CRC"):
        decode_fetch(bytes(corrupt), "t", 0, 0, 3, include_headers=False)
