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

from array import array
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
    rows = None if include_headers else _fast_rows(data, selected, topic, partition)
    if rows is not None:
        offsets = rows.column(4)  # ascending
        lo = pc.sum(pc.less(offsets, _i64(start))).as_py() or 0
        hi = pc.sum(pc.less(offsets, _i64(end))).as_py() or 0
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


# --- the vectorized path ------------------------------------------------------------------------
#
# Records are walked in Python only to find where each begins (its length varint); every other
# field is decoded for all the records of a batch at once by Arrow compute functions over the
# section's bytes (a uint8 array), and keys and values are cut out of the section by Arrow as a
# binary_view array (16-byte views: length, first bytes, offset) cast to binary. It takes the
# common shape: consecutive offset deltas, no headers, fields whose varints fit in 3 bytes.
# Anything else (or anything inconsistent) returns None and the record loop above decodes the
# batch, raising the reference decoder's error for malformed input.

#: The longest varint the vectorized path decodes (bytes): 21 bits.
_MAX_FAST_VARINT = 3
#: Values of at most this many bytes live inside their view (Arrow's binary_view layout).
_INLINE_BYTES = 12


def _i64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.int64())


# Compute functions get Arrow scalars, never Python ints, and arrays are built from buffers,
# not from Python sequences: pyarrow converts Python objects through a path that tries to
# import pandas on every call where pandas is not installed (a quarter of a millisecond each).
_K = {k: _i64(k) for k in (-1, 0, 1, 2, 3, 6, 7, 8, 14, 16, 24, 0x7F, 0x80, _INLINE_BYTES)}
_I32_ZERO = pa.scalar(0, pa.int32())
_U8_ZERO = pa.scalar(0, pa.uint8())


def _int64s(values: array[int]) -> pa.Array:
    """An int64 array over the buffer of an ``array('q')``."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


_aranges: list[pa.Array] = [_int64s(array("q"))]


def _arange(n: int) -> pa.Array:
    """0, 1, ..., n - 1: a slice of one array kept and grown (doubling) as needed."""
    if len(_aranges[0]) < n:
        _aranges[0] = _int64s(array("q", range(max(n, 2 * len(_aranges[0])))))
    return _aranges[0].slice(0, n)


def _fast_rows(
    data: bytes, batches: list[tuple[int, BatchHeader]], topic: str, partition: int
) -> pa.RecordBatch | None:
    """The rows of ``batches`` (CRC-checked, at their positions in ``data``) in one record
    batch, or None when one of them is not of the shape the vectorized path takes."""
    spans: list[tuple[int, int]] = []  # each batch's records, within ``section``
    if any(h.codec for _, h in batches):  # one buffer: decompressed sections back to back
        parts: list[bytes | memoryview] = []
        at = 0
        for pos, h in batches:
            view = memoryview(data)[pos + BATCH_OVERHEAD : pos + h.size]
            part = decompress(h.codec, view) if h.codec else view
            parts.append(part)
            spans.append((at, at + len(part)))
            at += len(part)
        section = b"".join(parts)
    else:
        section = data
        spans = [(pos + BATCH_OVERHEAD, pos + h.size) for pos, h in batches]
    starts: array[int] = array("q")  # of each record: its length varint
    offsets: array[int] = array("q")
    deltas: array[int] = array("q")
    stamp_bases: list[pa.Array] = []
    add = starts.append
    try:
        for (first, end), (_, h) in zip(spans, batches, strict=True):
            pos, n = first, h.records_count
            if n < 1 or h.last_offset_delta != n - 1 or h.timestamp_type:
                return None
            # Hop from record to record by their lengths; the lengths are checked below,
            # all at once, and the hops must land exactly on the end of the batch.
            for _ in range(n):
                add(pos)
                b = section[pos]
                if b < 0x80:
                    pos += 1 + (b >> 1)
                else:
                    b2 = section[pos + 1]
                    if b2 < 0x80:
                        pos += 2 + (((b & 0x7F) | (b2 << 7)) >> 1)
                    else:
                        length, pos = _dv(section, pos)
                        pos += length
            if pos != end:
                return None
            offsets.extend(range(h.base_offset, h.base_offset + n))
            deltas.extend(range(n))
            stamp_bases.append(pa.repeat(_i64(h.first_timestamp), n))
    except (IndexError, RecordBatchError):
        return None
    n = len(starts)
    flat = pa.Array.from_buffers(pa.uint8(), len(section), [None, pa.py_buffer(section)])
    last = _i64(len(section) - 1)
    head = _varints(flat, _int64s(starts), last)
    if head is None:
        return None
    length = _zigzag(head[0])
    if not pc.all(pc.greater_equal(length, _K[6])).as_py():  # what its fields take at least
        return None
    body = pc.add(_int64s(starts), head[1])
    record_ends = pc.add(body, length)
    p = pc.add(body, _K[1])  # after the attributes byte: the timestamp delta
    ts = _varints(flat, p, last)
    if ts is None:
        return None
    ts_delta, p = _zigzag(ts[0]), pc.add(p, ts[1])
    od = _varints(flat, p, last)
    if od is None or not pc.all(pc.equal(_zigzag(od[0]), _int64s(deltas))).as_py():
        return None
    p = pc.add(p, od[1])
    key = _varints(flat, p, last)
    if key is None:
        return None
    key_len, key_start = _zigzag(key[0]), pc.add(p, key[1])
    p = pc.add(key_start, pc.max_element_wise(key_len, _K[0]))
    value = _varints(flat, _clip(p, last), last)
    if value is None:
        return None
    value_len, value_start = _zigzag(value[0]), pc.add(p, value[1])
    header_count_at = pc.add(value_start, pc.max_element_wise(value_len, _K[0]))
    ok = pc.and_(
        pc.and_(pc.greater_equal(key_len, _K[-1]), pc.greater_equal(value_len, _K[-1])),
        pc.and_(
            pc.equal(pc.add(header_count_at, _K[1]), record_ends),  # one byte left:
            pc.equal(pc.take(flat, _clip(header_count_at, last)), _U8_ZERO),  # no headers
        ),
    )
    if not pc.all(ok).as_py():
        return None
    buffer = pa.py_buffer(section)
    stamps = pc.add(ts_delta, pa.concat_arrays(stamp_bases))
    arrays = [
        _binary(flat, buffer, key_start, key_len, last),
        _binary(flat, buffer, value_start, value_len, last),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        _int64s(offsets),
        pc.multiply(stamps, _i64(_US_PER_MS)).cast(_TIMESTAMP),
        pa.repeat(_I32_ZERO, n),  # create time: log-append time takes the record loop
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(False))


def _clip(positions: pa.Array, last: pa.Scalar) -> pa.Array:
    """Positions past the section's last byte moved onto it (the checks reject such rows)."""
    return pc.min_element_wise(positions, last)


