"""Reading record batches: lazy record iteration, full validation, and an incremental
batch decoder for byte streams (pure, no I/O).

Every function here raises only :class:`~tidewire.errors.RecordBatchError` subclasses for bad
input; any other exception escaping a decoder is a bug.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, NoReturn, TypeVar

from tidewire.errors import (
    BatchLengthError,
    InvalidRecordError,
    RecordBatchError,
    RecordCountError,
)
from tidewire.records.batch import (
    BATCH_OVERHEAD,
    LOG_OVERHEAD,
    MAX_BATCH_BYTES,
    BatchHeader,
    check_batch,
    parse_header,
)
from tidewire.records.compression import MAX_DECOMPRESSED_BYTES, decompress
from tidewire.records.varint import decode as _dv

__all__ = [
    "BatchDecoder",
    "Columns",
    "Record",
    "Spans",
    "binary_columns",
    "decode_batch",
    "int64_columns",
    "iter_batches",
    "iter_records",
    "read_columns",
    "read_records",
    "read_spans",
]

T = TypeVar("T", bound=tuple[Any, ...])

#: What :func:`read_columns` returns: offsets, timestamps, keys, values, headers.
Columns = tuple[
    list[int],
    list[int],
    list[bytes | None],
    list[bytes | None],
    list[tuple[tuple[str, bytes | None], ...]],
]
_new_tuple = tuple.__new__


class Record(NamedTuple):
    """One record as read from a batch. ``headers`` keys are text, values bytes or None."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def iter_records(
    batch: bytes | bytearray | memoryview,
    *,
    decompression_limit: int = MAX_DECOMPRESSED_BYTES,
) -> Iterator[Record]:
    """Check ``batch`` (one whole batch, CRC included) and yield its records lazily.

    The batch is not copied: records are parsed from a memoryview over ``batch`` (or over the
    decompressed section). The record count and the section's length are verified when the
    iteration ends.

    Raises:
        RecordBatchError: any malformed input (a subclass naming the fault).
    """
    return _open(batch, decompression_limit)[1]


def _open(
    batch: bytes | bytearray | memoryview, decompression_limit: int
) -> tuple[BatchHeader, Iterator[Record]]:
    h = check_batch(batch)
    if h.size != len(batch):
        raise BatchLengthError(
            f"buffer holds {len(batch):,} bytes but the batch is {h.size:,} bytes"
        )
    section = decompress(h.codec, memoryview(batch)[BATCH_OVERHEAD:], decompression_limit)
    return h, _records(h, memoryview(section))


def _records(h: BatchHeader, buf: memoryview) -> Iterator[Record]:
    end = len(buf)
    pos = 0
    base_offset = h.base_offset
    first_ts = h.first_timestamp
    last_delta = -1
    for i in range(h.records_count):
        if pos >= end:
            raise RecordCountError(f"batch declares {h.records_count} records but holds {i}")
        length, pos = _dv(buf, pos)
        if length < 6 or pos + length > end:
            raise InvalidRecordError(
                f"record {i} has length {length}, {end - pos} bytes left in the batch"
            )
        rec_end = pos + length
        pos += 1  # record attributes (unused)
        ts_delta, pos = _dv(buf, pos, wide=True)
        offset_delta, pos = _dv(buf, pos)
        if offset_delta <= last_delta or offset_delta > h.last_offset_delta:
            raise InvalidRecordError(
                f"record {i} has offset delta {offset_delta}: must be above {last_delta} "
                f"and at most last_offset_delta {h.last_offset_delta}"
            )
        last_delta = offset_delta
        key, pos = _field(buf, pos, rec_end, i, "key")
        value, pos = _field(buf, pos, rec_end, i, "value")
        nheaders, pos = _dv(buf, pos)
        if nheaders < 0 or nheaders > rec_end - pos:
            raise InvalidRecordError(f"record {i} declares {nheaders} headers")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(nheaders):
            hkey, pos = _field(buf, pos, rec_end, i, "header key")
            if hkey is None:
                raise InvalidRecordError(f"record {i} has a header with a null key")
            try:
                hname = hkey.decode()
            except UnicodeDecodeError:
                raise InvalidRecordError(f"record {i} has a header key that is not UTF-8") from None
            hval, pos = _field(buf, pos, rec_end, i, "header value")
            headers.append((hname, hval))
        if pos != rec_end:
            raise InvalidRecordError(
                f"record {i} declares {length} bytes but its fields take {length + pos - rec_end}"
            )
        yield Record(base_offset + offset_delta, first_ts + ts_delta, key, value, tuple(headers))
    if pos != end:
        raise RecordCountError(
            f"{end - pos} bytes follow the {h.records_count} records the batch declares"
        )


