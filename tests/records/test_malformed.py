"""One hand-crafted malformed batch per fault: each is refused with the error class that names
it. Edited batches are re-sealed (length and CRC fixed) unless the CRC is what is tested."""

from __future__ import annotations

import gzip
import struct
from typing import Any

import aiokafka.codec
import lz4.frame
import pytest
import zstandard

from tests.records._batches import (
    COMPRESSED_CODECS,
    BatchSpec,
    RecordSpec,
    build,
    header_of,
    patch_header,
    raw_batch,
    raw_record,
    reseal,
    with_section,
)
from tidewire.errors import (
    BatchLengthError,
    CorruptBatchError,
    DecompressionLimitError,
    InvalidMagicError,
    InvalidRecordError,
    RecordBatchError,
    RecordCountError,
    UnsupportedCompressionError,
    VarintError,
)
from tidewire.records import (
    BATCH_OVERHEAD,
    MAX_BATCH_BYTES,
    BatchDecoder,
    Codec,
    check_batch,
    decode_batch,
    iter_records,
    parse_header,
)
from tidewire.records.compression import compress, decompress


def batch_of(n: int = 3, codec: Codec = Codec.NONE, value_size: int = 10) -> bytes:
    records = tuple(
        RecordSpec(1_700_000_000_000 + i, b"key-%d" % i, bytes([65 + i]) * value_size, ())
        for i in range(n)
    )
    return build(BatchSpec(records=records, codec=codec))


def section_of(batch: bytes) -> bytes:
    return batch[BATCH_OVERHEAD:]


def uncompressed_section(batch: bytes) -> bytes:
    return bytes(decompress(header_of(batch).codec, section_of(batch)))


# --- header -------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [0, 1, 3, -1, 127, -128])
def test_bad_magic(magic: int) -> None:
    batch = patch_header(batch_of(), magic=magic)  # the magic byte lies outside the CRC
    for decode in (parse_header, check_batch, decode_batch):
        with pytest.raises(InvalidMagicError, match=f"magic byte is {magic}"):
            decode(batch)
    d = BatchDecoder()
    d.receive_data(batch)
    with pytest.raises(InvalidMagicError):
        d.next_batch()


@pytest.mark.parametrize("codec", [Codec.NONE, *COMPRESSED_CODECS])
def test_crc_mismatch_in_the_records(codec: Codec) -> None:
    batch = bytearray(batch_of(codec=codec))
    stored = header_of(batch).crc
    batch[-1] ^= 0x40
    with pytest.raises(CorruptBatchError, match=f"stored {stored:#010x}"):
        decode_batch(bytes(batch))
    assert parse_header(bytes(batch)).crc == stored  # the header alone does not check it


@pytest.mark.parametrize(
    "field", ["attributes", "last_offset_delta", "first_timestamp", "producer_id"]
)
def test_crc_covers_the_header_fields_after_it(field: str) -> None:
    batch = batch_of()
    value = getattr(header_of(batch), field) + 8  # +8 keeps the codec bits of attributes
    with pytest.raises(CorruptBatchError):
        decode_batch(patch_header(batch, **{field: value}))


def test_crc_field_itself_damaged() -> None:
    batch = batch_of()
    with pytest.raises(CorruptBatchError):
        decode_batch(patch_header(batch, crc=header_of(batch).crc ^ 1))


@pytest.mark.parametrize("batch_length", [-(2**31), -1, 0, 1, BATCH_OVERHEAD - 13])
def test_batch_length_below_the_header(batch_length: int) -> None:
    batch = patch_header(batch_of(), batch_length=batch_length)
    with pytest.raises(BatchLengthError, match="below the header size"):
        decode_batch(batch)


@pytest.mark.parametrize("extra", [1, 1_000, 2**31 - 1 - 200])
def test_batch_length_beyond_the_buffer(extra: int) -> None:
    batch = batch_of()
    longer = patch_header(batch, batch_length=len(batch) - 12 + extra)
    with pytest.raises(BatchLengthError):
        decode_batch(longer)


