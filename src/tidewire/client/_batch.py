"""Records a batch at a time: :class:`ConsumedBatch`, what ``poll_batch`` of
:class:`~tidewire.client.AsyncConsumer` and :class:`~tidewire.client.Consumer` returns.

A consumed batch holds its records as columns (one list per field, per run of records of
one partition), read from the fetched record batches by :func:`tidewire.records.read_spans`:
the records are checked when the batch is handed out, and each column's objects are made
when it is first read (no object per record unless one is asked for, by a column or by
iterating). Its columns feed Arrow (:meth:`ConsumedBatch.to_arrow`) without a Python loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

from tidewire.records import BatchHeader, Columns, Spans
from tidewire.records._impl import binary_columns, int64_columns
from tidewire.records.batch import TimestampType

from ._arrow import arrays_to_arrow, arrow_schema, pyarrow_module

if TYPE_CHECKING:
    import pyarrow as pa

    from ._consumer import ConsumerRecord

__all__ = ["ConsumedBatch", "Segment"]

Header = tuple[str, bytes | None]


#: One stored batch's records in a segment: their columns, or their spans (made into
#: columns when one is asked for).
Part = Columns | Spans


class Segment:
    """A run of records of one partition, in offset order, as columns of equal length.

    The records of a stored batch come as :class:`~tidewire.records.Spans` (checked when
    the batch was handed out): a column's objects (each offset's int, each value's bytes)
    are made the first time it is read, once, for all the segment's batches. A reader that
    only counts records, or only reads values, makes nothing else.
    """

    __slots__ = ("_made", "_parts", "_size", "append_time", "partition", "timestamp_type", "topic")

    def __init__(  # noqa: PLR0917 (the columns, as the fields they were)
        self,
        topic: str,
        partition: int,
        offsets: list[int],
        timestamps: list[int],
        keys: list[bytes | None],
        values: list[bytes | None],
        headers: list[tuple[Header, ...]],
        timestamp_type: int = 0,
        append_time: int = -1,
    ) -> None:
        self.topic = topic
        self.partition = partition
        #: ``TimestampType`` of the stored batches (0: create time, 1: log append time).
        self.timestamp_type = timestamp_type
        #: With log append time: the batch's max timestamp, every record's time in Arrow.
        self.append_time = append_time
        self._parts: list[Part] = []
        self._made: list[list[Any] | None] = [offsets, timestamps, keys, values, headers]
        self._size = len(offsets)

    @classmethod
    def of_part(
        cls, topic: str, partition: int, part: Part, timestamp_type: int = 0, append_time: int = -1
    ) -> Segment:
        """A segment of one stored batch's records (columns or spans)."""
        s = cls(topic, partition, [], [], [], [], [], timestamp_type, append_time)
        s.extend(part)
        return s

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"Segment({self.topic}/{self.partition}: {self._size} records)"

    @property
    def last_offset(self) -> int:
        """The offset of the last record (-1 when there is none)."""
        if self._parts:
            last = self._parts[-1]
            return last[0][-1] if isinstance(last, tuple) else last.last_offset
        offsets = self._made[0]
        return offsets[-1] if offsets else -1

    def extend(self, part: Part) -> None:
        """Append the records of another stored batch of the same partition (its columns
        or its spans)."""
        n = len(part[0]) if isinstance(part, tuple) else len(part)
        if not n:
            return
        made = self._made
        if self._size and not self._parts:
            # Only columns so far: they become the first part.
            self._parts.append((made[0], made[1], made[2], made[3], made[4]))  # type: ignore[arg-type]
        self._parts.append(part)
        self._made = [None] * 5
        self._size += n

    def _column(self, index: int) -> list[Any]:
        got = self._made[index]
        if got is None:
            got = []
            for part in self._parts:
                if isinstance(part, tuple):
                    got += part[index]
                elif len(self._parts) == 1:
                    got = part.column(index)
                else:
                    got += part.column(index)
            self._made[index] = got
        return got

    def to_arrow(self, include_headers: bool = False) -> pa.RecordBatch:
        """The records as one ``pyarrow.RecordBatch`` (see :meth:`ConsumedBatch.to_arrow`):
        the spans' offsets, timestamps, keys and values go into Arrow's buffers straight
        from the fetched data, without an object a record (columns already made, or parts
        that are columns, are converted from their lists)."""
        pa = pyarrow_module()
        chunks: list[list[Any]] = [[], [], [], []]
        parts: list[Part] = self._parts or [(*self._made,)]  # type: ignore[list-item]
        run: list[Spans] = []  # consecutive spans: one buffer a column for all of them
        for part in parts:
            if not isinstance(part, tuple):
                run.append(part)
                continue
            _spans_to_arrow(pa, run, chunks)
            run = []
            chunks[0].append(pa.array(part[0], pa.int64()))
            chunks[1].append(pa.array(part[1], pa.int64()))
            chunks[2].append(pa.array(part[2], pa.binary()))
            chunks[3].append(pa.array(part[3], pa.binary()))
        _spans_to_arrow(pa, run, chunks)
        offsets_a, timestamps_a, keys_a, values_a = (
            c[0] if len(c) == 1 else pa.concat_arrays(c) for c in chunks
        )
        if self.append_time >= 0:
            timestamps_a = pa.repeat(pa.scalar(self.append_time, pa.int64()), self._size)
        return arrays_to_arrow(
            self.topic,
            self.partition,
            self.timestamp_type,
            offsets_a,
            timestamps_a,
            keys_a,
            values_a,
            self.headers if include_headers else None,
        )

    @property
    def offsets(self) -> list[int]:
        """Each record's offset."""
        return self._column(0)

    @property
    def timestamps(self) -> list[int]:
        """Each record's timestamp (ms since the epoch)."""
        return self._column(1)

    @property
    def keys(self) -> list[bytes | None]:
        """Each record's key."""
        return self._column(2)

    @property
    def values(self) -> list[bytes | None]:
        """Each record's value."""
        return self._column(3)

    @property
    def headers(self) -> list[tuple[Header, ...]]:
        """Each record's headers."""
        return self._column(4)


