"""Zigzag varints: round trips, the length limits of each width, truncation and overflow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.records._batches import INT32, INT64
from tidewire.errors import BatchLengthError, RecordBatchError, VarintError
from tidewire.records import varint

int32s = st.integers(*INT32)
int64s = st.integers(*INT64)
EDGES = (0, -1, 1, -64, 63, -65, 64, *INT32, INT32[0] - 1, INT32[1] + 1, *INT64)


@given(int32s, st.binary(max_size=4), st.binary(max_size=4))
def test_int32_round_trip(value: int, before: bytes, after: bytes) -> None:
    enc = varint.encode(value)
    assert len(enc) <= varint.MAX_VARINT32_BYTES
    buf = before + enc + after
    assert varint.decode(buf, len(before)) == (value, len(before) + len(enc))
    assert varint.decode(memoryview(buf), len(before)) == (value, len(before) + len(enc))


@given(int64s, st.binary(max_size=4), st.binary(max_size=4))
def test_int64_round_trip(value: int, before: bytes, after: bytes) -> None:
    enc = varint.encode(value)
    assert len(enc) <= varint.MAX_VARINT64_BYTES
    buf = before + enc + after
    assert varint.decode(buf, len(before), wide=True) == (value, len(before) + len(enc))


@pytest.mark.parametrize("value", EDGES)
def test_edge_values_round_trip_as_int64(value: int) -> None:
    enc = varint.encode(value)
    assert varint.decode(enc, 0, wide=True) == (value, len(enc))
    assert varint.size(value) == len(enc)


def test_zigzag_puts_small_magnitudes_in_one_byte() -> None:
    assert [varint.encode(v) for v in (0, -1, 1, -2, 2, 63, -64)] == [
        b"\x00",
        b"\x01",
        b"\x02",
        b"\x03",
        b"\x04",
        b"\x7e",
        b"\x7f",
    ]
    assert varint.encode(64) == b"\x80\x01"
    assert varint.encode(-65) == b"\x81\x01"


@given(int64s)
def test_size_agrees_with_encode(value: int) -> None:
    assert varint.size(value) == len(varint.encode(value))


@pytest.mark.parametrize("value", [INT64[0] - 1, INT64[1] + 1, 2**100])
def test_encode_refuses_values_outside_int64(value: int) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        varint.encode(value)


# --- the longest encodings ----------------------------------------------------------------------


def test_padded_encodings_at_the_limit_are_accepted() -> None:
    # 5 bytes is the most an int32 may take, 10 an int64: a zero padded to that length is
    # still a valid (if wasteful) encoding, as in Kafka.
    assert varint.decode(b"\x80\x80\x80\x80\x00", 0) == (0, 5)
    assert varint.decode(b"\x80" * 9 + b"\x00", 0, wide=True) == (0, 10)


@pytest.mark.parametrize("after", [b"", b"\x00", b"\x80\x00"])
def test_overlong_int32_is_a_varint_error(after: bytes) -> None:
    # six bytes: five continuation bytes, then the terminator (or nothing at all: a sixth
    # byte is already too many, whatever follows)
    with pytest.raises(VarintError, match="longer than 5 bytes"):
        varint.decode(b"\x80" * 5 + after, 0)


@pytest.mark.parametrize("after", [b"", b"\x00", b"\x80\x00"])
def test_overlong_int64_is_a_varint_error(after: bytes) -> None:
    with pytest.raises(VarintError, match="longer than 10 bytes"):
        varint.decode(b"\x80" * 10 + after, 0, wide=True)


def test_an_int64_encoding_is_overlong_as_an_int32() -> None:
    with pytest.raises(VarintError):
        varint.decode(varint.encode(INT64[1]), 0)


# --- truncation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("wide", [False, True])
def test_empty_input_is_a_length_error(wide: bool) -> None:
    with pytest.raises(BatchLengthError):
        varint.decode(b"", 0, wide=wide)
    with pytest.raises(BatchLengthError):
        varint.decode(b"\x00\x01", 2, wide=wide)


@given(st.data())
def test_truncated_input_is_a_length_error(data: st.DataObject) -> None:
    wide = data.draw(st.booleans(), label="wide")
    value = data.draw(st.integers(*(INT64 if wide else INT32)).filter(lambda v: not -64 <= v < 64))
    enc = varint.encode(value)
    cut = data.draw(st.integers(1, len(enc) - 1), label="cut")
    with pytest.raises(BatchLengthError, match="ends inside a varint"):
        varint.decode(enc[:cut], 0, wide=wide)


# --- overflow -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding",
    [
        b"\x80\x80\x80\x80\x10",  # zigzag 2**32: decodes to 2**31
        b"\x81\x80\x80\x80\x10",  # decodes to -(2**31) - 1
        b"\xff\xff\xff\xff\x7f",  # 35 bits set
    ],
)
def test_int32_overflow_is_a_varint_error(encoding: bytes) -> None:
    with pytest.raises(VarintError, match="overflows 32 bits"):
        varint.decode(encoding, 0)
    # the same bytes are a fine int64
    assert varint.decode(encoding, 0, wide=True)[1] == 5


@pytest.mark.parametrize(
    "encoding",
    [
        b"\x80" * 9 + b"\x02",  # zigzag 2**64: decodes to 2**63
        b"\x81" + b"\x80" * 8 + b"\x02",  # decodes to -(2**63) - 1
        b"\xff" * 9 + b"\x7f",  # 70 bits set
    ],
)
def test_int64_overflow_is_a_varint_error(encoding: bytes) -> None:
    with pytest.raises(VarintError, match="overflows 64 bits"):
        varint.decode(encoding, 0, wide=True)


@pytest.mark.parametrize(
    ("value", "wide"), [(INT32[0], False), (INT32[1], False), *[(v, True) for v in INT64]]
)
def test_extremes_do_not_overflow(value: int, wide: bool) -> None:
    enc = varint.encode(value)
    assert len(enc) == (varint.MAX_VARINT64_BYTES if wide else varint.MAX_VARINT32_BYTES)
    assert varint.decode(enc, 0, wide=wide) == (value, len(enc))


@given(st.binary(max_size=12), st.booleans())
def test_arbitrary_bytes_decode_or_raise_a_batch_error(buf: bytes, wide: bool) -> None:
    try:
        value, end = varint.decode(buf, 0, wide=wide)
    except (VarintError, BatchLengthError):
        return
    except RecordBatchError as exc:  # pragma: no cover - a failure message, not a path
        pytest.fail(f"unexpected error class {type(exc).__name__} for {buf!r}")
    lo, hi = INT64 if wide else INT32
    assert lo <= value <= hi
    assert 1 <= end <= (varint.MAX_VARINT64_BYTES if wide else varint.MAX_VARINT32_BYTES)
    assert buf[end - 1] < 0x80
    assert all(b >= 0x80 for b in buf[: end - 1])