def read_records(  # noqa: PLR0917 (a reader's hot loop: positional arguments cost least)
    buf: bytes | bytearray,
    start: int,
    h: BatchHeader,
    factory: type[T],
    topic: str,
    partition: int,
    min_offset: int = 0,
    decompression_limit: int = MAX_DECOMPRESSED_BYTES,
    max_offset: int = 2**63 - 1,
) -> list[T]:
    """The records of the batch at ``buf[start:]`` whose header ``h`` was already checked
    (:func:`iter_batches` or :func:`check_batch`: sizes and CRC), as a list of
    ``factory`` tuples ``(topic, partition, offset, timestamp, key, value, headers)``;
    records below ``min_offset`` are left out, and the reading stops after ``max_offset``
    (the records after it are neither decoded nor checked: a reader that wants part of a
    batch, as a queue consumer handed a few of its records).

    The fast twin of :func:`iter_records` for consumers: :func:`read_columns` (one pass over
    ``bytes`` with the one- and two-byte varints decoded inline) with the columns zipped into
    one tuple per record. It accepts exactly what :func:`iter_records` accepts; for anything
    else it raises the same error (it asks :func:`iter_records` for it).

    Raises:
        RecordBatchError: any malformed input (a subclass naming the fault).
    """
    offsets, timestamps, keys, values, headers = read_columns(
        buf, start, h, min_offset, decompression_limit, max_offset
    )
    return [
        _new_tuple(factory, (topic, partition, *row))
        for row in zip(offsets, timestamps, keys, values, headers, strict=True)
    ]


def read_columns(  # noqa: PLR0917 (the same positional parameters as read_records)
    buf: bytes | bytearray,
    start: int,
    h: BatchHeader,
    min_offset: int = 0,
    decompression_limit: int = MAX_DECOMPRESSED_BYTES,
    max_offset: int = 2**63 - 1,
) -> Columns:
    """The records of the batch at ``buf[start:]`` as columns: ``(offsets, timestamps, keys,
    values, headers)``, five lists of equal length with one entry per record (``headers``
    holds each record's tuple of ``(key, value)`` pairs).

    The columnar twin of :func:`read_records`, for batch readers (a consumer's
    ``poll_batch``, Arrow conversion): the same checks, the same ``min_offset`` /
    ``max_offset`` window, the same errors, and no tuple per record.

    Raises:
        RecordBatchError: any malformed input (a subclass naming the fault).
    """
    if h.codec:
        view = memoryview(buf)[start : start + h.size]
        data = bytes(decompress(h.codec, view[BATCH_OVERHEAD:], decompression_limit))
        pos, end = 0, len(data)
    elif type(buf) is not bytes:
        # Keys and values are slices: of bytes, so that they are bytes (a copy of the batch,
        # not of the whole buffer).
        data = bytes(memoryview(buf)[start : start + h.size])
        pos, end = BATCH_OVERHEAD, h.size
    else:
        data = buf
        pos, end = start + BATCH_OVERHEAD, start + h.size
    base, first_ts, last_delta = h.base_offset, h.first_timestamp, h.last_offset_delta
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers_col: list[tuple[tuple[str, bytes | None], ...]] = []
    columns = (offsets, timestamps, keys, values, headers_col)
    prev = -1
    try:
        for _ in range(h.records_count):
            if pos >= end:
                break
            # Each varint: one byte (the common case), two bytes, or the general decoder.
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
            elif data[pos + 1] < 0x80:  # a batch of more than 63 records
                n = (b & 0x7F) | (data[pos + 1] << 7)
                delta = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                delta, pos = _dv(data, pos)
            if delta <= prev or delta > last_delta:
                break
            prev = delta
            b = data[pos]
            if b == 1:  # -1: a null key
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
            if data[pos] == 0:
                headers: tuple[tuple[str, bytes | None], ...] = ()
                pos += 1
            else:
                headers, pos = _headers(data, pos, rec_end)
            if pos != rec_end:
                break
            offset = base + delta
            if offset >= min_offset:
                if offset > max_offset:
                    return columns
                offsets.append(offset)
                timestamps.append(first_ts + ts_delta)
                keys.append(key)
                values.append(value)
                headers_col.append(headers)
        else:
            if pos == end:
                return columns
    except (IndexError, RecordBatchError):
        pass
    # Malformed: the reference reader names the fault.
    for _ in iter_records(
        memoryview(buf)[start : start + h.size], decompression_limit=decompression_limit
    ):
        pass
    raise InvalidRecordError("the batch's records are malformed")  # pragma: no cover