def _varints(flat: pa.Array, at: pa.Array, last: pa.Scalar) -> tuple[pa.Array, pa.Array] | None:
    """The unsigned varints at positions ``at`` and their sizes, or None if one is longer
    than 3 bytes."""
    b0 = pc.take(flat, at).cast(pa.int64())
    c0 = pc.greater_equal(b0, _K[0x80])
    if not pc.any(c0).as_py():
        return b0, pa.repeat(_K[1], len(at))
    b1 = pc.take(flat, _clip(pc.add(at, _K[1]), last)).cast(pa.int64())
    c1 = pc.and_(c0, pc.greater_equal(b1, _K[0x80]))
    b2 = pc.take(flat, _clip(pc.add(at, _K[2]), last)).cast(pa.int64())
    if pc.any(pc.and_(c1, pc.greater_equal(b2, _K[0x80]))).as_py():
        return None
    low = pc.bit_wise_and(b0, _K[0x7F])
    mid = pc.shift_left(pc.bit_wise_and(b1, _K[0x7F]), _K[7])
    high = pc.shift_left(b2, _K[14])
    two = pc.bit_wise_or(low, mid)
    value = pc.if_else(c0, pc.if_else(c1, pc.bit_wise_or(two, high), two), b0)
    size = pc.add(pc.add(c0.cast(pa.int64()), c1.cast(pa.int64())), _K[1])
    return value, size


def _zigzag(v: pa.Array) -> pa.Array:
    return pc.bit_wise_xor(pc.shift_right(v, _K[1]), pc.negate(pc.bit_wise_and(v, _K[1])))


def _is_range(v: pa.Array, n: int) -> bool:
    return bool(pc.all(pc.equal(v, _int64s(array("q", range(n))))).as_py())


def _binary(
    flat: pa.Array, buffer: pa.Buffer, start: pa.Array, length: pa.Array, last: pa.Scalar
) -> pa.Array:
    """``section[start:start+length]`` per row as a binary array (length -1: null), cut out
    by Arrow: a binary_view array over the section, cast to binary."""
    n = len(start)
    size = pc.max_element_wise(length, _K[0])
    inline = pc.less_equal(size, _K[_INLINE_BYTES])
    word = [_word(flat, start, size, k, last) for k in (0, 4, 8)]
    zero = pa.repeat(_I32_ZERO, n)
    columns = [
        size.cast(pa.int32()),
        word[0],
        pc.if_else(inline, word[1], zero),
        pc.if_else(inline, word[2], start.cast(pa.int32())),
    ]
    i = _arange(4 * n)
    order = pc.add(pc.multiply(pc.bit_wise_and(i, _K[3]), _i64(n)), pc.shift_right(i, _K[2]))
    views = pc.take(pa.concat_arrays(columns), order)
    nulls = pc.less(length, _K[0])
    validity = pc.invert(nulls).buffers()[1] if pc.any(nulls).as_py() else None
    cut = pa.Array.from_buffers(pa.binary_view(), n, [validity, views.buffers()[1], buffer])
    return pc.cast(cut, pa.binary())


def _word(flat: pa.Array, start: pa.Array, size: pa.Array, k: int, last: pa.Scalar) -> pa.Array:
    """Bytes ``k..k+3`` of each value as a little-endian int32 (bytes past the value: 0)."""
    total = None
    for j in range(4):
        at = _i64(k + j)
        b = pc.take(flat, _clip(pc.add(start, at), last)).cast(pa.int64())
        b = pc.if_else(pc.greater(size, at), b, _K[0])
        b = pc.shift_left(b, _K[8 * j]) if j else b
        total = b if total is None else pc.bit_wise_or(total, b)
    assert total is not None
    return total.cast(pa.uint32()).view(pa.int32())
