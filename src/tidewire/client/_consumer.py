"""Reading partitions by offset: :class:`AsyncConsumer` and its blocking twin
:class:`Consumer`.

A consumer is *assigned* partitions, each with a position (an offset, ``"earliest"``,
``"latest"``, or a ``datetime`` looked up with LIST_OFFSETS), and reads them with one
long-poll FETCH for all of them at a time. While the records of one fetch are handed out, the
next fetch is already on its way (one fetch ahead, so memory stays within two responses). A
lost connection is reopened (with backoff) and reading resumes from the positions. There are
no consumer groups here: positions live in the consumer, and nothing is committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar

from tidewire._tasks import cancel_and_wait
from tidewire.client._blocking import BlockingTwin
from tidewire.errors import (
    ConnectionLostError,
    NotLeaderError,
    PartitionCorruptError,
    RecordBatchError,
    TidewireError,
    fetch_error,
    for_code,
)
from tidewire.observability import tracing as _tracing
from tidewire.observability.tracing import tracer as _tracer
from tidewire.protocol.connection import ResponseReceived
from tidewire.protocol.frames import frame_data_window
from tidewire.protocol.messages import (
    FetchPartition,
    FetchRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
)
from tidewire.records import BatchHeader, iter_batches, read_records, read_spans
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._batch import ConsumedBatch, Part, Segment, segment_of, segment_of_records
from ._routing import (
    RETRY_BACKOFF_MAX_S,
    Router,
    RoutingStats,
    backoff_s,
    call_routed,
    leader_lost,
)
from ._settings import check_ints
from ._transport import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    Addresses,
    Transport,
    consumer_connect,
    parse_addrs,
)

__all__ = ["AsyncConsumer", "ConsumedBatch", "Consumer", "ConsumerRecord", "Gap", "Offset"]

#: A stored batch under ``1 / _KEEP_SHARE`` of its fetch's data is copied before
#: ``poll_batch`` hands its records out as spans: a kept ConsumedBatch holds at most this many
#: times the bytes of its records (a span holds the buffer it points into).
_KEEP_SHARE = 8

log = logging.getLogger("tidewire.client")

T = TypeVar("T")

#: A position to start from: an offset, ``"earliest"``, ``"latest"``, or a time (the first
#: record at or after it).
Offset = int | str | datetime

_EARLIEST, _LATEST = -2, -1
#: Records handed out by one ``poll`` at most, by default.
DEFAULT_MAX_RECORDS = 500
#: The most data of one fetch for one partition, by default: 4 MiB, so that a consumer
#: catching up on a few partitions fills a fetch (``max_bytes``, 16 MiB by default) with few
#: partitions. Fewer, larger answers cost the consumer 10-20% less CPU a message than 1 MiB
#: (1 KiB records, 4 partitions); memory stays bound by ``max_bytes`` and one fetch ahead.
DEFAULT_MAX_PARTITION_BYTES = 4 * 1024 * 1024
#: Records handed out by one ``poll_batch`` at most, by default (a batch holds the fetched
#: data of its records, and its columns once read: 100,000 records of 1 KiB are about 110 MB
#: held by the caller at once, twice that with every value made).
DEFAULT_MAX_BATCH_RECORDS = 100_000


class ConsumerRecord(NamedTuple):
    """One record as read: where it is, and what it holds (immutable; a named tuple, as
    the cheapest object Python makes per record)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


TP = tuple[str, int]

#: Gaps a consumer remembers (the oldest are dropped first; :attr:`AsyncConsumer.gaps_total`
#: counts them all).
MAX_GAPS = 1000


class Gap(NamedTuple):
    """A damaged range a consumer read past (``skip_damaged=True``): offsets ``start`` ..
    ``end - 1`` of the partition were not delivered."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(slots=True)
class _Fetched:
    """One fetch's answer for one partition: its stored batches (checked, not decoded yet),
    or its records already decoded (when tracing needs them at once)."""

    tp: TP
    offset: int  # the offset it was asked for
    buf: bytes | bytearray
    batches: list[tuple[int, BatchHeader]]
    next_offset: int
    error: TidewireError | None = None
    records: list[ConsumerRecord] | None = None  # made already (tracing needs them)


@dataclass(slots=True)
class _Chunk:
    """Fetched stored batches of one partition, decoded one at a time as they are handed
    out: a batch's records are made just before they are needed, so the memory they take is
    freed and reused batch by batch instead of a whole response's worth at once."""

    tp: TP
    offset: int  # records below it are skipped (the fetch asked for it)
    buf: bytes | bytearray
    batches: list[tuple[int, BatchHeader]]
    next: int = 0  # the index of the next batch to decode
    at: int = 0  # the offset after the batches decoded so far (where to fetch again)
    records: list[ConsumerRecord] | None = None  # made already (tracing needed them)


