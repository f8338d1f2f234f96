"""Fetched batches to Arrow, without Spark: every field, ranges cut inside batches, every
codec, log-append time, and malformed input named by the reference decoder."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.errors import RecordBatchError
from tidewire.records import BatchBuilder, Codec, TimestampType, iter_batches, iter_records
from tidewire.spark import arrow_schema
from tidewire.spark._decode import Decoded, decode_fetch
from tidewire.spark._vectorized import fast_rows

T0 = 1_700_000_000_000


def stored(base: int, builder: BatchBuilder) -> bytes:
    """A built batch with the base offset the broker would write into it."""
    raw = bytearray(builder.build())
    raw[0:8] = base.to_bytes(8, "big")
    return bytes(raw)


def table(got: Decoded) -> pa.Table:
    return pa.Table.from_batches(got.batches, schema=got.batches[0].schema)


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
    assert all(b.schema.equals(arrow_schema(headers)) for b in got.batches)
    rows = table(got).to_pylist()
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
    assert decode_fetch(data, "t", 0, 20, 30, include_headers=False) == ([], 20)
    # A batch at or past the end stops the walk.
    got = decode_fetch(data, "t", 0, 10, 15, include_headers=False)
    assert table(got).column("offset").to_pylist() == [10, 11, 12, 13, 14]
    assert got.next_offset == 15
    # A partial batch at the end (the fetch's byte limit) is left for the next fetch.
    got = decode_fetch(data[:-3], "t", 0, 10, 30, include_headers=False)
    assert table(got).num_rows == 5
    assert got.next_offset == 15
    assert decode_fetch(b"", "t", 0, 10, 30, include_headers=False) == ([], 10)


def test_log_append_time() -> None:
    b = BatchBuilder(timestamp_type=TimestampType.LOG_APPEND_TIME)
    b.append(b"a", timestamp_ms=T0)
    b.append(b"b", timestamp_ms=T0 + 9)
    got = table(decode_fetch(stored(0, b) + batch(2, 1), "t", 0, 0, 3, include_headers=False))
    assert got.column("timestampType").to_pylist() == [1, 1, 0]
    stamps = [int(t.timestamp() * 1000) for t in got.column("timestamp").to_pylist()]
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


#: Keys and values: null, empty, inline in an Arrow view (up to 12 bytes), or longer.
payloads = st.one_of(st.none(), st.binary(max_size=14), st.binary(min_size=100, max_size=300))
records = st.lists(
    st.tuples(payloads, payloads, st.integers(min_value=-(2**40), max_value=2**40)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(records, min_size=1, max_size=4),
    codec=st.sampled_from([Codec.NONE, Codec.LZ4]),
    cut=st.integers(min_value=0, max_value=200),
)
def test_the_same_rows_as_the_reference_decoder(
    batches: list[list[tuple[bytes | None, bytes | None, int]]], codec: Codec, cut: int
) -> None:
    """Random keys, values and timestamps (deltas of any size, negative too): the vectorized
    path, or the record loop where it declines, gives what iter_records reads."""
    data, base = b"", 0
    for recs in batches:
        b = BatchBuilder(codec=codec)
        for key, value, ts in recs:
            b.append(value, key=key, timestamp_ms=T0 + ts)
        data += stored(base, b)
        base += len(recs)
    want = []
    for pos, h in iter_batches(data):
        for r in iter_records(data[pos : pos + h.size]):
            want.append((r.offset, r.key, r.value, r.timestamp))
    start = min(cut, base - 1)
    got = decode_fetch(data, "t", 3, start, base, include_headers=False)
    rows = [
        (r["offset"], r["key"], r["value"], round(r["timestamp"].timestamp() * 1000))
        for r in table(got).to_pylist()
    ]
    assert rows == want[start:]


def test_the_common_shape_takes_the_vectorized_path() -> None:
    plain = BatchBuilder(codec=Codec.ZSTD)
    for i in range(50):
        plain.append(b"value %d" % i, key=b"k" if i % 2 else None, timestamp_ms=T0 + i)
    data = stored(0, plain) + stored(50, plain)
    batches = list(iter_batches(data))
    assert fast_rows(data, batches, "t", 0) is not None
    # Headers, or log-append time: the record loop's.
    assert fast_rows(batch(0, 4), list(iter_batches(batch(0, 4))), "t", 0) is None
    appended = BatchBuilder(timestamp_type=TimestampType.LOG_APPEND_TIME)
    appended.append(b"x", timestamp_ms=T0)
    data = stored(0, appended)
    assert fast_rows(data, list(iter_batches(data)), "t", 0) is None
