"""``read_records``, ``read_columns`` and ``read_spans``, the consumers' fast readers, against
the reference ``iter_records``: on the mutation-fuzz corpus and its resealed mutants (valid
CRC, damaged records) they return exactly the same records or raise exactly the same error, in
place inside a larger buffer too."""

from __future__ import annotations

from array import array
from itertools import chain, pairwise
from typing import NamedTuple

import pytest

from tests.records.test_mutation_fuzz import RESEALED_MUTANTS, SEED, resealed_mutant
from tidewire.errors import RecordBatchError
from tidewire.records import (
    BatchBuilder,
    Codec,
    check_batch,
    iter_records,
    read_columns,
    read_records,
    read_spans,
)
from tidewire.records import reader as pure_reader
from tidewire.records._impl import binary_columns, int64_columns

LIMIT = 1 << 20


class Located(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def reference(batch: bytes, min_offset: int = 0) -> list[Located] | tuple[type, str]:
    try:
        return [
            Located("t", 3, *r)
            for r in iter_records(batch, decompression_limit=LIMIT)
            if r.offset >= min_offset
        ]
    except RecordBatchError as exc:
        return type(exc), str(exc)


def fast(batch: bytes, min_offset: int = 0, pad: bytes = b"") -> list[Located] | tuple[type, str]:
    buf = pad + batch + pad  # in place, with other bytes around it
    h = check_batch(buf, len(pad))
    try:
        return read_records(buf, len(pad), h, Located, "t", 3, min_offset, LIMIT)
    except RecordBatchError as exc:
        return type(exc), str(exc)


def columns(
    batch: bytes, min_offset: int = 0, pad: bytes = b"", max_offset: int = 2**63 - 1
) -> list[Located] | tuple[type, str]:
    """``read_columns`` turned back into rows, to compare with the reference."""
    buf = pad + batch + pad
    h = check_batch(buf, len(pad))
    try:
        cols = read_columns(buf, len(pad), h, min_offset, LIMIT, max_offset)
    except RecordBatchError as exc:
        return type(exc), str(exc)
    assert len({len(c) for c in cols}) == 1, [len(c) for c in cols]
    return [Located("t", 3, *row) for row in zip(*cols, strict=True)]


def from_binary_column(
    validity: bytes | None, offsets: bytes, data: bytes, nulls: int
) -> list[bytes | None]:
    """The keys or values a ``Spans.binary_column`` (Arrow's binary layout) holds."""
    ends = array("i", offsets).tolist()
    out = [
        None if validity is not None and not validity[i >> 3] >> (i & 7) & 1 else data[a:b]
        for i, (a, b) in enumerate(pairwise(ends))
    ]
    assert out.count(None) == nulls
    assert (validity is None) == (nulls == 0)
    return out


def spans(
    batch: bytes, min_offset: int = 0, pad: bytes = b"", max_offset: int = 2**63 - 1
) -> list[Located] | tuple[type, str]:
    """``read_spans`` with its columns made (one by one, and all at once: the same), turned
    back into rows; its length and last offset checked against them."""
    buf = bytearray(pad + batch + pad)  # a fetched frame's buffer is a bytearray
    h = check_batch(buf, len(pad))
    try:
        got = read_spans(buf, len(pad), h, min_offset, LIMIT, max_offset)
    except RecordBatchError as exc:
        return type(exc), str(exc)
    cols = got.columns()
    assert [got.column(i) for i in range(5)] == list(cols)
    assert len(got) == len(cols[0])
    assert got.last_offset == (cols[0][-1] if cols[0] else -1)
    for value in (*cols[2], *cols[3]):
        assert value is None or type(value) is bytes
    for i in (0, 1):
        assert array("q", got.int64_column(i)).tolist() == cols[i]
    for i in (2, 3):
        assert from_binary_column(*got.binary_column(i)) == cols[i]
    return [Located("t", 3, *row) for row in zip(*cols, strict=True)]


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_same_records_as_the_reference(codec: Codec) -> None:
    b = BatchBuilder(codec=codec, base_offset=100)
    for i in range(300):
        b.append(
            None if i % 7 == 0 else bytes([i % 256]) * (i * 13 % 3000),
            key=None if i % 3 else b"k%d" % i,
            headers=[("h", b"v"), ("n", None)] if i % 5 == 0 else None,
            timestamp_ms=1_700_000_000_000 + (i * 997 if i % 11 else -i),
        )
    batch = b.build()
    for min_offset in (0, 100, 150, 399, 400):
        expected = reference(batch, min_offset)
        assert fast(batch, min_offset) == expected
        assert fast(batch, min_offset, pad=b"\x00" * 7) == expected
        assert columns(batch, min_offset) == expected
        assert columns(batch, min_offset, pad=b"\x00" * 7) == expected
        assert spans(batch, min_offset) == expected
        assert spans(batch, min_offset, pad=b"\x00" * 7) == expected


def test_resealed_mutants_give_what_the_reference_gives() -> None:
    accepted = refused = 0
    for index in range(RESEALED_MUTANTS):
        _, _, mut = resealed_mutant(index)
        try:
            check_batch(mut)
        except RecordBatchError:
            continue  # read_records takes batches whose header was checked
        where = f"seed={SEED} resealed index={index}"
        expected = reference(bytes(mut))
        assert fast(bytes(mut)) == expected, where
        assert fast(bytes(mut), pad=b"\x01\x80" * 40) == expected, where
        assert columns(bytes(mut)) == expected, where
        assert columns(bytes(mut), pad=b"\x01\x80" * 40) == expected, where
        assert spans(bytes(mut), pad=b"\x01\x80" * 40) == expected, where
        if isinstance(expected, list):
            accepted += 1
        else:
            refused += 1
    assert accepted
    assert refused


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_a_window_of_offsets(codec: Codec) -> None:
    """With ``max_offset`` the reading stops after it: exactly the reference's records
    from ``min_offset`` to ``max_offset``."""
    b = BatchBuilder(codec=codec, base_offset=100)
    for i in range(200):
        b.append(b"v%d" % i, key=b"k", timestamp_ms=1_700_000_000_000 + i)
    batch = b.build()
    h = check_batch(batch)
    for lo, hi in ((0, 99), (100, 100), (150, 160), (250, 299), (299, 10**6), (120, 110)):
        got = read_records(batch, 0, h, Located, "t", 3, lo, LIMIT, max_offset=hi)
        expected = reference(batch, lo)
        assert isinstance(expected, list)
        assert got == [r for r in expected if r.offset <= hi]
        assert columns(batch, lo, max_offset=hi) == got
        assert spans(batch, lo, max_offset=hi) == got


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_a_bytearray_buffer_gives_the_same_records_keys_and_values_as_bytes(codec: Codec) -> None:
    """Consumers read fetch answers received in place (a ``bytearray`` of the frame's own):
    the records are the same, and keys, values and header values are ``bytes``."""
    b = BatchBuilder(base_offset=40, codec=codec)
    for i in range(20):
        key = b"k%d" % i if i % 2 else None
        b.append(b"v" * i, timestamp_ms=1_000 + i, key=key, headers=[("h", b"x%d" % i)])
    batch = b.build()
    pad = b"\x81" * 7
    buf = bytearray(pad + batch + pad)
    h = check_batch(buf, len(pad))
    rows = read_records(buf, len(pad), h, Located, "t", 3, 45, LIMIT)
    assert rows == fast(batch, 45, pad)
    cols = read_columns(buf, len(pad), h, 45, LIMIT)
    assert [Located("t", 3, *r) for r in zip(*cols, strict=True)] == rows
    for r in rows:
        assert r.key is None or type(r.key) is bytes
        assert type(r.value) is bytes
        assert all(type(v) is bytes for _, v in r.headers)


def test_spans_outlive_the_name_of_their_buffer() -> None:
    """A batch's spans keep its data: the columns are made after the buffer's last other
    reference is gone, and a column asked for twice is two equal, separate lists."""
    b = BatchBuilder(base_offset=7)
    for i in range(50):
        b.append(b"v%d" % i * 30, key=b"k%d" % i if i % 2 else None, timestamp_ms=5_000 + i // 10)
    batch = b.build()
    buf = bytearray(b"\x00" * 3 + batch)
    got = read_spans(buf, 3, check_batch(buf, 3), 10, LIMIT)
    del buf
    expected = reference(batch, 10)
    assert isinstance(expected, list)
    assert [r.value for r in expected] == got.column(3)
    first = got.column(0)
    assert first == got.column(0) == list(range(10, 57))
    assert first is not got.column(0)
    assert got.last_offset == 56
    with pytest.raises(IndexError):
        got.column(5)
    with pytest.raises(IndexError):
        got.int64_column(2)
    with pytest.raises(IndexError):
        got.binary_column(1)


def test_columns_of_several_spans_are_theirs_one_after_the_other() -> None:
    """``int64_columns`` and ``binary_columns`` of several spans (a consumed segment's
    batches, for Arrow) are each spans' column concatenated, nulls and empty values
    included, whichever reader made the spans (the pure one's mixed in: the compiled twin
    takes them through the pure function)."""
    made = []
    for n in range(3):
        b = BatchBuilder(base_offset=100 * n)
        for i in range(11 + n):
            b.append(
                None if (i + n) % 4 == 1 else b"v%d" % i * (i % 3),
                key=None if i % 3 == 0 else b"k%d-%d" % (n, i),
                timestamp_ms=9_000 + n * 10 + i,
            )
        batch = b.build()
        made.append(read_spans(batch, 0, check_batch(batch), 100 * n + n, LIMIT))
    third = made[-1].column(0)  # its window: from offset 202
    last = BatchBuilder(base_offset=500)
    last.append(b"tail", key=None, timestamp_ms=1)
    tail = last.build()
    made.append(pure_reader.read_spans(tail, 0, check_batch(tail)))
    for spans in (made, made[:1], made[:3], []):
        expected = [list(chain.from_iterable(s.column(i) for s in spans)) for i in range(4)]
        for i in (0, 1):
            assert array("q", int64_columns(spans, i)).tolist() == expected[i]
        for i in (2, 3):
            assert from_binary_column(*binary_columns(spans, i)) == expected[i]
    assert third == list(range(202, 213))
    with pytest.raises(IndexError):
        int64_columns(made, 3)
    with pytest.raises(IndexError):
        binary_columns(made, 0)