def _spans_to_arrow(pa: Any, spans: list[Spans], chunks: list[list[Any]]) -> None:
    """Append the offsets, timestamps (ms), keys and values of ``spans`` (one after the
    other) to ``chunks`` as one Arrow array each, built on buffers filled from the fetched
    data."""
    if not spans:
        return
    n = sum(len(s) for s in spans)
    for i in (0, 1):
        data = pa.py_buffer(int64_columns(spans, i))
        chunks[i].append(pa.Array.from_buffers(pa.int64(), n, [None, data]))
    for i in (2, 3):
        validity, offsets, data, nulls = binary_columns(spans, i)
        buffers = [
            None if validity is None else pa.py_buffer(validity),
            pa.py_buffer(offsets),
            pa.py_buffer(data),
        ]
        chunks[i].append(pa.Array.from_buffers(pa.binary(), n, buffers, null_count=nulls))


def segment_of(topic: str, partition: int, h: BatchHeader, part: Part) -> Segment:
    """A segment of one stored batch's records (columns or spans)."""
    log_append = h.timestamp_type == TimestampType.LOG_APPEND_TIME
    return Segment.of_part(
        topic,
        partition,
        part,
        timestamp_type=int(h.timestamp_type),
        append_time=h.max_timestamp if log_append else -1,
    )


def segment_of_records(records: Sequence[ConsumerRecord]) -> list[Segment]:
    """Records already made (one partition after another) as segments."""
    out: list[Segment] = []
    for r in records:
        if not out or out[-1].partition != r.partition or out[-1].topic != r.topic:
            out.append(Segment(r.topic, r.partition, [], [], [], [], []))
        s = out[-1]
        s.offsets.append(r.offset)
        s.timestamps.append(r.timestamp)
        s.keys.append(r.key)
        s.values.append(r.value)
        s.headers.append(r.headers)
        s._size += 1
    return out