def test_batch_length_above_the_limit() -> None:
    batch = batch_of()
    with pytest.raises(BatchLengthError, match="exceeds the limit"):
        check_batch(batch, max_batch_bytes=len(batch) - 1)
    huge = patch_header(batch, batch_length=MAX_BATCH_BYTES)
    with pytest.raises(BatchLengthError, match=f"{MAX_BATCH_BYTES:,}"):
        decode_batch(huge)


@pytest.mark.parametrize("cut", [0, 11, 12, BATCH_OVERHEAD - 1])
def test_buffer_shorter_than_a_header(cut: int) -> None:
    with pytest.raises(BatchLengthError, match=f"needs {BATCH_OVERHEAD} bytes"):
        decode_batch(batch_of()[:cut])


def test_bytes_after_the_batch_in_the_buffer() -> None:
    batch = batch_of()
    with pytest.raises(BatchLengthError, match="buffer holds"):
        decode_batch(batch + b"\x00")
    assert check_batch(batch + b"\x00") == header_of(batch)  # the cheap check reads one batch


# --- record count -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Codec.NONE, *COMPRESSED_CODECS])
def test_records_count_above_the_records_present(codec: Codec) -> None:
    batch = batch_of(3, codec)
    bad = reseal(patch_header(batch, records_count=4))
    with pytest.raises(RecordCountError, match="declares 4 records but holds 3"):
        decode_batch(bad)


@pytest.mark.parametrize("codec", [Codec.NONE, *COMPRESSED_CODECS])
def test_records_count_below_the_records_present(codec: Codec) -> None:
    batch = batch_of(3, codec)
    bad = reseal(patch_header(batch, records_count=2))
    with pytest.raises(RecordCountError, match="bytes follow the 2 records"):
        decode_batch(bad)


@pytest.mark.parametrize("codec", [Codec.NONE, *COMPRESSED_CODECS])
def test_trailing_bytes_after_the_declared_records(codec: Codec) -> None:
    batch = batch_of(3, codec)
    section = compress(codec, uncompressed_section(batch) + b"\x00\x00")
    with pytest.raises(RecordCountError, match="2 bytes follow the 3 records"):
        decode_batch(with_section(batch, section))


@pytest.mark.parametrize("count", [-1, -(2**31)])
def test_negative_records_count(count: int) -> None:
    with pytest.raises(RecordCountError, match="negative record count"):
        decode_batch(reseal(patch_header(batch_of(), records_count=count)))


def test_uncompressed_count_that_cannot_fit() -> None:
    batch = batch_of(3)
    bad = reseal(patch_header(batch, records_count=len(batch)))
    with pytest.raises(RecordCountError, match="cannot fit"):
        parse_header(bad)


def test_negative_last_offset_delta() -> None:
    with pytest.raises(RecordCountError, match="negative last_offset_delta"):
        decode_batch(reseal(patch_header(batch_of(), last_offset_delta=-1)))


# --- varints inside records ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "length_prefix",
    [
        b"\xff\xff\xff\xff\x7f",  # overflows int32
        b"\x80\x80\x80\x80\x10",  # zigzag 2**32: one past int32
        b"\x8c\x80\x80\x80\x80\x00",  # 6 bytes: longer than an int32 may be
    ],
)
def test_record_length_varint_overflow(length_prefix: bytes) -> None:
    batch = raw_batch([raw_record(length_prefix=length_prefix)])
    with pytest.raises(VarintError):
        decode_batch(batch)


def test_timestamp_delta_varint_longer_than_64_bits() -> None:
    # attributes, then an 11-byte varint where the 64-bit timestamp delta goes
    body = b"\x00" + b"\x80" * 10 + b"\x00" + b"\x00\x00\x02v\x00"
    record = bytes([len(body) * 2]) + body  # zigzag length, one byte (len < 64)
    with pytest.raises(VarintError, match="longer than 10 bytes"):
        decode_batch(raw_batch([record]))


