"""The vectorized decode of fetched record batches: Arrow compute over the bytes.

Records are walked in Python only to find where each begins (its length varint); every other
field is decoded for all the records of a fetch response at once by Arrow compute functions
over the bytes (a uint8 array), and keys and values are cut out of the buffer by Arrow as a
``binary_view`` array (16-byte views: length, first bytes, offset) cast to ``binary``. It
takes the common shape: consecutive offset deltas, no headers, create-time timestamps,
fields whose varints fit in 3 bytes. For anything else, or anything inconsistent,
:func:`fast_rows` returns None and the record loop of :mod:`tidewire.spark._decode` decodes
the batches (and names the fault of malformed input).
"""

from __future__ import annotations

from array import array

import pyarrow as pa
import pyarrow.compute as pc

from tidewire.errors import RecordBatchError
from tidewire.records import BATCH_OVERHEAD, BatchHeader
from tidewire.records.compression import decompress
from tidewire.records.varint import decode as _dv
from tidewire.spark._schema import arrow_schema

__all__ = ["fast_rows", "i64"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_US_PER_MS = 1000

#: The longest varint the vectorized path decodes (bytes): 21 bits.
_MAX_FAST_VARINT = 3
#: Values of at most this many bytes live inside their view (Arrow's binary_view layout).
_INLINE_BYTES = 12


def i64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.int64())


# Compute functions get Arrow scalars, never Python ints, and arrays are built from buffers,
# not from Python sequences: pyarrow converts Python objects through a path that tries to
# import pandas on every call where pandas is not installed (a quarter of a millisecond each).
_K = {k: i64(k) for k in (-1, 0, 1, 2, 3, 6, 7, 8, 14, 16, 24, 0x7F, 0x80, _INLINE_BYTES)}
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


def fast_rows(
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
            stamp_bases.append(pa.repeat(i64(h.first_timestamp), n))
    except (IndexError, RecordBatchError):
        return None
    n = len(starts)
    flat = pa.Array.from_buffers(pa.uint8(), len(section), [None, pa.py_buffer(section)])
    last = i64(len(section) - 1)
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
        pc.multiply(stamps, i64(_US_PER_MS)).cast(_TIMESTAMP),
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
    order = pc.add(pc.multiply(pc.bit_wise_and(i, _K[3]), i64(n)), pc.shift_right(i, _K[2]))
    views = pc.take(pa.concat_arrays(columns), order)
    nulls = pc.less(length, _K[0])
    validity = pc.invert(nulls).buffers()[1] if pc.any(nulls).as_py() else None
    cut = pa.Array.from_buffers(pa.binary_view(), n, [validity, views.buffers()[1], buffer])
    return pc.cast(cut, pa.binary())


def _word(flat: pa.Array, start: pa.Array, size: pa.Array, k: int, last: pa.Scalar) -> pa.Array:
    """Bytes ``k..k+3`` of each value as a little-endian int32 (bytes past the value: 0)."""
    total = None
    for j in range(4):
        at = i64(k + j)
        b = pc.take(flat, _clip(pc.add(start, at), last)).cast(pa.int64())
        b = pc.if_else(pc.greater(size, at), b, _K[0])
        b = pc.shift_left(b, _K[8 * j]) if j else b
        total = b if total is None else pc.bit_wise_or(total, b)
    assert total is not None
    return total.cast(pa.uint32()).view(pa.int32())