def _parse(
    tp: TP, offset: int, buf: bytes | bytearray, start: int, end: int
) -> tuple[list[ConsumerRecord], int]:
    """The records of the batches in ``buf[start:end]`` (read straight from a frame's bytes:
    indexing and slicing bytes is what read_records is fast at)."""
    topic, partition = tp
    out: list[ConsumerRecord] = []
    nxt = offset
    for pos, h in iter_batches(buf, start=start, end=end):
        # A batch may start before the offset asked for: its records below it are skipped.
        out += read_records(buf, pos, h, ConsumerRecord, topic, partition, offset)
        nxt = max(nxt, h.next_offset)
    return out, nxt


def _stored(
    offset: int, buf: bytes | bytearray, start: int, end: int
) -> tuple[list[tuple[int, BatchHeader]], int]:
    """The stored batches in ``buf[start:end]`` holding records at or after ``offset`` (each
    CRC-checked), and the offset after the last."""
    out: list[tuple[int, BatchHeader]] = []
    nxt = offset
    for pos, h in iter_batches(buf, start=start, end=end):
        if h.next_offset > offset:
            out.append((pos, h))
            nxt = max(nxt, h.next_offset)
    return out, nxt


async def resolve_positions(
    t: Transport, wanted: list[tuple[str, int, Offset]]
) -> list[tuple[TP, int]]:
    """Turn ``(topic, partition, offset)`` positions into offsets (LIST_OFFSETS for
    ``"earliest"``, ``"latest"`` and times).

    Raises:
        UnknownTopicError, UnknownPartitionError: resolving a position on the broker.
        ValueError, TypeError: a position that is none of the accepted kinds.
    """
    out: list[tuple[TP, int] | None] = []
    lookups: list[tuple[int, ListOffsetsPartition]] = []
    for topic, partition, offset in wanted:
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise TypeError(f"partition must be an int >= 0, not {partition!r}")
        if isinstance(offset, bool):
            raise TypeError("offset must be an int, 'earliest', 'latest' or a datetime")
        if isinstance(offset, int):
            if offset < 0:
                raise ValueError(f"offset {offset} is negative: use 'earliest' or 'latest'")
            out.append(((topic, partition), offset))
            continue
        if offset == "earliest":
            ts = _EARLIEST
        elif offset == "latest":
            ts = _LATEST
        elif isinstance(offset, datetime):
            ts = max(int(offset.timestamp() * 1000), 0)
        else:
            raise ValueError(
                f"offset {offset!r} must be an int, 'earliest', 'latest' or a datetime"
            )
        lookups.append((len(out), ListOffsetsPartition(topic, partition, ts)))
        out.append(None)
    if lookups:
        response = await t.request(ListOffsetsRequest(partitions=[p for _, p in lookups]))
        assert response is not None
        for (i, p), result in zip(lookups, response.body.results, strict=True):
            if result.error_code:
                raise for_code(result.error_code)(result.error_message)
            out[i] = ((p.topic, p.partition), int(result.offset))
    return [x for x in out if x is not None]


async def resolve_positions_routed(
    router: Router, t: Transport, wanted: list[tuple[str, int, Offset]]
) -> list[tuple[TP, int]]:
    """Resolve positions: in one request to the one node ``t``, or in a cluster each at
    its partition's leader (learning the cluster from the first NotLeaderError).

    Raises:
        What :func:`resolve_positions` raises, and NotLeaderError when the refreshed
        metadata still names no cluster.
    """
    if not router.clustered:
        try:
            return await resolve_positions(t, wanted)
        except NotLeaderError:
            await router.refresh({topic for topic, _, _ in wanted})
            if not router.clustered:
                raise
    out: list[tuple[TP, int]] = []
    timeout_s = t.request_timeout_s
    for topic, partition, offset in wanted:

        async def send(
            leader: Transport, w: tuple[str, int, Offset] = (topic, partition, offset)
        ) -> list[tuple[TP, int]]:
            return await resolve_positions(leader, [w])

        out += await call_routed(
            router, topic, partition, send, timeout_s=timeout_s, resend_on_loss=True
        )
    return out