def test_section_ends_inside_a_varint() -> None:
    with pytest.raises(BatchLengthError, match="ends inside a varint"):
        decode_batch(raw_batch([b"\x80"]))


# --- compression --------------------------------------------------------------------------------


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unsupported_codec(codec_id: int) -> None:
    batch = reseal(patch_header(batch_of(), attributes=codec_id))
    name = f"id {codec_id}"
    for decode in (parse_header, decode_batch):
        with pytest.raises(UnsupportedCompressionError, match=name):
            decode(batch)


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_decompression_bomb(codec: Codec) -> None:
    batch = batch_of(4, codec, value_size=256 * 1024)  # 1 MiB of runs of one byte
    inflated = len(uncompressed_section(batch))
    # a real bomb: tiny on the wire (snappy's format caps its ratio near 21:1)
    assert len(batch) * (15 if codec is Codec.SNAPPY else 50) < inflated
    limit = 64 * 1024
    with pytest.raises(DecompressionLimitError, match=f"{limit:,} bytes"):
        decode_batch(batch, decompression_limit=limit)
    with pytest.raises(DecompressionLimitError):
        iter_records(batch, decompression_limit=limit)
    # the limit is inclusive: exactly the inflated size passes, one byte less does not
    assert len(decode_batch(batch, decompression_limit=inflated)[1]) == 4
    with pytest.raises(DecompressionLimitError):
        decode_batch(batch, decompression_limit=inflated - 1)


def test_uncompressed_batches_ignore_the_decompression_limit() -> None:
    assert len(decode_batch(batch_of(3), decompression_limit=0)[1]) == 3


GARBAGE = b"this is not a compressed stream at all" * 3


def _foreign_stream(codec: Codec, data: bytes) -> bytes:
    """``data`` compressed by the codec's reference library, not by tidewire."""
    if codec is Codec.GZIP:
        return gzip.compress(data)
    if codec is Codec.LZ4:
        return bytes(lz4.frame.compress(data))
    if codec is Codec.SNAPPY:
        return aiokafka.codec.snappy_encode(data)  # kafka-python's xerial framing, on cramjam
    return bytes(zstandard.ZstdCompressor().compress(data))


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_foreign_compressor_output_is_read(codec: Codec) -> None:
    batch = batch_of(3, codec)
    section = _foreign_stream(codec, uncompressed_section(batch))
    assert decode_batch(with_section(batch, section))[1] == decode_batch(batch)[1]


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_garbage_compressed_stream(codec: Codec) -> None:
    with pytest.raises(InvalidRecordError, match=f"{codec.name.lower()}"):
        decode_batch(with_section(batch_of(3, codec), GARBAGE))


def _stream_damage(kind: str, section: bytes) -> bytes:
    if kind == "empty":
        return b""
    if kind == "half":
        return section[: len(section) // 2]
    if kind == "last byte missing":
        return section[:-1]
    assert kind == "trailing bytes"
    return section + b"\x00junk"


def _damage_params() -> list[object]:
    params: list[object] = []
    for codec in COMPRESSED_CODECS:
        for kind in ("empty", "half", "last byte missing", "trailing bytes"):
            params.append(pytest.param(codec, kind, id=f"{codec.name}-{kind}"))
    return params


@pytest.mark.parametrize(("codec", "kind"), _damage_params())
def test_damaged_compressed_stream_with_valid_crc(codec: Codec, kind: str) -> None:
    batch = batch_of(3, codec, value_size=3000)
    bad = with_section(batch, _stream_damage(kind, section_of(batch)))
    with pytest.raises(RecordBatchError) as info:
        decode_batch(bad)
    assert isinstance(info.value, InvalidRecordError), repr(info.value)
    assert codec.name.lower() in str(info.value)


@pytest.mark.parametrize(("codec", "kind"), _damage_params())
def test_decompress_refuses_a_damaged_stream(codec: Codec, kind: str) -> None:
    section = compress(codec, bytes(range(256)) * 600)  # > 128 KiB: zstd writes 2 blocks
    with pytest.raises(RecordBatchError) as info:
        decompress(codec, _stream_damage(kind, section))
    assert isinstance(info.value, InvalidRecordError), repr(info.value)


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_damaged_compressed_stream_is_still_a_record_batch_error(codec: Codec) -> None:
    # whatever the class, nothing but a RecordBatchError (or the intact records) comes out
    batch = batch_of(3, codec, value_size=3000)
    for kind in ("empty", "half", "last byte missing"):
        with pytest.raises(RecordBatchError):
            decode_batch(with_section(batch, _stream_damage(kind, section_of(batch))))


# --- records ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [b"\xff\xfe", b"caf\xc3", b"\xed\xa0\x80", b"\xc0\xaf"],
    ids=["invalid-start", "cut-multibyte", "surrogate", "overlong"],
)
def test_header_key_not_utf8(key: bytes) -> None:
    batch = raw_batch([raw_record(headers=[(b"ok", b"1"), (key, b"v")])])
    with pytest.raises(InvalidRecordError, match="not UTF-8"):
        decode_batch(batch)


