"""Fetched record batches to Arrow: the rows Spark reads, built per fetch response.

:func:`decode_fetch` walks the batches of one fetch response (each CRC-checked) and decodes
their records in one of two ways:

- the vectorized path (the common shape: consecutive offsets, no headers asked for or
  present, create-time timestamps): Python only hops from record to record by their length
  varints; every field of every record of the response is then decoded at once by Arrow
  compute functions over the bytes, and keys and values are cut out of the buffer by Arrow
  (a ``binary_view`` array over it, cast to ``binary``): no Python object per record;
- the record loop (anything else): :func:`tidewire.records.read_columns`, the decoder of
  the consumers' ``poll_batch``, gives one list per column, and the conversion
  ``ConsumedBatch.to_arrow`` uses (:func:`tidewire.client._arrow.columns_to_arrow`) turns
  each into an Arrow array in C.

The vectorized path checks what it relies on and leaves any batch it does not take to the
loop; read_records hands anything malformed to the reference decoder, which names the
fault.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from tidewire.client._arrow import columns_to_arrow
from tidewire.records import BatchHeader, iter_batches, read_columns
from tidewire.records.batch import TimestampType
from tidewire.spark._vectorized import fast_rows, i64

__all__ = ["Decoded", "decode_fetch"]

#: Attribute bit 5: a control batch (transaction markers in Kafka's format): no user records.
_CONTROL_BIT = 0x20

Header = tuple[str, bytes | None]


class Decoded(NamedTuple):
    """What one fetch response held for the range asked for."""

    #: The rows at offsets within ``[start, end)``: a record batch per stored batch.
    batches: list[pa.RecordBatch]
    #: The offset to fetch next: past the last whole batch of the response (never past
    #: ``end``); ``start`` when the response held no whole batch.
    next_offset: int


class _Columns:
    """One list per column, appended to batch by batch."""

    __slots__ = ("headers", "keys", "offsets", "timestamps", "values")

    def __init__(self, with_headers: bool) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[tuple[Header, ...]] | None = [] if with_headers else None

    def trim(self, i0: int, start: int, end: int) -> None:
        """Drop the rows from ``i0`` on whose offsets fall outside ``[start, end)``."""
        lo = bisect_left(self.offsets, start, i0)
        hi = bisect_left(self.offsets, end, lo)
        columns: list[list[int] | list[bytes | None] | list[tuple[Header, ...]]] = [
            self.offsets,
            self.timestamps,
            self.keys,
            self.values,
        ]
        if self.headers is not None:
            columns.append(self.headers)
        for column in columns:
            del column[hi:]
            del column[i0:lo]


def decode_fetch(
    data: bytes, topic: str, partition: int, start: int, end: int, *, include_headers: bool
) -> Decoded:
    """The rows of ``topic``/``partition`` at offsets ``start`` (inclusive) to ``end``
    (exclusive) found in ``data``, the record batches of one fetch response.

    A partial batch at the end of ``data`` (the response's byte limit cut it) is left for
    the next fetch.

    Raises:
        RecordBatchError: a batch or a record is malformed (a subclass naming the fault).
    """
    selected: list[tuple[int, BatchHeader]] = []
    next_offset = start
    for pos, h in iter_batches(data):
        if h.base_offset >= end:
            next_offset = end
            break
        next_offset = min(h.next_offset, end)
        if h.next_offset > start and not h.attributes & _CONTROL_BIT:
            selected.append((pos, h))
    if not selected:
        return Decoded([], next_offset)
    rows = None if include_headers else fast_rows(data, selected, topic, partition)
    if rows is not None:
        offsets = rows.column(4)  # ascending
        lo = pc.sum(pc.less(offsets, i64(start))).as_py() or 0
        hi = pc.sum(pc.less(offsets, i64(end))).as_py() or 0
        return Decoded([rows.slice(lo, hi - lo)] if hi > lo else [], next_offset)
    out: list[pa.RecordBatch] = []
    for pos, h in selected:
        cols = _Columns(include_headers)
        _decode_batch(data, pos, h, cols)
        if h.base_offset < start or h.next_offset > end:
            cols.trim(0, start, end)
        if h.timestamp_type == TimestampType.LOG_APPEND_TIME:
            cols.timestamps = [h.max_timestamp] * len(cols.offsets)
        batch = _to_arrow(cols, topic, partition, h.timestamp_type)
        if batch is not None:
            out.append(batch)
    return Decoded(out, next_offset)


def _to_arrow(
    cols: _Columns, topic: str, partition: int, timestamp_type: int
) -> pa.RecordBatch | None:
    if not cols.offsets:
        return None
    return columns_to_arrow(
        topic,
        partition,
        timestamp_type,
        cols.offsets,
        cols.timestamps,
        cols.keys,
        cols.values,
        cols.headers,
    )


def _decode_batch(buf: bytes, start: int, h: BatchHeader, cols: _Columns) -> None:
    """Append the records of the (CRC-checked) batch at ``buf[start:]`` to ``cols``.

    Raises:
        RecordBatchError: the records are malformed (nothing is appended then).
    """
    offsets, timestamps, keys, values, headers = read_columns(buf, start, h)
    cols.offsets += offsets
    cols.timestamps += timestamps
    cols.keys += keys
    cols.values += values
    if cols.headers is not None:
        cols.headers += headers
