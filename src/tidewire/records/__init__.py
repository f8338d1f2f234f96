"""The record batch format (Kafka RecordBatch v2): build, check, read. Pure: no I/O at all.

Public names::

    BatchBuilder, build_batch      build batches
    check_batch, parse_header      the broker's cheap per-batch check (header, sizes, CRC-32C)
    decode_batch, iter_records     full record-level validation and lazy reading
    read_records                   the same validation, fast, into a list (consumers)
    read_columns                   the same, into columns: offsets, timestamps, keys, ...
    iter_batches, BatchDecoder     walk concatenated batches; decode a byte stream incrementally
    Codec                          compression codecs (none, gzip, lz4, zstd)
"""

from __future__ import annotations

from tidewire.records.batch import (
    BATCH_OVERHEAD,
    LOG_OVERHEAD,
    MAX_BATCH_BYTES,
    BatchHeader,
    TimestampType,
    check_batch,
    crc32c,
    parse_header,
    peek_base_offset,
    peek_batch_size,
)
from tidewire.records.builder import BatchBuilder, Header, build_batch
from tidewire.records.compression import MAX_DECOMPRESSED_BYTES, Codec
from tidewire.records.reader import (
    BatchDecoder,
    Columns,
    Record,
    decode_batch,
    iter_batches,
    iter_records,
    read_columns,
    read_records,
)

__all__ = [
    "BATCH_OVERHEAD",
    "LOG_OVERHEAD",
    "MAX_BATCH_BYTES",
    "MAX_DECOMPRESSED_BYTES",
    "BatchBuilder",
    "BatchDecoder",
    "BatchHeader",
    "Codec",
    "Columns",
    "Header",
    "Record",
    "TimestampType",
    "build_batch",
    "check_batch",
    "crc32c",
    "decode_batch",
    "iter_batches",
    "iter_records",
    "parse_header",
    "peek_base_offset",
    "peek_batch_size",
    "read_columns",
    "read_records",
]
