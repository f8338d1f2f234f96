"""Building record batches: append records, close, get bytes (pure, no I/O).

The producer side of the format described in :mod:`tidewire.records.batch`. Each record is
encoded as soon as it is appended (so :attr:`BatchBuilder.size_in_bytes` is exact for
uncompressed batches), and :meth:`BatchBuilder.build` compresses the records section once,
writes the header and computes the CRC-32C.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tidewire.records import varint
from tidewire.records.batch import BATCH_OVERHEAD, TimestampType, seal_batch
from tidewire.records.compression import Codec, check_codec, compress

__all__ = ["VARINTS", "BatchBuilder", "Header", "OpenRecords", "append_record", "build_batch"]

#: A record header: a UTF-8 key and a value that may be null.
Header = tuple[str, bytes | None]

_enc = varint.encode
_NULL = _enc(-1)
_ZERO = _enc(0)
_ATTRS = b"\x00"  # record attributes: unused, always 0
#: Varint encodings of 0 .. 16,383 (the lengths, offset deltas and time deltas of nearly
#: every record), looked up instead of computed; shared with the producer's accumulator.
VARINTS: list[bytes] = [_enc(i) for i in range(1 << 14)]
_VARINTS_LIMIT = len(VARINTS)
_join = b"".join


def _encode_bytes(data: bytes | None) -> bytes:
    return _NULL if data is None else _enc(len(data)) + data


def _encode_headers(headers: Sequence[Header]) -> bytes:
    """The headers part of a record: a count, then each key and value (the compiled builder
    calls this too, so both fail alike on a malformed header)."""
    hparts = [_enc(len(headers))]
    for hk, hv in headers:
        kb = hk.encode()
        hparts.append(_enc(len(kb)))
        hparts.append(kb)
        hparts.append(_encode_bytes(hv))
    return b"".join(hparts)


def append_record(  # noqa: PLR0917 (the producer's hot path: positional arguments cost least)
    buf: bytearray | list[bytes],
    value: bytes | None,
    key: bytes | None,
    headers: bytes,
    timestamp_delta: int,
    offset_delta: int,
) -> int:
    """Append one record (its length prefix, then attributes, deltas, key, value and the
    already encoded ``headers`` part) to ``buf``, the records section of a batch being built;
    returns the bytes appended. The producer's accumulator writes each record here as it is
    sent, so that building the batch is writing its header in place.

    ``buf`` is a bytearray (the compiled twin writes straight into it), or, in this pure
    twin, may be a list of byte strings that the record's parts are added to, joined once
    when the batch is built: in Python that costs a third of growing a bytearray (the
    accumulator's choice: :data:`tidewire.records._impl.RECORDS_AS_PARTS`).

    Raises:
        ValueError: a delta does not fit in a signed 64-bit varint.
    """
    table, limit = VARINTS, _VARINTS_LIMIT
    tsd = table[timestamp_delta] if 0 <= timestamp_delta < limit else _enc(timestamp_delta)
    od = table[offset_delta] if 0 <= offset_delta < limit else _enc(offset_delta)
    if value is None:
        vlen, value = _NULL, b""
    else:
        n = len(value)
        vlen = table[n] if n < limit else _enc(n)
    if key is None:
        klen, key = _NULL, b""
    else:
        n = len(key)
        klen = table[n] if n < limit else _enc(n)
    body = 1 + len(tsd) + len(od) + len(klen) + len(key) + len(vlen) + len(value) + len(headers)
    lenv = table[body] if body < limit else _enc(body)
    parts = (lenv, _ATTRS, tsd, od, klen, key, vlen, value, headers)
    if isinstance(buf, list):
        buf += parts
    else:
        buf += _join(parts)
    return body + len(lenv)


class OpenRecords:
    """The records of a batch being built by :func:`append_record`, and what a producer counts
    of them: a base class for the producer's batches (the compiled twin keeps these in C
    fields, which its one-call append reads and writes without attribute look-ups).

    Attributes:
        buf: the header's room then the records (a bytearray; the pure producer's parts list).
        size: the batch's bytes so far, header included.
        count: its records so far.
        first_ts, max_ts: the first record's timestamp (the deltas' base) and the largest
            (ms; -1 before the first record).
    """

    __slots__ = ("buf", "count", "first_ts", "max_ts", "size")

    buf: bytearray | list[bytes]
    size: int
    count: int
    first_ts: int
    max_ts: int


class BatchBuilder:
    """Accumulates records and produces one RecordBatch v2.

    Args:
        codec: compression of the records section.
        producer_id: idempotent producer id, -1 for none.
        producer_epoch: producer epoch, -1 for none.
        base_sequence: sequence number of the first record, -1 for none.
        partition_leader_epoch: stored as given; the broker does not interpret it yet.
        timestamp_type: :class:`TimestampType` value written into attribute bit 3.
        base_offset: written into the header; the broker overwrites it on append.
    """

    __slots__ = (
        "_base_offset",
        "_closed",
        "_codec",
        "_first_ts",
        "_leader_epoch",
        "_max_ts",
        "_parts",
        "_producer_epoch",
        "_producer_id",
        "_sequence",
        "_size",
        "_timestamp_type",
    )

    def __init__(
        self,
        *,
        codec: Codec = Codec.NONE,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        partition_leader_epoch: int = -1,
        timestamp_type: int = TimestampType.CREATE_TIME,
        base_offset: int = 0,
    ) -> None:
        self._codec = check_codec(codec)
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._sequence = base_sequence
        self._leader_epoch = partition_leader_epoch
        self._timestamp_type = timestamp_type
        self._base_offset = base_offset
        self._parts: list[bytes] = []
        self._first_ts: int | None = None
        self._max_ts = -1
        self._size = BATCH_OVERHEAD
        self._closed = False

    def __len__(self) -> int:
        """Number of records appended so far."""
        return len(self._parts)

    @property
    def size_in_bytes(self) -> int:
        """Size of the batch so far, before compression (exact for ``Codec.NONE``)."""
        return self._size

    def append(
        self,
        value: bytes | None,
        *,
        timestamp_ms: int,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
    ) -> int:
        """Append one record.

        Args:
            value: the payload, or ``None`` for a null value (a tombstone).
            timestamp_ms: the record's create time in ms since the epoch.
            key: optional key.
            headers: ``(key, value)`` pairs; keys are UTF-8 text.

        Returns:
            The record's offset delta within the batch.

        Raises:
            RuntimeError: the batch was already built.
        """
        if self._closed:
            raise RuntimeError("append() after build(): start a new BatchBuilder")
        first = self._first_ts
        if first is None:
            first = self._first_ts = self._max_ts = timestamp_ms
        elif timestamp_ms > self._max_ts:
            self._max_ts = timestamp_ms
        delta = len(self._parts)
        hbytes = _encode_headers(headers) if headers else _ZERO
        body = b"".join(
            (
                b"\x00",  # record attributes: unused, always 0
                _enc(timestamp_ms - first),
                _enc(delta),
                _encode_bytes(key),
                _encode_bytes(value),
                hbytes,
            )
        )
        record = _enc(len(body)) + body
        self._parts.append(record)
        self._size += len(record)
        return delta

    def build(self) -> bytes:
        """Close the batch and return its bytes (header, compressed records, CRC)."""
        self._closed = True
        count = len(self._parts)
        section = b"".join(self._parts)
        if self._codec is not Codec.NONE:
            section = compress(self._codec, section)
        return seal_batch(
            section,
            codec=self._codec,
            count=count,
            first_timestamp=self._first_ts if self._first_ts is not None else -1,
            max_timestamp=self._max_ts if count else -1,
            producer_id=self._producer_id,
            producer_epoch=self._producer_epoch,
            base_sequence=self._sequence,
            timestamp_type=self._timestamp_type,
            base_offset=self._base_offset,
            partition_leader_epoch=self._leader_epoch,
        )


def build_batch(
    values: Iterable[bytes | None],
    *,
    timestamp_ms: int,
    codec: Codec = Codec.NONE,
    key: bytes | None = None,
) -> bytes:
    """Build a batch of ``values`` sharing one timestamp and key: a convenience for tests,
    benchmarks and tools."""
    b = BatchBuilder(codec=codec)
    for v in values:
        b.append(v, timestamp_ms=timestamp_ms, key=key)
    return b.build()
