"""Fetched record batches to Arrow: the rows Spark reads, built per fetch response.

:func:`decode_fetch` walks the batches of one fetch response (each CRC-checked) and decodes
their records in one of two ways:

- the vectorized path (the common shape: consecutive offsets, no headers asked for or
  present, create-time timestamps): Python only hops from record to record by their length
  varints; every field of every record of the response is then decoded at once by Arrow
  compute functions over the bytes, and keys and values are cut out of the buffer by Arrow
  (a ``binary_view`` array over it, cast to ``binary``): no Python object per record;
- the record loop (anything else): one pass in Python that decodes the one- and two-byte
  varints inline, as :func:`tidewire.records.read_records` does, into one list per column,
  each turned into an Arrow array in C.

The vectorized path checks what it relies on and leaves any batch it does not take to the
loop; the loop hands anything malformed to the reference decoder
(:func:`tidewire.records.iter_records`), which names the fault.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from tidewire.errors import InvalidRecordError, RecordBatchError
from tidewire.records import BATCH_OVERHEAD, BatchHeader, iter_batches, iter_records
from tidewire.records.batch import TimestampType
from tidewire.records.compression import decompress
from tidewire.records.varint import decode as _dv
from tidewire.spark._schema import HEADER_ARROW_TYPE, arrow_schema
from tidewire.spark._vectorized import fast_rows, i64

__all__ = ["Decoded", "decode_fetch"]

#: Attribute bit 5: a control batch (transaction markers in Kafka's format): no user records.
_CONTROL_BIT = 0x20
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_US_PER_MS = 1000

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
        self.headers: list[list[Header]] | None = [] if with_headers else None

    def trim(self, i0: int, start: int, end: int) -> None:
        """Drop the rows from ``i0`` on whose offsets fall outside ``[start, end)``."""
        lo = bisect_left(self.offsets, start, i0)
        hi = bisect_left(self.offsets, end, lo)
        columns: list[list[int] | list[bytes | None] | list[list[Header]]] = [
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
    n = len(cols.offsets)
    if not n:
        return None
    arrays = [
        pa.array(cols.keys, pa.binary()),
        pa.array(cols.values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(cols.offsets, pa.int64()),
        pc.multiply(pa.array(cols.timestamps, pa.int64()), _US_PER_MS).cast(_TIMESTAMP),
        pa.repeat(pa.scalar(timestamp_type, pa.int32()), n),
    ]
    if cols.headers is not None:
        arrays.append(pa.array(cols.headers, HEADER_ARROW_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(cols.headers is not None))


def _decode_batch(buf: bytes, start: int, h: BatchHeader, cols: _Columns) -> None:
    """Append the records of the (CRC-checked) batch at ``buf[start:]`` to ``cols``."""
    if h.codec:
        view = memoryview(buf)[start + BATCH_OVERHEAD : start + h.size]
        data = bytes(decompress(h.codec, view))
        pos, end = 0, len(data)
    else:
        data = buf
        pos, end = start + BATCH_OVERHEAD, start + h.size
    base, first_ts, last_delta = h.base_offset, h.first_timestamp, h.last_offset_delta
    offsets, timestamps, keys, values = cols.offsets, cols.timestamps, cols.keys, cols.values
    add_offset, add_timestamp = offsets.append, timestamps.append
    add_key, add_value = keys.append, values.append
    headers = cols.headers
    n0 = len(offsets)
    prev = -1
    ok = False
    try:
        for _ in range(h.records_count):
            # Each varint: one byte, two bytes (inline), or the general decoder.
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                n = (b & 0x7F) | (data[pos + 1] << 7)
                length = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                length, pos = _dv(data, pos)
            if length < 6 or pos + length > end:
                break
            rec_end = pos + length
            b = data[pos + 1]  # after the attributes byte: the timestamp delta
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            elif data[pos + 2] < 0x80:
                n = (b & 0x7F) | (data[pos + 2] << 7)
                ts_delta = (n >> 1) ^ -(n & 1)
                pos += 3
            else:
                ts_delta, pos = _dv(data, pos + 1, wide=True)
            b = data[pos]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                n = (b & 0x7F) | (data[pos + 1] << 7)
                delta = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                delta, pos = _dv(data, pos)
            if delta <= prev or delta > last_delta:
                break
            prev = delta
            if data[pos] == 1:  # -1: a null key
                key = None
                pos += 1
            else:
                n, pos = _dv(data, pos)
                if n < -1 or pos + n > rec_end:
                    break
                if n == -1:
                    key = None
                else:
                    key = data[pos : pos + n]
                    pos += n
            b = data[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                n = (b & 0x7F) | (data[pos + 1] << 7)
                n = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                n, pos = _dv(data, pos)
            if n < -1 or pos + n > rec_end:
                break
            if n == -1:
                value = None
            else:
                value = data[pos : pos + n]
                pos += n
            if headers is not None:
                if data[pos] == 0:
                    headers.append([])
                    pos += 1
                else:
                    record_headers, pos = _headers(data, pos, rec_end)
                    headers.append(record_headers)
                if pos != rec_end:
                    break
            elif pos >= rec_end:  # at least the header count is left
                break
            add_offset(base + delta)
            add_timestamp(first_ts + ts_delta)
            add_key(key)
            add_value(value)
            pos = rec_end
        else:
            ok = pos == end
    except (IndexError, RecordBatchError):
        pass
    if ok:
        return
    # Malformed: take back what this batch appended; the reference reader names the fault.
    del offsets[n0:], timestamps[n0:], keys[n0:], values[n0:]
    if headers is not None:
        del headers[n0:]
    for _ in iter_records(memoryview(buf)[start : start + h.size]):
        pass
    raise InvalidRecordError("the batch's records are malformed")  # pragma: no cover


def _headers(data: bytes, pos: int, rec_end: int) -> tuple[list[Header], int]:
    """The headers of one record at ``data[pos:]`` (their count first)."""
    count, pos = _dv(data, pos)
    if count < 0 or count > rec_end - pos:
        raise InvalidRecordError(f"a record declares {count} headers")
    out: list[Header] = []
    for _ in range(count):
        n, pos = _dv(data, pos)
        if n < 0 or pos + n > rec_end:
            raise InvalidRecordError(f"a header key of length {n}")
        try:
            name = data[pos : pos + n].decode()
        except UnicodeDecodeError:
            raise InvalidRecordError("a header key that is not UTF-8") from None
        pos += n
        n, pos = _dv(data, pos)
        if n < -1 or pos + n > rec_end:
            raise InvalidRecordError(f"a header value of length {n}")
        if n == -1:
            out.append((name, None))
        else:
            out.append((name, data[pos : pos + n]))
            pos += n
    return out, pos
