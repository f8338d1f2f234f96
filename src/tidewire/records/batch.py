"""The record batch: Kafka's RecordBatch v2 layout, header parsing and checking (pure, no I/O).

One batch, on the wire and on disk (big-endian)::

    offset  size  field
         0     8  base_offset            first offset of the batch; written by the broker
         8     4  batch_length           bytes after this field (whole batch size - 12)
        12     4  partition_leader_epoch
        16     1  magic                  always 2
        17     4  crc                    CRC-32C of bytes 21..end (attributes to the last record)
        21     2  attributes             bits 0-2 codec, bit 3 timestamp type, 4 txn, 5 control
        23     4  last_offset_delta      offset of the last record minus base_offset
        27     8  first_timestamp        ms since the epoch
        35     8  max_timestamp          ms since the epoch
        43     8  producer_id            -1 when not idempotent
        51     2  producer_epoch
        53     4  base_sequence          -1 when not idempotent
        57     4  records_count
        61     …  records                compressed as one block when the codec is not none

The base offset and the batch length sit outside the CRC so the broker can assign offsets by
writing 8 bytes, without re-encoding or re-checksumming the batch. :func:`check_batch` is the
cheap check of the broker's hot path (header, sizes, CRC; no per-record work); the full
record-level validation is :func:`tidewire.records.reader.decode_batch`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c as _crc32c

from tidewire.errors import (
    BatchLengthError,
    CorruptBatchError,
    InvalidMagicError,
    RecordCountError,
)
from tidewire.records.compression import SUPPORTED, Codec, check_codec

__all__ = [
    "BATCH_OVERHEAD",
    "CRC_OFFSET",
    "HEADER",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAX_BATCH_BYTES",
    "BatchHeader",
    "TimestampType",
    "check_batch",
    "check_whole_batch",
    "crc32c",
    "parse_header",
    "peek_base_offset",
    "peek_batch_size",
    "seal_batch",
    "seal_batch_in_place",
]

#: The whole batch header as one struct, a format character per field (see module docstring).
HEADER = struct.Struct(
    ">"
    "q"  # base_offset
    "i"  # batch_length
    "i"  # partition_leader_epoch
    "b"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # last_offset_delta
    "q"  # first_timestamp
    "q"  # max_timestamp
    "q"  # producer_id
    "h"  # producer_epoch
    "i"  # base_sequence
    "i"  # records_count
)
#: Size of the batch header (61 bytes).
BATCH_OVERHEAD = HEADER.size
#: Bytes before ``batch_length`` counts: base_offset + batch_length.
LOG_OVERHEAD = struct.calcsize(">qi")
#: Offset of the magic byte.
MAGIC_OFFSET = struct.calcsize(">qii")
#: Offset of the CRC field.
CRC_OFFSET = MAGIC_OFFSET + 1
#: Offset of the attributes: where the CRC-covered region starts.
ATTRIBUTES_OFFSET = CRC_OFFSET + 4
#: The only batch format version tidewire reads and writes.
MAGIC = 2
#: Upper bound of one batch's size, whatever the configuration says: 256 MiB keeps a single
#: length field from asking a reader to buffer an unbounded amount before it can check the CRC.
MAX_BATCH_BYTES = 256 * 1024 * 1024

_BASE_AND_LENGTH = struct.Struct(">qi")
#: The header fields :func:`check_whole_batch` looks at; pad bytes skip the rest (same layout
#: as :data:`HEADER`).
_CHECKED_FIELDS = struct.Struct(
    ">"
    "8x"  # base_offset
    "i"  # batch_length
    "4x"  # partition_leader_epoch
    "b"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # last_offset_delta
    "8x"  # first_timestamp
    "q"  # max_timestamp
    "8x"  # producer_id
    "2x"  # producer_epoch
    "4x"  # base_sequence
    "i"  # records_count
)
_CODEC_MASK = 0x07
_SUPPORTED_CODEC_IDS = frozenset(int(c) for c in SUPPORTED)
_TIMESTAMP_TYPE_BIT = 0x08


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of ``data``, hardware-accelerated where the CPU allows."""
    return int(_crc32c.crc32c(data))