class Spans:
    """The records of one batch as :func:`read_spans` found them: checked, counted, their
    columns made when asked for (:meth:`column`, :meth:`columns`).

    The compiled twin keeps where each key and value is in the batch's data and makes no
    object per record until a column is asked for; this pure one holds the columns
    :func:`read_columns` made (in Python, slicing the data later costs what it costs now).
    """

    __slots__ = ("_columns",)

    def __init__(self, columns: Columns) -> None:
        self._columns = columns

    def __len__(self) -> int:
        return len(self._columns[0])

    @property
    def last_offset(self) -> int:
        """The offset of the last record (-1 when there is none)."""
        offsets = self._columns[0]
        return offsets[-1] if offsets else -1

    def column(self, index: int) -> list[Any]:
        """A new list of one column: 0 offsets, 1 timestamps, 2 keys, 3 values, 4 headers.

        Raises:
            IndexError: ``index`` is not 0..4.
        """
        if not 0 <= index <= 4:
            raise IndexError(f"column {index} of 0..4")
        return list(self._columns[index])

    def int64_column(self, index: int) -> bytes:
        """Column 0 (offsets) or 1 (timestamps) as the bytes of one native int64 a record
        (an Arrow ``int64`` array's data buffer): :func:`int64_columns` of these spans.

        Raises:
            IndexError: ``index`` is not 0 or 1.
        """
        return int64_columns((self,), index)

    def binary_column(self, index: int) -> tuple[bytes | None, bytes, bytes, int]:
        """Column 2 (keys) or 3 (values) in Arrow's ``binary`` layout:
        :func:`binary_columns` of these spans.

        Raises:
            IndexError: ``index`` is not 2 or 3.
            OverflowError: the data is 2 GiB or more (past int32 offsets).
        """
        return binary_columns((self,), index)

    def columns(self) -> Columns:
        """What :func:`read_columns` returns for the same batch and window (new lists)."""
        offsets, timestamps, keys, values, headers = self._columns
        return list(offsets), list(timestamps), list(keys), list(values), list(headers)


def int64_columns(spans: Iterable[Spans], index: int) -> bytes:
    """Column 0 (offsets) or 1 (timestamps) of several spans one after the other, as the
    bytes of one native int64 a record (an Arrow ``int64`` array's data buffer).

    Raises:
        IndexError: ``index`` is not 0 or 1.
    """
    if index not in {0, 1}:
        raise IndexError(f"int64 column {index} of 0..1")
    out = array("q")
    for s in spans:
        out.extend(s.column(index))
    return out.tobytes()


