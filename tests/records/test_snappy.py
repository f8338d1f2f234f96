"""Snappy, the one codec with two framings in Kafka batches: raw snappy (librdkafka writes it)
and snappy-java's xerial framing (the Java client and kafka-python write it). tidewire reads
both, writes the xerial one, bounds the output by the decompression limit, and refuses a
malformed stream with :class:`InvalidRecordError`.
"""

from __future__ import annotations

import struct

import aiokafka.codec
import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.records._batches import with_section
from tidewire.errors import DecompressionLimitError, InvalidRecordError
from tidewire.records import BatchBuilder, Codec, decode_batch
from tidewire.records.batch import BATCH_OVERHEAD
from tidewire.records.compression import (
    XERIAL_BLOCK_BYTES,
    XERIAL_MAGIC,
    compress,
    decompress,
)

XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)


def raw(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def xerial(*blocks: bytes) -> bytes:
    """A xerial stream made by hand, one raw snappy block per argument."""
    return XERIAL_HEADER + b"".join(struct.pack(">i", len(b)) + b for b in blocks)


@settings(deadline=None, max_examples=50)
@given(st.binary(max_size=3 * XERIAL_BLOCK_BYTES + 7))
def test_round_trip(data: bytes) -> None:
    framed = compress(Codec.SNAPPY, data)
    assert framed.startswith(XERIAL_HEADER)
    assert decompress(Codec.SNAPPY, framed) == data
    assert decompress(Codec.SNAPPY, memoryview(framed)) == data


def test_blocks_are_32_kib_like_snappy_java() -> None:
    data = bytes(range(256)) * 520  # 133,120 bytes: 4 full blocks and a short one
    framed = compress(Codec.SNAPPY, data)
    sizes = []
    pos = len(XERIAL_HEADER)
    while pos < len(framed):
        (n,) = struct.unpack_from(">i", framed, pos)
        block = framed[pos + 4 : pos + 4 + n]
        sizes.append(cramjam.snappy.decompress_raw_len(block))
        pos += 4 + n
    assert sizes == [XERIAL_BLOCK_BYTES] * 4 + [len(data) - 4 * XERIAL_BLOCK_BYTES]


def test_other_clients_read_what_tidewire_writes() -> None:
    data = b"".join(b"key-%d=value-%d;" % (i, i * i) for i in range(5000))
    assert aiokafka.codec.snappy_decode(compress(Codec.SNAPPY, data)) == data


@pytest.mark.parametrize("xerial_compatible", [True, False], ids=["xerial", "raw"])
def test_tidewire_reads_what_other_clients_write(xerial_compatible: bool) -> None:
    data = b"".join(b"key-%d=value-%d;" % (i, i * i) for i in range(5000))
    foreign = aiokafka.codec.snappy_encode(data, xerial_compatible=xerial_compatible)
    foreign = bytes(foreign)
    assert foreign.startswith(XERIAL_MAGIC) is xerial_compatible
    assert decompress(Codec.SNAPPY, foreign) == data


def test_raw_snappy_in_a_batch_is_read() -> None:
    # librdkafka's form: the records section as one raw snappy block
    b = BatchBuilder(codec=Codec.SNAPPY)
    for i in range(3):
        b.append(b"value %d" % i, key=b"k%d" % i, timestamp_ms=1000 + i)
    batch = b.build()
    section = decompress(Codec.SNAPPY, batch[BATCH_OVERHEAD:])
    as_raw = with_section(batch, raw(bytes(section)))
    assert not as_raw[BATCH_OVERHEAD:].startswith(XERIAL_MAGIC)
    _, records = decode_batch(as_raw)
    assert [r.value for r in records] == [b"value 0", b"value 1", b"value 2"]
    assert records == decode_batch(batch)[1]


def test_empty_xerial_stream_is_empty() -> None:
    assert compress(Codec.SNAPPY, b"") == XERIAL_HEADER
    assert decompress(Codec.SNAPPY, XERIAL_HEADER) == b""


@pytest.mark.parametrize("form", ["raw", "xerial"])
def test_limit(form: str) -> None:
    data = b"\x00" * 100_000
    stream = raw(data) if form == "raw" else compress(Codec.SNAPPY, data)
    assert len(stream) * 15 < len(data)
    assert decompress(Codec.SNAPPY, stream, limit=len(data)) == data  # inclusive
    with pytest.raises(DecompressionLimitError, match="99,999 bytes"):
        decompress(Codec.SNAPPY, stream, limit=len(data) - 1)


def test_limit_is_checked_before_inflating() -> None:
    # a raw block that declares 2 GiB but holds nothing: refused by its declared length
    # (the varint preamble), without allocating it
    lying = bytes([0x80, 0x80, 0x80, 0x80, 0x08])  # varint 2**31
    with pytest.raises(DecompressionLimitError, match="1,024 bytes"):
        decompress(Codec.SNAPPY, lying, limit=1024)
    with pytest.raises(DecompressionLimitError, match="1,024 bytes"):
        decompress(Codec.SNAPPY, xerial(raw(b"a" * 1000), lying), limit=1024)


GARBAGE = b"this is not a compressed stream at all" * 3


@pytest.mark.parametrize(
    ("stream", "match"),
    [
        (GARBAGE, "snappy stream is malformed"),
        (b"", "snappy stream is malformed"),
        (raw(b"abc" * 1000)[:-1], "snappy stream is malformed"),
        (raw(b"abc" * 1000) + b"xx", "snappy stream is malformed"),
        (xerial(GARBAGE), "snappy stream is malformed"),
        (xerial(raw(b"ok")) + b"\x00\x00", "ends inside a block length at byte 24 of 26"),
        (XERIAL_HEADER + struct.pack(">i", 9) + b"abc", "block of 9 bytes at byte 20 overruns"),
        (XERIAL_HEADER + struct.pack(">i", -1), "block of -1 bytes"),
    ],
    ids=[
        "garbage",
        "empty",
        "raw-cut",
        "raw-trailing",
        "xerial-garbage-block",
        "xerial-cut-length",
        "xerial-cut-block",
        "xerial-negative-length",
    ],
)
def test_malformed_stream_is_a_clean_error(stream: bytes, match: str) -> None:
    with pytest.raises(InvalidRecordError, match=match):
        decompress(Codec.SNAPPY, stream)