def test_header_key_null() -> None:
    with pytest.raises(InvalidRecordError, match="null key"):
        decode_batch(raw_batch([raw_record(headers=[(None, b"v")])]))


def test_header_value_null_is_fine() -> None:
    _, records = decode_batch(raw_batch([raw_record(headers=[(b"h", None)])]))
    assert records[0].headers == (("h", None),)


@pytest.mark.parametrize(
    ("records", "fields", "message"),
    [
        pytest.param(
            [raw_record(length_prefix=b"\x0a") + bytes(5)], {}, "has length 5", id="length-below-6"
        ),
        pytest.param(
            [raw_record(length_prefix=b"\x7e")], {}, "has length 63", id="length-past-the-end"
        ),
        pytest.param(
            [raw_record(), raw_record(offset_delta=0)], {}, "offset delta 0", id="delta-repeats"
        ),
        pytest.param([raw_record(offset_delta=-1)], {}, "offset delta -1", id="delta-negative"),
        pytest.param(
            [raw_record(offset_delta=3)],
            {"last_offset_delta": 2},
            "at most last_offset_delta 2",
            id="delta-above-last",
        ),
        pytest.param(
            [raw_record(key=None, value=None, body_suffix=b"\x00\x00")],
            {},
            "its fields take",
            id="bytes-left-in-record",
        ),
        pytest.param(
            [raw_record(value=b"abc")[:-5] + b"\x7c" + raw_record(value=b"abc")[-4:]],
            {},
            "value of length 62",
            id="value-past-record",
        ),
        pytest.param(
            [raw_record(key=None, value=None)[:-3] + b"\x03\x01\x00"],
            {},
            "key of length -2",
            id="key-length-below-minus-1",
        ),
        pytest.param(
            [raw_record()[:-1] + b"\x01"], {}, "declares -1 headers", id="negative-header-count"
        ),
        pytest.param(
            [raw_record()[:-1] + b"\x28"], {}, "declares 20 headers", id="header-count-too-big"
        ),
    ],
)
def test_malformed_record(records: list[bytes], fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        decode_batch(raw_batch(records, **fields))


def test_gaps_in_offset_deltas_are_allowed() -> None:
    # as after compaction: deltas need only increase and stay within last_offset_delta
    batch = raw_batch([raw_record(offset_delta=0), raw_record(offset_delta=5)], last_offset_delta=9)
    h, records = decode_batch(batch)
    assert [r.offset for r in records] == [0, 5]
    assert h.next_offset == 10


def test_struct_layout_matches_the_documented_offsets() -> None:
    # the byte positions the fuzz tests rely on
    batch = batch_of(1)
    h = header_of(batch)
    assert struct.unpack_from(">b", batch, 16)[0] == h.magic == 2
    assert struct.unpack_from(">I", batch, 17)[0] == h.crc
    assert struct.unpack_from(">i", batch, 57)[0] == h.records_count == 1