def binary_columns(spans: Iterable[Spans], index: int) -> tuple[bytes | None, bytes, bytes, int]:
    """Column 2 (keys) or 3 (values) of several spans one after the other, in Arrow's
    ``binary`` layout: ``(validity, offsets, data, null_count)``, the validity bitmap None
    when no record has None there, the offsets one native int32 a record and one more, the
    data each key or value after the other (compiled: one copy of each, no object a record).

    Raises:
        IndexError: ``index`` is not 2 or 3.
        OverflowError: the data is 2 GiB or more (past int32 offsets).
    """
    if index not in {2, 3}:
        raise IndexError(f"binary column {index} of 2..3")
    column: list[bytes | None] = []
    for s in spans:
        column += s.column(index)
    validity = bytearray((len(column) + 7) // 8)
    offsets = array("i", [0])
    data: list[bytes] = []
    nulls = total = 0
    for i, v in enumerate(column):
        if v is None:
            nulls += 1
        else:
            data.append(v)
            total += len(v)
            validity[i >> 3] |= 1 << (i & 7)
        if total > 0x7FFFFFFF:
            raise OverflowError(f"{total:,} bytes of data: past Arrow binary's int32 offsets")
        offsets.append(total)
    return (bytes(validity) if nulls else None), offsets.tobytes(), b"".join(data), nulls


def read_spans(  # noqa: PLR0917 (the same positional parameters as read_columns)
    buf: bytes | bytearray,
    start: int,
    h: BatchHeader,
    min_offset: int = 0,
    decompression_limit: int = MAX_DECOMPRESSED_BYTES,
    max_offset: int = 2**63 - 1,
) -> Spans:
    """The records of the batch at ``buf[start:]`` as :class:`Spans`: the checks, window and
    errors of :func:`read_columns` at once, the columns' objects when asked for (compiled:
    a consumer handing out a batch makes no int or bytes per record; a reader that never
    asks for a column never pays for it). ``buf`` must not change while the spans are used
    (a fetched frame's buffer never does).

    Raises:
        RecordBatchError: any malformed input (a subclass naming the fault).
    """
    return Spans(read_columns(buf, start, h, min_offset, decompression_limit, max_offset))


def _headers(
    data: bytes, pos: int, rec_end: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """Headers of one record (the rare case); raises RecordBatchError on anything wrong."""
    nheaders, pos = _dv(data, pos)
    if nheaders < 0 or nheaders > rec_end - pos:
        raise InvalidRecordError("bad header count")
    view = memoryview(data)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(nheaders):
        hkey, pos = _field(view, pos, rec_end, 0, "header key")
        if hkey is None:
            raise InvalidRecordError("a header with a null key")
        try:
            hname = hkey.decode()
        except UnicodeDecodeError:
            raise InvalidRecordError("a header key that is not UTF-8") from None
        hval, pos = _field(view, pos, rec_end, 0, "header value")
        headers.append((hname, hval))
    return tuple(headers), pos


def _field(
    buf: memoryview, pos: int, rec_end: int, index: int, name: str
) -> tuple[bytes | None, int]:
    n, pos = _dv(buf, pos)
    if n == -1:
        return None, pos
    if n < -1 or pos + n > rec_end:
        raise InvalidRecordError(
            f"record {index} has a {name} of length {n} with {rec_end - pos} bytes left"
        )
    return bytes(buf[pos : pos + n]), pos + n


def decode_batch(
    batch: bytes | bytearray | memoryview,
    *,
    decompression_limit: int = MAX_DECOMPRESSED_BYTES,
) -> tuple[BatchHeader, list[Record]]:
    """Fully validate one whole batch and return its header and records.

    Raises:
        RecordBatchError: any malformed input.
    """
    h, records = _open(batch, decompression_limit)
    return h, list(records)


def iter_batches(
    buf: bytes | bytearray | memoryview,
    *,
    verify: bool = True,
    start: int = 0,
    end: int | None = None,
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each whole batch in a concatenation of batches (a fetch
    response, a segment). A partial batch at the end is not yielded.

    Args:
        buf: the bytes.
        verify: check each batch's CRC (``False`` parses headers only).
        start, end: the batches lie in ``buf[start:end]`` (positions are in ``buf``).

    Raises:
        RecordBatchError: a malformed batch before the end.
    """
    pos = start
    end = len(buf) if end is None else end
    while end - pos >= BATCH_OVERHEAD:
        h = parse_header(buf, pos)
        if pos + h.size > end:
            return
        if verify:
            check_batch(buf, pos)
        yield pos, h
        pos += h.size


class BatchDecoder:
    """Incremental, sans-IO decoder of a byte stream of concatenated batches.

    Feed bytes with :meth:`receive_data` in pieces of any size; :meth:`next_batch` returns each
    complete, CRC-checked batch once it is all there, and ``None`` while more bytes are needed.
    The header is checked as soon as its 61 bytes arrive, so a garbage length is refused before
    anything is buffered for it. After an error the decoder stays failed and raises it again.

    Args:
        max_batch_bytes: the largest batch accepted; buffered data never exceeds it by more
            than one ``receive_data`` call.
    """

    def __init__(self, *, max_batch_bytes: int = MAX_BATCH_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_batch_bytes
        self._error: RecordBatchError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a batch."""
        return len(self._buf)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the stream."""
        if self._error is not None:
            raise self._error
        self._buf += data

    def next_batch(self) -> bytes | None:
        """Return the next complete batch, or ``None`` if more data is needed.

        Raises:
            RecordBatchError: the stream holds a malformed batch.
        """
        if self._error is not None:
            raise self._error
        buf = self._buf
        if len(buf) < BATCH_OVERHEAD:
            if len(buf) >= LOG_OVERHEAD:
                # Refuse an impossible length before waiting for the rest of the header.
                size = int.from_bytes(buf[8:12], "big", signed=True) + LOG_OVERHEAD
                if size < BATCH_OVERHEAD or size > self._max:
                    self._fail(
                        BatchLengthError(
                            f"batch length field says {size:,} bytes; allowed "
                            f"{BATCH_OVERHEAD}..{self._max:,}"
                        )
                    )
            return None
        try:
            h = parse_header(buf, 0, max_batch_bytes=self._max)
            if len(buf) < h.size:
                return None
            check_batch(buf, 0, max_batch_bytes=self._max)
        except RecordBatchError as exc:
            self._fail(exc)
        out = bytes(buf[: h.size])
        del buf[: h.size]
        return out

    def _fail(self, exc: RecordBatchError) -> NoReturn:
        self._error = exc
        raise exc
