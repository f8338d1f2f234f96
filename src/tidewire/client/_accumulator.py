"""The producer's accumulator: records appended into one open batch per partition, within a
bounded amount of memory, and the per-partition queues of batches that the sender drains
into produce requests. No I/O; thread-safe (the blocking producer appends from its callers'
threads while the sender drains on the event loop's thread).

A record is encoded when it is appended, straight into its batch's growing buffer after room
for the header, which is written in place when the batch is built (the pure-Python codec keeps
the record's parts by reference instead, joined once then), so ``send`` costs no
per-message task, coroutine or future: one future per *batch* is resolved when the broker
answers, and each message's future reads its offset from the batch's base offset and its
index in the batch. With the compiled codec, a message without headers into an open batch
with room skips :meth:`Accumulator.append` altogether: ``records._speedups.append_routed``
does the routing, checks and writes in one call (the producer's ``send``), on the batch's C fields
(``records.OpenRecords``); and an answered batch's buffer is reused by a later batch
(``POOLED_BUFFERS``), its pages already touched.

Ordering. The sender takes batches from the head of a partition's queue only. A batch that
failed with a retriable error goes back to the front of its queue, in its original order
among the other batches being retried, and the partition is *held*: nothing more is sent to
it until every batch of it still in flight has been answered. The broker handles the
requests of one connection in parallel, but the *first* partition of each request is
appended in the order the requests arrived (the rest only after the first one's append has
completed), so a partition with batches in flight may only be the first entry of another
request, and a partition that is a later entry of a request has nothing else in flight.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from tidewire.errors import BatchTooLargeError
from tidewire.records import _impl, varint
from tidewire.records._impl import RECORDS_AS_PARTS, append_record, recycle_buffer
from tidewire.records.batch import BATCH_OVERHEAD, seal_batch, seal_batch_in_place
from tidewire.records.builder import VARINTS
from tidewire.records.compression import Codec, compress

__all__ = [
    "ROLLED",
    "SEQUENCE_WRAP",
    "Accumulator",
    "BlockingRecordFuture",
    "PartitionState",
    "ProducerBatch",
    "RecordFuture",
    "RecordMetadata",
]

#: Producer sequences count modulo 2**31: after 2,147,483,647 comes 0.
SEQUENCE_WRAP = 2**31
#: Varint encodings of 0 .. 16,383, the lengths, offset deltas and time deltas of nearly every
#: record, looked up instead of computed (records.builder's table), and their sizes.
_VARINT = VARINTS
_VARINT_LIMIT = len(_VARINT)
_VSIZE = [len(v) for v in _VARINT]
_NULL = varint.encode(-1)
_ZERO = _VARINT[0]
#: How every batch's buffer starts: room for its header, written in place when it is built.
_HEADER_ROOM = bytes(BATCH_OVERHEAD)
#: Joins a batch's parts (the pure codec's records) into one new bytearray.
_join_mutable = bytearray().join
#: What :meth:`Accumulator.append` returns when it closed a full batch without opening another.
ROLLED = -2
#: Buffers of answered batches kept for new ones (their pages already faulted in): enough for
#: a steady stream, where a batch is answered about as often as one opens; at most this many
#: batches' worth of memory (4 MiB at the default ``batch_bytes``) held while idle, pooled or
#: waiting to be (8 measured no better).
POOLED_BUFFERS = 4


def _v(n: int) -> bytes:
    return _VARINT[n] if 0 <= n < _VARINT_LIMIT else varint.encode(n)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a message was stored.

    Attributes:
        topic, partition: where it went.
        offset: its offset; -1 when the broker gave none: with ``acks="none"``, or when an
            idempotent retry found the batch stored long ago (``DuplicateSequenceError``).
        timestamp: its timestamp (ms since the epoch), as sent.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int


BatchFuture = asyncio.Future[int] | concurrent.futures.Future[int]


class PartitionState:
    """One partition's queue of batches and what is in flight to it (owned by the
    :class:`Accumulator`, changed only under its lock)."""

    __slots__ = (
        "acked_sequence",
        "held",
        "in_flight",
        "in_flight_tail",
        "next_batch_no",
        "next_sequence",
        "open",
        "partition",
        "queue",
        "retrying",
        "skip",
        "skipped",
        "stored",
        "topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        #: Batches not in flight, oldest first; the last one may be ``open``.
        self.queue: deque[ProducerBatch] = deque()
        self.open: ProducerBatch | None = None
        #: Batches sent and not answered; of those, sent as a later entry of their request.
        self.in_flight = 0
        #: The last drain held the open batch for an answer (``pipeline_partial``).
        self.held = False
        self.in_flight_tail = 0
        #: Batches waiting to be sent again (at the front of ``queue``).
        self.retrying = 0
        self.next_batch_no = 0
        #: Idempotence: the next batch's base sequence, and the sequence after the last batch
        #: the broker acknowledged (what it expects next, as far as this producer knows).
        self.next_sequence = 0
        self.acked_sequence = 0
        #: A writer (``writer_id``): how many of its first records here the broker holds
        #: already, how many of those were sent to it again and skipped, and a batch whose
        #: future answers offset -1 for them (None until the broker was asked).
        self.skip = 0
        self.skipped = 0
        self.stored: ProducerBatch | None = None

    def __repr__(self) -> str:
        return f"PartitionState({self.topic!r}, {self.partition})"


if TYPE_CHECKING:
    from tidewire.records.builder import OpenRecords as _OpenRecords
else:  # the compiled twin's C fields where it is built (records._speedups.append_routed)
    _OpenRecords = _impl.OpenRecords


class ProducerBatch(_OpenRecords):
    """The records of one batch for one partition, its future, and its sending state
    (``buf``, ``size``, ``count``, ``first_ts`` and ``max_ts``: see
    :class:`~tidewire.records.builder.OpenRecords`)."""

    __slots__ = (
        "attempts",
        "base_sequence",
        "created",
        "data",
        "future",
        "no",
        "retry_at",
        "state",
        "tail",
    )

    def __init__(
        self,
        state: PartitionState,
        future: BatchFuture,
        now: float,
        buf: bytearray | None = None,
    ) -> None:
        self.state = state
        self.future = future
        self.created = now
        self.no = state.next_batch_no
        state.next_batch_no += 1
        #: Room for the header, then the encoded records (see records.builder.append_record):
        #: the batch once its header is in.
        #: A recycled buffer (``buf``: header room, pages already touched) where there is one.
        self.buf: bytearray | list[bytes] = (
            buf
            if buf is not None
            else [_HEADER_ROOM]
            if RECORDS_AS_PARTS
            else bytearray(_HEADER_ROOM)
        )
        self.count = 0
        self.size = BATCH_OVERHEAD
        self.first_ts = -1
        self.max_ts = -1
        self.data: bytes | bytearray | None = None  # built at its first send, then sent as it is
        self.base_sequence = -1
        self.attempts = 0
        self.retry_at = 0.0
        self.tail = False  # in flight as a later entry of its request

    @property
    def sent(self) -> bool:
        """Whether it was sent at least once (its bytes, and sequences, are fixed)."""
        return self.data is not None

    def build(self, codec: Codec, producer_id: int, producer_epoch: int) -> bytes | bytearray:
        """Encode the batch (once): header, compressed records, CRC-32C. Uncompressed, the
        header is written in place into the buffer the records were appended to (no copy; the
        pure codec's parts are joined first)."""
        if self.data is not None:
            return self.data
        idempotent = self.base_sequence >= 0
        pid = producer_id if idempotent else -1
        epoch = producer_epoch if idempotent else -1
        header = {
            "codec": codec,
            "count": self.count,
            "first_timestamp": self.first_ts,
            "max_timestamp": self.max_ts,
            "producer_id": pid,
            "producer_epoch": epoch,
            "base_sequence": self.base_sequence,
        }
        buf = self.buf
        if buf.__class__ is list:
            buf = _join_mutable(buf)
        assert isinstance(buf, bytearray)
        if codec is Codec.NONE:
            self.data = seal_batch_in_place(buf, **header)
        else:
            section = buf[BATCH_OVERHEAD:]  # no header room in what is compressed
            self.data = seal_batch(compress(codec, section), **header)
        self.buf = []  # the bytes are all that is sent from now on
        return self.data

    def __repr__(self) -> str:
        s = self.state
        return f"ProducerBatch({s.topic!r}, {s.partition}, no={self.no}, records={self.count})"


def _metadata(batch: ProducerBatch, index: int, timestamp: int, base: int) -> RecordMetadata:
    s = batch.state
    return RecordMetadata(s.topic, s.partition, base + index if base >= 0 else -1, timestamp)


class RecordFuture(tuple[ProducerBatch, int, int]):
    """The outcome of one :meth:`AsyncProducer.send`: ``await`` it for the
    :class:`RecordMetadata`, or for the error that failed its batch.

    One future per *batch* is resolved when the broker answers; a message's future is its
    batch, its index in the batch and its timestamp, read when asked for. It is a tuple (the
    cheapest object Python makes: ``send`` makes one per message); treat it as opaque.
    """

    __slots__ = ()

    def __new__(cls, batch: ProducerBatch, index: int, timestamp: int) -> Self:
        return tuple.__new__(cls, (batch, index, timestamp))

    def __repr__(self) -> str:
        return f"RecordFuture({self[0]!r}, index={self[1]}, done={self.done()})"

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        batch, index, timestamp = self
        fut = batch.future
        assert isinstance(fut, asyncio.Future)
        base = yield from fut.__await__()
        return _metadata(batch, index, timestamp, base)

    def done(self) -> bool:
        return self[0].future.done()

    def result(self) -> RecordMetadata:
        """The metadata, once done (raises the batch's error; ``InvalidStateError`` before)."""
        batch, index, timestamp = self
        return _metadata(batch, index, timestamp, batch.future.result())

    def exception(self) -> BaseException | None:
        """The batch's error once done, or None."""
        return self[0].future.exception()

    def add_done_callback(self, fn: Callable[[RecordFuture], object]) -> None:
        """Call ``fn(self)`` once the batch is answered (on the producer's event loop)."""
        self[0].future.add_done_callback(lambda _: fn(self))


class BlockingRecordFuture(tuple[ProducerBatch, int, int]):
    """The outcome of one :meth:`Producer.send`, like a ``concurrent.futures.Future``:
    :meth:`result` blocks until the batch is answered. A tuple, as :class:`RecordFuture`."""

    __slots__ = ()

    def __new__(cls, batch: ProducerBatch, index: int, timestamp: int) -> Self:
        return tuple.__new__(cls, (batch, index, timestamp))

    def __repr__(self) -> str:
        return f"BlockingRecordFuture({self[0]!r}, index={self[1]}, done={self.done()})"

    def done(self) -> bool:
        return self[0].future.done()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (None: for ever) for the metadata.

        Raises:
            TimeoutError: not answered in time.
            TidewireError: the error that failed the message's batch.
        """
        batch, index, timestamp = self
        fut = batch.future
        assert isinstance(fut, concurrent.futures.Future)
        return _metadata(batch, index, timestamp, fut.result(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        fut = self[0].future
        assert isinstance(fut, concurrent.futures.Future)
        return fut.exception(timeout)

    def add_done_callback(self, fn: Callable[[BlockingRecordFuture], object]) -> None:
        """Call ``fn(self)`` once the batch is answered (on the producer's thread)."""
        self[0].future.add_done_callback(lambda _: fn(self))


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """The headers part of a record: a count, then each key and value.

    Raises:
        TypeError: a header that is not a ``(str, bytes | None)`` pair.
    """
    out = [_v(len(headers))]
    for item in headers:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"a header must be a (str, bytes | None) pair, not {item!r}")
        hk, hv = item
        if not isinstance(hk, str):
            raise TypeError(f"a header key must be str, not {type(hk).__name__}")
        kb = hk.encode()
        out.append(_v(len(kb)))
        out.append(kb)
        if hv is None:
            out.append(_NULL)
        elif isinstance(hv, bytes | bytearray | memoryview):
            out.append(_v(len(hv)))
            out.append(bytes(hv))
        else:
            raise TypeError(f"header {hk!r}: value must be bytes or None, not {type(hv).__name__}")
    return b"".join(out)


class Accumulator:
    """Open batches per partition, bounded memory, and what the sender drains.

    Args:
        batch_bytes: a batch is closed once the next record would take it past this size
            (a single larger record gets a batch of its own).
        buffer_bytes: the most memory (encoded record bytes) held for unanswered records.
        linger_s: how long an open batch waits for more records before it may be sent.
        new_future: makes a batch's future (asyncio or concurrent).
        wake: tells the sender there is something new to look at.
        on_release: called after memory was released (buffer waiters may go on).
        clock: monotonic seconds.
        threadsafe: records are appended from several threads (the blocking producer);
            ``False``: only from the thread that drains (the asyncio producer), so
            :meth:`append` need not take the lock.
        by_size: batches are cut by size alone (a writer's): an open batch waits until it
            is full or flushed, whatever ``linger_s``, and its delivery timeout counts from
            its first send.
    """

    # Slots: the producer's compiled path reads and writes some of these once per message.
    __slots__ = (
        "_append_lock",
        "_clock",
        "_new_future",
        "_on_release",
        "_pool",
        "_spent",
        "_wake",
        "batch_bytes",
        "buffer_bytes",
        "by_size",
        "flushing",
        "in_flight",
        "linger_s",
        "lock",
        "partitions",
        "queued",
        "used",
    )

    def __init__(
        self,
        *,
        batch_bytes: int,
        buffer_bytes: int,
        linger_s: float,
        new_future: Callable[[], BatchFuture],
        wake: Callable[[], None],
        on_release: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        threadsafe: bool = True,
        by_size: bool = False,
    ) -> None:
        self.by_size = by_size
        self.batch_bytes = batch_bytes
        self.buffer_bytes = buffer_bytes
        self.linger_s = linger_s
        self._new_future = new_future
        self._wake = wake
        self._on_release = on_release
        self._clock = clock
        self.lock = threading.Lock()
        self._append_lock = self.lock if threadsafe else None
        self.used = 0
        self.partitions: dict[tuple[str, int], PartitionState] = {}
        #: Partitions with batches in their queue (an ordered set).
        self.queued: dict[PartitionState, None] = {}
        self.in_flight = 0
        #: Everything counts as ready (flush, close).
        self.flushing = 0
        #: Buffers of answered batches, reused by the next batches (see POOLED_BUFFERS), and
        #: answered batches whose buffers may join them.
        self._pool: list[bytearray] = []
        self._spent: list[ProducerBatch] = []

    def partition(self, topic: str, partition: int) -> PartitionState:
        """The state of one partition (made on first use)."""
        key = (topic, partition)
        state = self.partitions.get(key)
        if state is None:
            with self.lock:
                state = self.partitions.setdefault(key, PartitionState(topic, partition))
        return state

    # --- the callers' side ------------------------------------------------------------------

    def append(  # noqa: PLR0917 (the hot path: positional arguments cost least)
        self,
        state: PartitionState,
        value: bytes | None,
        key: bytes | None,
        headers: bytes,
        timestamp: int,
        limit: int,
        roll: bool = True,
    ) -> tuple[ProducerBatch, int] | int:
        """Append one record to ``state``'s open batch (opening one when needed).

        Args:
            headers: the encoded headers part (:func:`encode_headers`, or one zero byte).
            limit: the largest batch the topic accepts (bytes, before compression).
            roll: when the open batch is full, open the next one here; ``False``: close it
                and return :data:`ROLLED` (unkeyed messages then move to another partition).

        Returns:
            ``(batch, index)``; or, when the buffer has no room, the bytes the record needs
            (a positive int); or ``ROLLED``.

        Raises:
            BatchTooLargeError: the record alone exceeds ``limit`` or the whole buffer.
        """
        # Every line here runs once per message: plain comparisons and table look-ups
        # instead of helper calls, min() or max(), and the lock taken only where another
        # thread may append too.
        # The record's size but for its deltas and length prefix (at most 15 more bytes).
        if value is None:
            payload = 2 + len(headers)  # attributes, null value
        else:
            n = len(value)
            payload = 1 + (_VSIZE[n] if n < _VARINT_LIMIT else varint.size(n)) + n + len(headers)
        if key is None:
            payload += 1
        else:
            n = len(key)
            payload += (_VSIZE[n] if n < _VARINT_LIMIT else varint.size(n)) + n
        need = payload + 16
        if need + BATCH_OVERHEAD > limit or need > self.buffer_bytes:
            raise self._too_large(need, limit)
        lock = self._append_lock
        if lock is not None:
            lock.acquire()
        opened = False
        try:
            if self.used + need > self.buffer_bytes:
                return need
            batch = state.open
            if batch is None or (
                batch.count and (batch.size + need > self.batch_bytes or batch.size + need > limit)
            ):
                if batch is not None:
                    state.open = None  # closed: full
                    if not roll:
                        opened = True  # the closed batch is ready: wake the sender
                        return ROLLED
                batch = self._open(state, timestamp)
                opened = True
            index = batch.count
            # Encoded straight into the batch's buffer (compiled: one call, no parts).
            size = append_record(batch.buf, value, key, headers, timestamp - batch.first_ts, index)
            batch.size += size
            self.used += size
            batch.count = index + 1
            if timestamp > batch.max_ts:  # noqa: PLR1730 (max() costs a call per message)
                batch.max_ts = timestamp
        finally:
            if lock is not None:
                lock.release()
            if opened:
                self._wake()
        return batch, index

    def append_values(  # noqa: PLR0917 (the hot path: positional arguments cost least)
        self,
        state: PartitionState,
        values: Sequence[bytes | None],
        start: int,
        end: int,
        timestamp: int,
        limit: int,
    ) -> int:
        """Append ``values[start:end]`` to ``state`` as records without key or headers, all
        stamped ``timestamp``, opening batches as they fill (the rule of :meth:`append`).

        Returns:
            The index reached: ``end``, or less when the buffer has no room for the next.

        Raises:
            BatchTooLargeError: a value alone exceeds ``limit`` or the whole buffer.
        """
        lock = self._append_lock
        if lock is not None:
            lock.acquire()
        opened = False
        i = start
        # Locals instead of attribute look-ups: this loop runs once per record.
        room = self.buffer_bytes - self.used
        cut = min(self.batch_bytes, limit)
        most = limit - BATCH_OVERHEAD  # the largest record a batch of its own may hold
        sizes, table_len, append = _VSIZE, _VARINT_LIMIT, append_record
        batch = state.open
        try:
            buf: bytearray | list[bytes] = [] if batch is None else batch.buf
            size = 0 if batch is None else batch.size
            count = 0 if batch is None else batch.count
            delta = 0 if batch is None else timestamp - batch.first_ts
            while i < end:
                value = values[i]
                if value is None:
                    payload = 4  # attributes, null key, null value, no headers
                else:
                    n = len(value)
                    payload = 3 + (sizes[n] if n < table_len else varint.size(n)) + n
                need = payload + 16
                if need > room or need > most:
                    if need > most or need > self.buffer_bytes:
                        raise self._too_large(need, limit)
                    break  # no room in the buffer now
                if batch is None or (count and size + need > cut):
                    if batch is not None:
                        batch.size, batch.count = size, count
                        if timestamp > batch.max_ts:  # noqa: PLR1730 (not max(): see append)
                            batch.max_ts = timestamp
                        state.open = None  # closed: full
                    batch = self._open(state, timestamp)
                    buf, size, count, delta = batch.buf, batch.size, 0, 0
                    opened = True
                body = append(buf, value, None, _ZERO, delta, count)
                size += body
                room -= body
                count += 1
                i += 1
        finally:
            if batch is not None:  # what was appended is counted, even on an error
                batch.size, batch.count = size, count
                if count and timestamp > batch.max_ts:
                    batch.max_ts = timestamp
            self.used = self.buffer_bytes - room
            if lock is not None:
                lock.release()
            if opened:
                self._wake()
        return i

    def _open(self, state: PartitionState, timestamp: int) -> ProducerBatch:
        """Open a new batch for ``state`` (under the lock)."""
        pool = self._pool
        if not pool and self._spent:
            assert recycle_buffer is not None
            for spent in self._spent:  # each kept only if nothing else holds it
                recycle_buffer(pool, spent, POOLED_BUFFERS)
            self._spent.clear()
        batch = ProducerBatch(
            state, self._new_future(), self._clock(), pool.pop() if pool else None
        )
        batch.first_ts = batch.max_ts = timestamp
        state.queue.append(batch)
        state.open = batch
        self.queued[state] = None
        return batch

    def _too_large(self, need: int, limit: int) -> BatchTooLargeError:
        return BatchTooLargeError(
            f"a message of {need + BATCH_OVERHEAD:,} bytes (as a batch of its own) exceeds "
            + (
                f"the topic's max_message_bytes={limit:,}"
                if need + BATCH_OVERHEAD > limit
                else f"buffer_bytes={self.buffer_bytes:,}"
            )
        )

    # --- the sender's side -------------------------------------------------------------------

    def drain(
        self,
        now: float,
        *,
        max_request_bytes: int,
        max_in_flight_per_partition: int,
        max_requests: int,
        pipeline_partial: bool = False,
        sequences: bool,
        allow_new: bool,
        expire_before: float,
    ) -> tuple[list[list[ProducerBatch]], list[ProducerBatch], float | None]:
        """Take the batches that may be sent now, grouped into requests.

        Args:
            now: the clock's time.
            max_request_bytes: a request's data, unless one batch alone is larger.
            max_in_flight_per_partition: batches in flight per partition.
            pipeline_partial: send an open batch not yet full (its linger over) while a
                batch of its partition is in flight; else it is held (``state.held``)
                until the partition has none, or until it is full.
            max_requests: how many requests may start now.
            sequences: number each batch's records at its first send (idempotence).
            allow_new: send batches that were never sent (False while the producer waits to
                renew its epoch).
            expire_before: batches created before this time and not in flight are expired.

        Returns:
            ``(requests, expired, next_at)``: the requests' batches (in flight from now on);
            batches past their delivery timeout (taken out of their queues, still counted in
            memory: fail them with :meth:`finish`); and when something queued becomes ready
            (None: nothing to wait for but an answer or a new record).
        """
        requests: list[list[ProducerBatch]] = []
        expired: list[ProducerBatch] = []
        next_at: float | None = None
        linger = self.linger_s
        by_size = self.by_size
        lead: list[ProducerBatch] = []  # must be the first entry of a request
        rest: list[ProducerBatch] = []  # partitions with nothing in flight
        with self.lock:
            flushing = self.flushing > 0
            for state in list(self.queued):
                state.held = False
                queue = state.queue
                while (
                    queue
                    and queue[0].created < expire_before
                    and not (by_size and not queue[0].sent)
                ):
                    expired.append(self._pop(state))
                if not queue:
                    del self.queued[state]
                    continue
                head = queue[0]
                if state.retrying and state.in_flight:
                    continue  # held: the retried batches go again once all are answered
                if state.in_flight >= max_in_flight_per_partition or state.in_flight_tail:
                    continue
                if not head.sent and not allow_new:
                    continue
                if head.retry_at > now:
                    next_at = head.retry_at if next_at is None else min(next_at, head.retry_at)
                    continue
                if head is state.open and not flushing:
                    if by_size:
                        continue  # sent once full (a later record closes it) or flushed
                    due = head.created + linger
                    if due > now and head.size < self.batch_bytes:
                        next_at = due if next_at is None else min(next_at, due)
                        continue
                    if state.in_flight and not pipeline_partial and head.size < self.batch_bytes:
                        state.held = True  # the answer wakes the sender: no time to wait for
                        continue
                (lead if state.in_flight else rest).append(head)
            if not lead and not rest:
                return requests, expired, next_at
            for batch in lead:
                if len(requests) >= max_requests:
                    break
                requests.append([self._take(batch, sequences)])
            sizes = [r[0].size for r in requests]
            for batch in rest:
                placed = False
                for i, req in enumerate(requests):
                    if sizes[i] + batch.size <= max_request_bytes:
                        req.append(self._take(batch, sequences, tail=True))
                        sizes[i] += batch.size
                        placed = True
                        break
                if not placed:
                    if len(requests) >= max_requests:
                        break
                    requests.append([self._take(batch, sequences)])
                    sizes.append(batch.size)
        return requests, expired, next_at

    def _pop(self, state: PartitionState) -> ProducerBatch:
        batch = state.queue.popleft()
        if batch is state.open:
            state.open = None
        if batch.sent:
            state.retrying -= 1
        return batch

    def _take(self, batch: ProducerBatch, sequences: bool, *, tail: bool = False) -> ProducerBatch:
        state = batch.state
        self._pop(state)
        if not batch.sent and sequences:
            batch.base_sequence = state.next_sequence
            state.next_sequence = (state.next_sequence + batch.count) % SEQUENCE_WRAP
        if not batch.sent and self.by_size:
            batch.created = self._clock()  # the delivery timeout counts from the first send
        batch.attempts += 1
        batch.tail = tail
        state.in_flight += 1
        state.in_flight_tail += tail
        self.in_flight += 1
        return batch

    def _landed(self, batch: ProducerBatch) -> None:
        """An answer came for ``batch``: it is no longer in flight."""
        state = batch.state
        state.in_flight -= 1
        state.in_flight_tail -= batch.tail
        batch.tail = False
        self.in_flight -= 1

    def finish(self, batch: ProducerBatch, *, in_flight: bool, stored: bool) -> None:
        """``batch`` is done: answered (``stored``), or failed for good. Release its memory."""
        with self.lock:
            if in_flight:
                self._landed(batch)
            state = batch.state
            if stored and batch.base_sequence >= 0:
                state.acked_sequence = (batch.base_sequence + batch.count) % SEQUENCE_WRAP
            self.used -= batch.size - BATCH_OVERHEAD
            if (
                stored
                and recycle_buffer is not None
                and len(self._spent) + len(self._pool) < POOLED_BUFFERS
            ):
                # Answered, so its request was written whole; but the transport lets go of
                # the bytes only after this read callback: recycled when a batch opens.
                self._spent.append(batch)
        self._on_release()

    def retry(self, batch: ProducerBatch, at: float) -> None:
        """Put an in-flight ``batch`` back at the front of its queue, to be sent again at
        ``at``, in its order among the other batches being retried."""
        with self.lock:
            self._landed(batch)
            state = batch.state
            batch.retry_at = at
            queue = state.queue
            pos = bisect.bisect_left([b.no for b in list(queue)[: state.retrying]], batch.no)
            queue.insert(pos, batch)
            state.retrying += 1
            self.queued[state] = None

    def take_all(self, *, unsent_only: bool = False) -> list[ProducerBatch]:
        """Take every queued batch out (closing without a flush, a fatal error); with
        ``unsent_only`` only those never sent."""
        out: list[ProducerBatch] = []
        with self.lock:
            for state in list(self.queued):
                keep: deque[ProducerBatch] = deque()
                for batch in state.queue:
                    if unsent_only and batch.sent:
                        keep.append(batch)
                    else:
                        out.append(batch)
                state.queue = keep
                state.retrying = len(keep)
                if state.open is not None and (not unsent_only or not state.open.sent):
                    state.open = None
                if not keep:
                    del self.queued[state]
        return out

    def seal_open(self) -> None:
        """Close every open batch (a flush sends them without waiting for their linger)."""
        with self.lock:
            for state in self.queued:
                state.open = None

    def reset_sequences(self) -> None:
        """A new epoch starts every partition's sequence at 0 again."""
        with self.lock:
            for state in self.partitions.values():
                state.next_sequence = state.acked_sequence = 0

    def pending(self) -> list[ProducerBatch]:
        """Every queued batch (not those in flight)."""
        with self.lock:
            return [b for state in self.queued for b in state.queue]

    def has_queued(self, *, unheld: bool = False) -> bool:
        """Whether any partition has a batch waiting to be sent (read under the lock: a
        blocking producer's threads open batches while the loop asks); ``unheld``: other
        than those the last :meth:`drain` held for an answer (asked right after it)."""
        with self.lock:
            if unheld:
                return any(state.queue and not state.held for state in self.queued)
            return any(state.queue for state in self.queued)

    def sent_unanswered(self) -> bool:
        """Whether a batch that was sent is in flight or waiting to be sent again."""
        with self.lock:
            return self.in_flight > 0 or any(state.retrying for state in self.queued)

    @property
    def empty(self) -> bool:
        """Nothing queued and nothing in flight."""
        return not self.queued and self.in_flight == 0