class AsyncConsumer:
    """Reads assigned partitions from their positions, over a connection of its own.

    Use as ``async with AsyncConsumer(addr) as consumer``, then ``await
    consumer.assign([("events", 0, "earliest")])`` and ``async for record in consumer`` (or
    ``await consumer.poll(timeout_s)``).

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used.
        max_wait_ms: how long a fetch waits on the broker for ``min_bytes`` (long-poll).
        min_bytes: the least data a fetch returns with before ``max_wait_ms``.
        max_bytes: the most data of one fetch, all partitions together (at least one batch
            is returned even when larger).
        max_partition_bytes: the most data of one fetch for one partition (4 MiB).
        request_timeout_ms: how long a request may take, on top of its long-poll.
        connect_timeout_ms: how long opening the connection may take.
        skip_damaged: when a position lies in a damaged range of the broker's log
            (:class:`~tidewire.errors.PartitionCorruptError`), move past the range and go
            on, reporting the gap (:attr:`gaps`, and a WARNING log line or ``on_gap``), as a
            Kafka consumer can seek past a corrupt record. Off by default: the error is
            raised.
        on_gap: with ``skip_damaged``, called with each :class:`Gap` instead of logging it
            (on the consumer's event loop; it must not block).
        tls: TLS to the broker: :class:`~tidewire.client.TlsOptions`, True (the system's
            CAs), or None (plaintext).
        credentials: the API key to authenticate every connection with
            (:class:`~tidewire.client.Credentials`), or None. A key the broker refuses raises
            :class:`~tidewire.errors.AuthenticationFailedError` (not retried).
    """

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 16 * 1024 * 1024,
        max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        skip_damaged: bool = False,
        on_gap: Callable[[Gap], None] | None = None,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        check_ints(
            ("max_wait_ms", max_wait_ms, 0),
            ("min_bytes", min_bytes, 0),
            ("max_bytes", max_bytes, 1),
            ("max_partition_bytes", max_partition_bytes, 1),
            ("request_timeout_ms", request_timeout_ms, 1),
            ("connect_timeout_ms", connect_timeout_ms, 1),
        )
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.max_partition_bytes = max_partition_bytes
        self.skip_damaged = skip_damaged
        self.on_gap = on_gap
        #: The consumer group this consumer reads for (tracing names it), if any.
        self.group_name: str | None = None
        self._addr = addr if isinstance(addr, str) else ",".join(addr)
        #: The damaged ranges read past (``skip_damaged``), oldest first, at most MAX_GAPS.
        self.gaps: deque[Gap] = deque(maxlen=MAX_GAPS)
        #: How many damaged ranges were read past in all.
        self.gaps_total = 0

        connect = consumer_connect(request_timeout_ms, connect_timeout_ms, tls, credentials)

        self._t = connect(addr)
        #: Each partition's leader in a cluster (its fetches go there).
        self._router = Router(self._t, connect)
        #: A fetch met a partition whose leader was lost: the next one refreshes the
        #: metadata first.
        self._stale = False
        #: Fetches in a row that met a lost leader (their backoff grows with it).
        self._lost_attempts = 0
        #: The offset of the next record handed out, per assigned partition.
        self._positions: dict[TP, int] = {}
        #: Where the next fetch starts: after the records buffered.
        self._fetch_at: dict[TP, int] = {}
        #: Records made and not handed out yet (of one partition at a time), then stored
        #: batches not decoded yet.
        self._buffer: deque[ConsumerRecord] = deque()
        self._chunks: deque[_Chunk] = deque()
        #: The last record iteration handed out, whose position is not written yet: one
        #: attribute store per record instead of a dict update (:meth:`_settle`).
        self._last: ConsumerRecord | None = None
        self._fetch: asyncio.Future[list[_Fetched]] | None = None
        self._fetch_corr = 0  # the correlation id of a fetch sent by Transport.request_soon
        #: What the polls waiting for that fetch's answer await (set from the read callback).
        self._waiters: list[asyncio.Future[None]] = []
        #: The fetch started has not run yet (its request is not written).
        self._fetch_unsent = False
        self._backoff = 0.0
        self._closed = False

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop fetching and close the connection."""
        self._closed = True
        await self._drop_fetch()
        await self._router.close()
        await self._t.close()

    # --- positions ----------------------------------------------------------------------------

    async def assign(self, positions: Iterable[tuple[str, int, Offset]]) -> None:
        """Read exactly these partitions, each from its position; replaces the assignment.

        Args:
            positions: ``(topic, partition, offset)`` where ``offset`` is an int,
                ``"earliest"``, ``"latest"`` or a ``datetime``.

        Raises:
            UnknownTopicError, UnknownPartitionError: resolving a position on the broker.
            ValueError, TypeError: a position that is none of the above.
        """
        wanted = [(t, p, o) for t, p, o in positions]
        resolved = await self._resolve(wanted)
        await self._drop_fetch()
        self._buffer.clear()
        self._chunks.clear()
        self._last = None
        self._positions = dict(resolved)
        self._fetch_at = dict(resolved)

    async def seek(self, topic: str, partition: int, offset: Offset) -> None:
        """Move an assigned partition's position (records buffered for it are dropped).

        Raises:
            ValueError: the partition is not assigned.
        """
        tp = (topic, partition)
        if tp not in self._positions:
            raise ValueError(f"{topic!r} partition {partition} is not assigned")
        ((_, where),) = await self._resolve([(topic, partition, offset)])
        self._settle()
        self._positions[tp] = self._fetch_at[tp] = where
        buf = self._buffer
        if buf and (buf[0].topic, buf[0].partition) == tp:  # one partition's records
            buf.clear()
        self._chunks = deque(c for c in self._chunks if c.tp != tp)
        # A fetch on its way asked for the old offset, and at the log's end it is a long-poll
        # that would hold the next poll for up to max_wait_ms: dropped (what it would bring
        # of other partitions is fetched again from their unchanged fetch positions).
        await self._drop_fetch()

    def position(self, topic: str, partition: int) -> int:
        """The offset of the next record this consumer hands out for the partition.

        Raises:
            ValueError: the partition is not assigned.
        """
        self._settle()
        try:
            return self._positions[(topic, partition)]
        except KeyError:
            raise ValueError(f"{topic!r} partition {partition} is not assigned") from None

    @property
    def throttle_time_ms_total(self) -> int:
        """How long the broker held this consumer's fetch answers back in all (ms), because
        its principal was over a quota (0: never throttled)."""
        return self._router.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """What this consumer's routing did: metadata refreshes, NotLeader retries and leader
        moves followed (a copy; see :class:`~tidewire.client.RoutingStats`)."""
        return self._router.stats_copy()

    def assignment(self) -> list[tuple[str, int]]:
        """The assigned partitions."""
        return list(self._positions)

    async def _resolve(self, wanted: list[tuple[str, int, Offset]]) -> list[tuple[TP, int]]:
        """Resolve positions (:func:`resolve_positions_routed`)."""
        return await resolve_positions_routed(self._router, self._t, wanted)

    # --- reading ------------------------------------------------------------------------------

    async def poll(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
    ) -> list[ConsumerRecord]:
        """Return the records available, waiting up to ``timeout_s`` (None: until some
        arrive) for the first; an empty list when none came in time.

        Raises:
            OffsetOutOfRangeError, UnknownTopicError, UnknownPartitionError, ...: a
            partition's fetch failed (the position is left as it was).
            RecordBatchError: a stored batch is malformed (the records before it were
            handed out; the position is left before it).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if not await self._wait(None if deadline is None else deadline - loop.time()):
                return []
            out = self._take_records(max_records)
            if out:
                await self._send_ahead()
                return out

    def _take_records(self, max_records: int) -> list[ConsumerRecord]:
        """Hand out up to ``max_records`` of the records buffered or fetched (decoding the
        stored batches they are in), moving the positions past them."""
        self._settle()
        out: list[ConsumerRecord] = []
        buf, positions = self._buffer, self._positions
        while len(out) < max_records:
            if not buf:
                try:
                    if not self._decode_next():
                        break
                except RecordBatchError:
                    if out:
                        break  # the error comes again at the next fetch from there
                    raise
            take = min(len(buf), max_records - len(out))
            if take == len(buf):
                got = list(buf)
                buf.clear()
            else:
                got = [buf.popleft() for _ in range(take)]
            r = got[-1]  # the buffer holds one partition's records: the last sets it
            positions[r[0], r[1]] = r[2] + 1
            out += got
        self._start_fetch()  # prefetch while these are processed
        return out

    async def poll_batch(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_BATCH_RECORDS
    ) -> ConsumedBatch:
        """Return the records available as one :class:`ConsumedBatch` (columns, and Arrow
        through :meth:`ConsumedBatch.to_arrow`), waiting up to ``timeout_s`` (None: until
        some arrive) for the first; an empty batch when none came in time.

        The records and the positions are those :meth:`poll` would hand out (partition by
        partition, offsets ascending; each partition's position moves past its last
        record), checked now and made into columns when the caller reads them (each column
        once; no object per record before): the fastest way to read. The batch holds on to
        the fetched data its records came from while it is kept. It may be mixed with
        :meth:`poll` and iteration.

        Args:
            timeout_s: the longest wait for the first records (s).
            max_records: the most records in the batch (at least 1).

        Raises:
            as :meth:`poll`.
        """
        if max_records < 1:
            raise ValueError(f"max_records={max_records} must be at least 1")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if not await self._wait(None if deadline is None else deadline - loop.time()):
                return ConsumedBatch([])
            batch = self._take_batch(max_records)
            if batch:
                await self._send_ahead()
                return batch

    def _take_batch(self, max_records: int) -> ConsumedBatch:
        """:meth:`_take_records` as columns."""
        self._settle()
        segments: list[Segment] = []
        n = 0
        buf = self._buffer
        if buf:  # records already made (by poll or iteration): they come first
            take = min(len(buf), max_records)
            segments = segment_of_records([buf.popleft() for _ in range(take)])
            n = take
        while n < max_records:
            got = self._next_stored()
            if got is None:
                break
            chunk, pos, h = got
            chunk.records = None  # decoded here instead
            topic, partition = chunk.tp
            try:
                # Checked now (a malformed batch fails this poll); the columns' objects are
                # made when the caller reads them.
                data, at = chunk.buf, pos
                size = h.size
                if size * _KEEP_SHARE < len(data):
                    # A small share of the fetched data: its own copy (one a stored batch), so
                    # that a batch the caller keeps does not hold the whole fetch.
                    data, at = bytes(memoryview(data)[pos : pos + size]), 0
                spans = read_spans(data, at, h, chunk.offset)
            except RecordBatchError:
                self._damaged(chunk)
                if n:
                    break  # the error comes again at the next fetch from there
                raise
            chunk.at = h.next_offset
            count = len(spans)
            if not count:
                continue
            part: Part = spans
            if n + count > max_records:  # the rest of this batch waits, as records
                columns = spans.columns()
                keep = max_records - n
                rest = columns[0][keep:], *(c[keep:] for c in columns[1:])
                part = columns[0][:keep], *(c[:keep] for c in columns[1:])  # type: ignore[assignment]
                new = tuple.__new__
                buf.extend(
                    new(ConsumerRecord, (topic, partition, *row)) for row in zip(*rest, strict=True)
                )
                count = keep
            last = segments[-1] if segments else None
            if (
                last is not None
                and last.partition == partition
                and last.topic == topic
                and last.timestamp_type == h.timestamp_type == 0
            ):
                last.extend(part)
            else:
                segments.append(segment_of(topic, partition, h, part))
            n += count
        positions = self._positions
        for s in segments:
            positions[s.topic, s.partition] = s.last_offset + 1
        self._start_fetch()  # prefetch while these are processed
        return ConsumedBatch(segments)

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        buf = self._buffer
        while not buf:
            await self._wait(None)
            self._decode_next()
        r = self._last = buf.popleft()  # its position is written by _settle
        return r

    def _settle(self) -> None:
        """Write the position of the last record iteration handed out (before anything
        reads or writes positions, or the buffer moves to another partition)."""
        r = self._last
        if r is not None:
            self._last = None
            self._positions[r[0], r[1]] = r[2] + 1

    async def _wait(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (None: for ever) for records to hand out; whether some
        are there (made, or stored batches to decode)."""
        if self._buffer or self._chunks:
            return True
        if not self._positions:
            raise ValueError("no partitions are assigned: call assign() first")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._buffer and not self._chunks:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            await self._fill(remaining)
        return True

    def _next_stored(self) -> tuple[_Chunk, int, BatchHeader] | None:
        """The next stored batch to decode (taken from the chunks), or None."""
        chunks = self._chunks
        while chunks:
            chunk = chunks[0]
            if chunk.next < len(chunk.batches):
                pos, h = chunk.batches[chunk.next]
                chunk.next += 1
                if chunk.next == len(chunk.batches):
                    chunks.popleft()  # taken: nothing is left of it to wait for
                return chunk, pos, h
            chunks.popleft()
        if self._fetch is None:
            self._start_fetch()  # everything fetched was handed out: fetch ahead
        return None

    def _decode_next(self) -> bool:
        """Make the records of the next stored batch that has any; whether one had.

        Raises:
            RecordBatchError: the batch is malformed (its partition is fetched again from
            the batch on).
        """
        buf = self._buffer
        while not buf:
            self._settle()
            got = self._next_stored()
            if got is None:
                return False
            chunk, pos, h = got
            if chunk.records is not None:  # made already (none taken yet): all at once
                buf += chunk.records
                chunk.records = None
                chunk.next = len(chunk.batches)
                chunk.at = chunk.batches[-1][1].next_offset
                if self._chunks and self._chunks[0] is chunk:
                    self._chunks.popleft()
                continue
            topic, partition = chunk.tp
            try:
                buf += read_records(
                    chunk.buf, pos, h, ConsumerRecord, topic, partition, chunk.offset
                )
            except RecordBatchError:
                self._damaged(chunk)
                raise
            chunk.at = h.next_offset
        return True

    def _damaged(self, chunk: _Chunk) -> None:
        """A stored batch of ``chunk`` did not decode: drop what is left of its partition's
        fetched batches and fetch it again from that batch on (the error comes again then,
        the records before it having been handed out)."""
        tp = chunk.tp
        self._chunks = deque(c for c in self._chunks if c.tp != tp)
        if tp in self._fetch_at:
            self._fetch_at[tp] = chunk.at

    async def _fill(self, timeout_s: float | None) -> None:
        """Wait up to ``timeout_s`` for the fetch on its way (starting one) and buffer what
        it brought."""
        task = self._start_fetch()
        if isinstance(task, asyncio.Task):
            done, _ = await asyncio.wait([task], timeout=timeout_s)
            if not done:
                return
        elif not task.done():
            # A fetch sent by request_soon: its answer wakes this poll from the read callback
            # itself (_fetched), one loop turn sooner than a done callback of the future
            # would (asyncio.wait: the callback runs a turn later, then wakes this task).
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter
            except TimeoutError:
                return
            finally:
                if waiter in self._waiters:  # timed out or cancelled: not woken
                    self._waiters.remove(waiter)
            if not task.done():
                return
        if self._fetch is task:  # another poll woken by the same answer may have sent the next
            self._fetch = None
        if task.cancelled():  # dropped (seek, assign, close): the caller fetches anew
            return
        try:
            results = task.result()
        except TidewireError as exc:
            if not exc.retriable:
                raise
            # The connection broke or a request timed out: reconnect, resume from positions.
            self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
            if self._router.clustered:
                self._stale = True  # the node may be gone: where do its partitions live now?
                # A new leader is elected within a session timeout: poll for it at the
                # routing pace, not at the single node's reconnect backoff (up to seconds).
                self._backoff = min(self._backoff, RETRY_BACKOFF_MAX_S)
            await asyncio.sleep(self._backoff)
            return
        self._backoff = 0.0
        error: TidewireError | None = None
        lost = False
        for f in results:
            if self._fetch_at.get(f.tp) != f.offset:
                continue  # sought elsewhere meanwhile, or no longer assigned
            if f.error is not None:
                if self._skip(f.tp, f.offset, f.error):
                    continue
                if leader_lost(f.error, self._router.clustered):
                    # Not this partition's leader (any more), or its node is gone: the next
                    # fetch asks the metadata where it is and reads on from the same offset.
                    self._router.forget(*f.tp)
                    self._stale = lost = True
                    continue
                error = error or f.error
                continue
            if f.batches:
                chunk = _Chunk(f.tp, f.offset, f.buf, f.batches, at=f.offset, records=f.records)
                self._chunks.append(chunk)
            self._fetch_at[f.tp] = f.next_offset
        if error is not None and not self._buffer and not self._chunks:
            raise error
        if lost:
            self._lost_attempts += 1
            if not self._buffer and not self._chunks:  # give the cluster time to elect
                await asyncio.sleep(backoff_s(self._lost_attempts))
        else:
            self._lost_attempts = 0
        if self._buffer or self._chunks:
            # The next fetch goes out now, from after what is buffered, so the broker reads
            # and sends it while these records are handed out (memory: two responses).
            self._start_fetch()
            await self._send_ahead()

    async def _send_ahead(self) -> None:
        """Let a fetch just started send its request before records are handed out.

        A task runs only when the loop gets control, and handing out buffered records never
        gives it back: without this turn the request would leave only once the buffer ran
        dry, and the broker would sit idle while the consumer works (and the other way
        round). One loop turn per fetch."""
        if self._fetch_unsent:
            await asyncio.sleep(0)

    def _start_fetch(self) -> asyncio.Future[list[_Fetched]]:
        if self._closed:
            raise ConnectionLostError("the consumer is closed")
        if self._fetch is None:
            wants = list(self._fetch_at.items())
            loop = asyncio.get_running_loop()
            if not self._stale and not self._router.clustered and _tracer() is None:
                # One node, connected: the request is written now and its answer read into
                # this future from the read callback (no task: the records reach a waiting
                # poll one loop turn sooner). Otherwise the task below.
                fut: asyncio.Future[list[_Fetched]] = loop.create_future()
                req, timeout = self._fetch_request(wants)
                corr = self._t.request_soon(
                    req, (), lambda got: self._fetched(fut, wants, got), timeout
                )
                if corr is not None:
                    self._fetch_unsent = False
                    self._fetch, self._fetch_corr = fut, corr
                    return fut
            self._fetch_unsent = True
            self._fetch = loop.create_task(self._fetch_once(wants), name="tidewire consumer fetch")
        return self._fetch

    def _fetched(
        self,
        fut: asyncio.Future[list[_Fetched]],
        wants: list[tuple[TP, int]],
        got: ResponseReceived | TidewireError,
    ) -> None:
        """A fetch sent by ``request_soon`` was answered (or failed): its future is settled
        and a poll waiting for it is woken, both in the read callback."""
        _fetched_soon(fut, wants, got)
        self._wake_waiter()

    def _wake_waiter(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _skip(self, tp: TP, offset: int, err: TidewireError) -> bool:
        """With ``skip_damaged``: move past the damaged range ``err`` names, reporting the
        gap. Returns whether it did."""
        if not (
            self.skip_damaged and isinstance(err, PartitionCorruptError) and err.damage_end > offset
        ):
            return False
        gap = Gap(tp[0], tp[1], max(err.damage_start, offset), err.damage_end)
        self.gaps.append(gap)
        self.gaps_total += 1
        if self.on_gap is not None:
            self.on_gap(gap)
        else:
            log.warning(
                "%s partition %d: offsets %d..%d lie in a damaged range of the broker's log "
                "and were skipped: %s",
                gap.topic,
                gap.partition,
                gap.start,
                gap.end - 1,
                err.message,
            )
        self._fetch_at[tp] = err.damage_end
        self._settle()
        if not any((r.topic, r.partition) == tp for r in self._buffer) and not any(
            c.tp == tp for c in self._chunks
        ):
            self._positions[tp] = err.damage_end
        return True

    async def _fetch_once(self, wants: list[tuple[TP, int]]) -> list[_Fetched]:
        if self._stale or self._router.clustered:
            return await self._fetch_routed(wants)
        return await self._fetch_from(self._t, wants)

    async def _fetch_routed(self, wants: list[tuple[TP, int]]) -> list[_Fetched]:
        """A cluster: refresh the leaders first when one was lost, then fetch from each
        leader node at once (one request per node) and put the answers together; a node that
        cannot be reached fails its partitions only (they are fetched again once the metadata
        names their new leader). Each request long-polls on its node: a round ends when every
        node has answered."""
        self._fetch_unsent = False
        router = self._router
        if self._stale:
            await router.refresh({topic for (topic, _), _ in wants})
            self._stale = False
        groups: dict[int, list[tuple[TP, int]]] = {}
        for want in wants:
            groups.setdefault(router.leader(*want[0]), []).append(want)
        parts = list(groups.values())
        answers = await asyncio.gather(
            *(self._fetch_from(router.transport_for(*part[0][0]), part) for part in parts),
            return_exceptions=True,
        )
        out: list[_Fetched] = []
        for part, answer in zip(parts, answers, strict=True):
            if isinstance(answer, TidewireError) and leader_lost(answer, True):
                out += [_Fetched(tp, offset, b"", [], offset, answer) for tp, offset in part]
            elif isinstance(answer, BaseException):
                # Anything else fails the whole fetch, as one request would (a retriable
                # error is retried after a backoff, from the same positions).
                raise answer
            else:
                out += answer
        return out

    async def _fetch_from(
        self, transport: Transport, wants: list[tuple[TP, int]]
    ) -> list[_Fetched]:
        self._fetch_unsent = False  # the request is written in this step
        req, timeout = self._fetch_request(wants)
        t = _tracer()  # None without an OpenTelemetry SDK: nothing else is done for tracing
        started = time.time_ns() if t is not None else 0
        response = await transport.request(req, timeout_s=timeout)
        assert response is not None
        out = _fetch_results(wants, response, t is not None)
        if t is not None:
            got = [r for f in out for r in f.records or ()]
            if got:
                _tracing.record_receive(t, got, started, self._addr, self.group_name)
        return out

    def _fetch_request(self, wants: list[tuple[TP, int]]) -> tuple[FetchRequest, float]:
        """The fetch request for ``wants``, and how long its answer may take."""
        req = FetchRequest(
            max_wait_ms=self.max_wait_ms,
            min_bytes=self.min_bytes,
            max_bytes=self.max_bytes,
            partitions=[FetchPartition(t, p, o, self.max_partition_bytes) for (t, p), o in wants],
        )
        return req, self._t.request_timeout_s + self.max_wait_ms / 1000

    async def _drop_fetch(self) -> None:
        task, self._fetch = self._fetch, None
        self._fetch_unsent = False
        if isinstance(task, asyncio.Task):
            await cancel_and_wait(task, ignore=(TidewireError,))
        elif task is not None:  # sent by request_soon: its answer, when it comes, is dropped
            task.cancel()
            self._t.forget_soon(self._fetch_corr)
            self._wake_waiter()  # a poll waiting for it finds it cancelled, as before


def _fetch_results(
    wants: list[tuple[TP, int]], response: ResponseReceived, make_records: bool
) -> list[_Fetched]:
    """What a fetch answer brought for each partition asked for (records made only when
    ``make_records``: a tracing span names them)."""
    out: list[_Fetched] = []
    # A large answer was read into a buffer of its own: records are read from it in place.
    buf, pos = frame_data_window(response.data)
    for (tp, offset), result in zip(wants, response.body.partitions, strict=True):
        start = pos
        pos += result.size
        if result.error_code:
            err = fetch_error(
                result.error_code, result.error_message, result.damage_start, result.damage_end
            )
            out.append(_Fetched(tp, offset, buf, [], offset, err))
            continue
        batches, nxt = _stored(offset, buf, start, pos)
        records = None
        if make_records and batches:
            records, _ = _parse(tp, offset, buf, start, pos)
        out.append(_Fetched(tp, offset, buf, batches, nxt, records=records))
    return out


def _fetched_soon(
    fut: asyncio.Future[list[_Fetched]],
    wants: list[tuple[TP, int]],
    got: ResponseReceived | TidewireError,
) -> None:
    """The answer to a fetch sent by ``request_soon`` (from the read callback) into ``fut``,
    as the fetch task would have returned or raised it."""
    if fut.done():  # dropped meanwhile (seek, assign, close)
        return
    if isinstance(got, TidewireError):
        fut.set_exception(got)
    elif got.error is not None:
        fut.set_exception(got.error)
    else:
        try:
            fut.set_result(_fetch_results(wants, got, False))
        except Exception as exc:  # a bug or a malformed answer: the poll raises it
            fut.set_exception(exc)


class _Reader(Protocol):
    async def close(self) -> None: ...
    async def poll(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
    ) -> list[ConsumerRecord]: ...
    def position(self, topic: str, partition: int) -> int: ...
    def assignment(self) -> list[tuple[str, int]]: ...
    @property
    def throttle_time_ms_total(self) -> int: ...
    @property
    def routing_stats(self) -> RoutingStats: ...


R = TypeVar("R", bound=_Reader)


class BlockingReader(BlockingTwin[R]):
    """What the blocking readers (``Consumer``, ``Subscriber``, ``GroupConsumer``) share:
    records the loop handed over but the caller has not taken yet wait in ``_local``;
    ``poll`` and iteration serve from there first."""

    _local: deque[ConsumerRecord]

    def position(self, topic: str, partition: int) -> int:
        for r in self._local:  # handed over by the loop, not yet to the caller
            if r.topic == topic and r.partition == partition:
                return r.offset
        return self._async.position(topic, partition)

    def assignment(self) -> list[tuple[str, int]]:
        return self._async.assignment()

    @property
    def throttle_time_ms_total(self) -> int:
        """See ``throttle_time_ms_total`` of the asyncio twin."""
        return self._async.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """See ``routing_stats`` of the asyncio twin."""
        return self._async.routing_stats

    def poll(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
    ) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        while self._local and len(out) < max_records:
            out.append(self._local.popleft())
        if out:
            return out
        return self._run(self._async.poll(timeout_s, max_records=max_records))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        # Only with nothing left locally does the asyncio twin run again (and, for a group
        # member, auto-commit or rebalance): every record it returned before was handed out.
        while not self._local:
            self._local.extend(self._run(self._async.poll(None)))
        return self._local.popleft()


class Consumer(BlockingReader[AsyncConsumer]):
    """The blocking twin of :class:`AsyncConsumer`: the same methods without ``await``, and
    ``for record in consumer``. It runs the async consumer on an event loop in a thread of
    its own; iteration takes records from the loop a ``poll`` at a time."""

    _closed_error = ConnectionLostError
    _closed_message = "the consumer is closed"

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 16 * 1024 * 1024,
        max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        skip_damaged: bool = False,
        on_gap: Callable[[Gap], None] | None = None,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        parse_addrs(addr)
        options: dict[str, Any] = {
            "max_wait_ms": max_wait_ms,
            "min_bytes": min_bytes,
            "max_bytes": max_bytes,
            "max_partition_bytes": max_partition_bytes,
            "request_timeout_ms": request_timeout_ms,
            "connect_timeout_ms": connect_timeout_ms,
            "skip_damaged": skip_damaged,
            "on_gap": on_gap,
            "tls": tls,
            "credentials": credentials,
        }
        self._local: deque[ConsumerRecord] = deque()
        self._start_loop("tidewire-consumer")
        try:
            self._async = self._run(self._make(addr, options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(addr: Addresses, options: dict[str, Any]) -> AsyncConsumer:
        return AsyncConsumer(addr, **options)

    def assign(self, positions: Iterable[tuple[str, int, Offset]]) -> None:
        self._local.clear()
        self._run(self._async.assign(list(positions)))

    def poll_batch(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_BATCH_RECORDS
    ) -> ConsumedBatch:
        """See :meth:`AsyncConsumer.poll_batch`."""
        if max_records < 1:
            raise ValueError(f"max_records={max_records} must be at least 1")
        local = self._local
        if local:  # handed over by the loop for iteration: they come first
            take = min(len(local), max_records)
            return ConsumedBatch(segment_of_records([local.popleft() for _ in range(take)]))
        return self._run(self._async.poll_batch(timeout_s, max_records=max_records))

    @property
    def gaps(self) -> list[Gap]:
        """The damaged ranges read past (``skip_damaged``), oldest first."""
        return list(self._async.gaps)

    def seek(self, topic: str, partition: int, offset: Offset) -> None:
        self._run(self._async.seek(topic, partition, offset))
        self._local = deque(r for r in self._local if (r.topic, r.partition) != (topic, partition))