class ConsumedBatch:
    """The records one ``poll_batch`` handed out, as columns.

    ``len(batch)`` is the record count; iterating yields :class:`ConsumerRecord` objects in
    the order ``poll`` would have handed them out (partition by partition, offsets
    ascending); the columns :attr:`offsets`, :attr:`timestamps`, :attr:`keys`,
    :attr:`values`, :attr:`headers`, :attr:`topics` and :attr:`partitions` are lists of one
    entry per record, in the same order. :meth:`to_arrow` converts it all to a
    ``pyarrow.RecordBatch``. A batch is a snapshot: handing it out moved the consumer's
    positions past its records, as ``poll`` does.
    """

    __slots__ = ("_cache", "_segments", "_size")

    def __init__(self, segments: list[Segment]) -> None:
        self._segments = [s for s in segments if len(s)]
        self._size = sum(len(s) for s in self._segments)
        self._cache: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.topic}/{s.partition}: {len(s)}" for s in self._segments)
        return f"ConsumedBatch({self._size} records; {parts})"

    def __iter__(self) -> Iterator[ConsumerRecord]:
        from ._consumer import ConsumerRecord  # noqa: PLC0415 (the module imports this one)

        new = tuple.__new__
        for s in self._segments:
            topic, partition = s.topic, s.partition
            for offset, ts, key, value, headers in zip(
                s.offsets, s.timestamps, s.keys, s.values, s.headers, strict=True
            ):
                yield new(ConsumerRecord, (topic, partition, offset, ts, key, value, headers))

    @property
    def segments(self) -> list[Segment]:
        """The runs of records of one partition each, in order (the columns are theirs,
        concatenated)."""
        return list(self._segments)

    def _column(self, name: str) -> list[Any]:
        got = self._cache.get(name)
        if got is None:
            segments = self._segments
            if len(segments) == 1:
                got = list(getattr(segments[0], name))
            else:
                got = list(chain.from_iterable(getattr(s, name) for s in segments))
            self._cache[name] = got
        return got

    @property
    def offsets(self) -> list[int]:
        """Each record's offset."""
        return self._column("offsets")

    @property
    def timestamps(self) -> list[int]:
        """Each record's timestamp (ms since the epoch), as ``ConsumerRecord.timestamp``."""
        return self._column("timestamps")

    @property
    def keys(self) -> list[bytes | None]:
        """Each record's key."""
        return self._column("keys")

    @property
    def values(self) -> list[bytes | None]:
        """Each record's value."""
        return self._column("values")

    @property
    def headers(self) -> list[tuple[Header, ...]]:
        """Each record's headers, ``(key, value)`` pairs."""
        return self._column("headers")

    @property
    def topics(self) -> list[str]:
        """Each record's topic."""
        got = self._cache.get("topics")
        if got is None:
            got = self._cache["topics"] = [s.topic for s in self._segments for _ in s.offsets]
        return got

    @property
    def partitions(self) -> list[int]:
        """Each record's partition."""
        got = self._cache.get("partitions")
        if got is None:
            got = self._cache["partitions"] = [
                s.partition for s in self._segments for _ in s.offsets
            ]
        return got

    def to_arrow(self, *, include_headers: bool = False) -> pa.RecordBatch:
        """The records as one ``pyarrow.RecordBatch`` with the columns of Spark's Kafka
        source (and of tidewire's Spark source): ``key``, ``value`` (binary), ``topic``
        (string), ``partition`` (int32), ``offset`` (int64), ``timestamp``
        (``timestamp[us, UTC]``), ``timestampType`` (int32: 0 create time, 1 log append
        time, when every record's time is its batch's), and with ``include_headers`` a
        ``headers`` column (``list<struct<key: string, value: binary>>``).

        Raises:
            ImportError: pyarrow is not installed (``pip install 'tidewire[spark]'``).
        """
        pa = pyarrow_module()
        batches = [s.to_arrow(include_headers) for s in self._segments]
        if len(batches) == 1:
            return batches[0]
        schema = arrow_schema(include_headers)
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=schema)
        table = pa.Table.from_batches(batches, schema=schema).combine_chunks()
        return table.to_batches()[0]
