"""The record batch format (Kafka RecordBatch v2): build, check, read. Pure: no I/O at all.

Public names::

    BatchBuilder, build_batch      build batches
    check_batch, parse_header      the broker's cheap per-batch check (header, sizes, CRC-32C)
    decode_batch, iter_records     full record-level validation and lazy reading
    read_records                   the same validation, fast, into a list (consumers)
    read_columns                   the same, into columns: offsets, timestamps, keys, ...
    read_spans, Spans              the same checks now, the columns when asked for
    iter_batches, BatchDecoder     walk concatenated batches; decode a byte stream incrementally
    Codec                          compression codecs (none, gzip, lz4, zstd)
    IMPLEMENTATION                 "compiled" or "python": which read_records, read_columns
                                   and BatchBuilder run (see _impl.py; TIDEWIRE_PURE_PYTHON=1
                                   forces "python")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidewire.records._impl import IMPLEMENTATION
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
from tidewire.records.builder import Header, build_batch
from tidewire.records.compression import MAX_DECOMPRESSED_BYTES, Codec
from tidewire.records.reader import (
    BatchDecoder,
    Columns,
    Record,
    decode_batch,
    iter_batches,
    iter_records,
)

# The hot loops come from the implementation _impl chose; type checkers see the pure ones,
# whose signatures the compiled ones share.
if TYPE_CHECKING:
    from tidewire.records.builder import BatchBuilder
    from tidewire.records.reader import Spans, read_columns, read_records, read_spans
else:
    from tidewire.records._impl import BatchBuilder, Spans, read_columns, read_records, read_spans

__all__ = [
    "BATCH_OVERHEAD",
    "IMPLEMENTATION",
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
    "Spans",
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
    "read_spans",
]