def _pack_header(  # noqa: PLR0917 (one caller shape: seal_batch and seal_batch_in_place)
    records_bytes: int,
    codec: int,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    timestamp_type: int,
    base_offset: int,
    partition_leader_epoch: int,
) -> bytes:
    """The header of a batch whose records section has ``records_bytes``, its CRC zero."""
    return HEADER.pack(
        base_offset,
        BATCH_OVERHEAD + records_bytes - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,  # crc, computed by the caller over what follows it
        int(codec) | (_TIMESTAMP_TYPE_BIT if timestamp_type else 0),
        max(count - 1, 0),
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )


def seal_batch(
    section: bytes,
    *,
    codec: int,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_type: int = 0,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A whole batch: the header over ``section`` (the records, already compressed with
    ``codec``), its CRC-32C, and the section, with one copy of the section. The length and
    the last offset delta are derived from the section's size and ``count``."""
    header = _pack_header(
        len(section),
        codec,
        count,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        timestamp_type,
        base_offset,
        partition_leader_epoch,
    )
    crc = _crc32c.crc32c(section, _crc32c.crc32c(header[ATTRIBUTES_OFFSET:]))
    return b"".join(
        (header[:CRC_OFFSET], crc.to_bytes(4, "big"), header[ATTRIBUTES_OFFSET:], section)
    )


def seal_batch_in_place(
    buf: bytearray,
    *,
    codec: int,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytearray:
    """:func:`seal_batch` for a section already in ``buf[BATCH_OVERHEAD:]`` (the first
    ``BATCH_OVERHEAD`` bytes are room for the header): the header and its CRC-32C are
    written there, the section is not copied. Returns ``buf``, then a whole batch, the same
    bytes as :func:`seal_batch` gives for that section.

    Raises:
        ValueError: ``buf`` is shorter than a header.
    """
    if len(buf) < BATCH_OVERHEAD:
        raise ValueError(f"a batch of {len(buf)} bytes has no room for its 61-byte header")
    buf[:BATCH_OVERHEAD] = _pack_header(
        len(buf) - BATCH_OVERHEAD,
        codec,
        count,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        0,
        0,
        -1,
    )
    with memoryview(buf) as view:
        crc = _crc32c.crc32c(view[ATTRIBUTES_OFFSET:])
    buf[CRC_OFFSET:ATTRIBUTES_OFFSET] = crc.to_bytes(4, "big")
    return buf


class TimestampType:
    """Values of attribute bit 3."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """The decoded 61-byte header of a record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Whole batch size in bytes, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        """Offset of the batch's last record."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """The offset after this batch."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> Codec:
        """Compression codec (raises ``UnsupportedCompressionError`` for unknown ids)."""
        return check_codec(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> int:
        """``TimestampType.CREATE_TIME`` or ``TimestampType.LOG_APPEND_TIME``."""
        return 1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0


def peek_batch_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Return the whole size of the batch starting at ``pos``, or ``None`` if fewer than 12
    bytes are there. The size is not checked: see :func:`parse_header`."""
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    return int(_BASE_AND_LENGTH.unpack_from(buf, pos)[1]) + LOG_OVERHEAD


def peek_base_offset(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """Return the base offset field of the batch at ``pos`` (``buf`` holds >= 8 bytes there)."""
    return int(_BASE_AND_LENGTH.unpack_from(buf, pos)[0])


def parse_header(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, max_batch_bytes: int = MAX_BATCH_BYTES
) -> BatchHeader:
    """Parse and sanity-check the header of the batch at ``pos``, without checking the CRC.

    Raises:
        BatchLengthError: fewer than 61 bytes, a batch_length below the header's own size or
            above ``max_batch_bytes``.
        InvalidMagicError: the magic byte is not 2.
        RecordCountError: a negative record count, or a count that cannot fit in the batch.
        UnsupportedCompressionError: an unknown codec id in the attributes.
    """
    if len(buf) - pos < BATCH_OVERHEAD:
        raise BatchLengthError(
            f"batch header needs {BATCH_OVERHEAD} bytes, {len(buf) - pos} available"
        )
    h = BatchHeader._make(HEADER.unpack_from(buf, pos))
    if h.magic != MAGIC:
        raise InvalidMagicError(f"magic byte is {h.magic}, expected {MAGIC}")
    size = h.batch_length + LOG_OVERHEAD
    if size < BATCH_OVERHEAD:
        raise BatchLengthError(
            f"batch_length {h.batch_length} is below the header size {BATCH_OVERHEAD - 12}"
        )
    if size > max_batch_bytes:
        raise BatchLengthError(
            f"batch of {size:,} bytes exceeds the limit of {max_batch_bytes:,} bytes"
        )
    if h.records_count < 0:
        raise RecordCountError(f"negative record count {h.records_count}")
    if h.last_offset_delta < 0:
        raise RecordCountError(f"negative last_offset_delta {h.last_offset_delta}")
    codec_id = h.attributes & _CODEC_MASK
    if codec_id not in _SUPPORTED_CODEC_IDS:
        check_codec(codec_id)  # raises, naming the codec
    if codec_id == 0 and h.records_count > size - BATCH_OVERHEAD:
        # every uncompressed record takes at least 7 bytes; 1 is a safe floor
        raise RecordCountError(
            f"record count {h.records_count:,} cannot fit in {size - BATCH_OVERHEAD:,} bytes"
        )
    return h


def check_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> BatchHeader:
    """Check the batch at ``pos``: header (:func:`parse_header`), whole size present, CRC.

    This is the broker's per-batch check: a constant amount of Python work per batch plus a
    CRC-32C at memory speed. Records are not decoded.

    Raises:
        BatchLengthError: the buffer ends before the batch does.
        CorruptBatchError: the CRC-32C does not match.
        (and what :func:`parse_header` raises)
    """
    h = parse_header(buf, pos, max_batch_bytes=max_batch_bytes)
    end = pos + h.batch_length + LOG_OVERHEAD
    if len(buf) < end:
        raise BatchLengthError(
            f"batch of {end - pos:,} bytes is truncated: {len(buf) - pos:,} bytes available"
        )
    view = memoryview(buf)[pos + ATTRIBUTES_OFFSET : end]
    actual = crc32c(view)
    if actual != h.crc:
        raise CorruptBatchError(
            f"CRC-32C mismatch in batch at base offset {h.base_offset}: "
            f"stored {h.crc:#010x}, computed {actual:#010x}"
        )
    return h


def check_whole_batch(
    buf: memoryview, max_batch_bytes: int = MAX_BATCH_BYTES
) -> tuple[int, int, int, int] | None:
    """:func:`check_batch` for a buffer that should hold exactly one batch, without building a
    :class:`BatchHeader`: the fast path of an append, which needs only a few fields.

    It accepts exactly the buffers that ``check_batch(buf, max_batch_bytes=...)`` accepts and
    whose batch fills ``buf`` to its last byte; it returns ``None`` for everything else, raising
    nothing: call :func:`check_batch` then, to learn what is wrong (it names the fault).

    Returns:
        ``(batch_length, last_offset_delta, max_timestamp, records_count)``, or ``None``.
    """
    size = len(buf)
    if size < BATCH_OVERHEAD or size > max_batch_bytes:
        return None
    length, magic, crc, attributes, last_delta, max_ts, count = _CHECKED_FIELDS.unpack_from(buf)
    if (
        length + LOG_OVERHEAD != size
        or magic != MAGIC
        or count < 0
        or last_delta < 0
        or (attributes & _CODEC_MASK) not in _SUPPORTED_CODEC_IDS
        or (attributes & _CODEC_MASK == 0 and count > size - BATCH_OVERHEAD)
        or _crc32c.crc32c(buf[ATTRIBUTES_OFFSET:]) != crc
    ):
        return None
    return length, last_delta, max_ts, count
