"""The batching producer: :class:`AsyncProducer`, and its blocking twin in
:mod:`tidewire.client._producer_sync`.

``send`` appends a message to its partition's open batch in the
:class:`~tidewire.client._accumulator.Accumulator` and returns a future; one sender task
drains batches into pipelined produce requests (several partitions per request, several
requests in flight), retries what failed with a retriable error, and resolves the batches'
futures. With ``linger_ms=0`` a ``send`` that opens a batch runs the sender's drain itself,
so a lone message is written before ``send`` returns (the sender task then runs only for what
has to wait: a free slot, a retry, a new producer id, metadata). With idempotence, the
producer first asks the broker for a producer id and epoch, numbers every batch per
partition, and resends a failed batch with the same bytes.

A *writer* (``writer_id``) is an idempotent producer whose identity outlives it: every
producer made with the same writer id continues the same sequences, and records the broker
holds already from an earlier instance are skipped instead of sent (docs/protocol.md,
"Deterministic writers"). Sending the same records in the same order again therefore stores
each one once, which is what makes a retried Spark task exactly-once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from opentelemetry.trace import Tracer

from tidewire.errors import (
    BufferFullError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    PartitionOfflineError,
    ProducerClosedError,
    ProducerFencedError,
    RequestTimedOutError,
    TidewireError,
    UnknownApiError,
    UnknownPartitionError,
    UnknownTopicError,
    for_code,
)
from tidewire.observability import tracing as _tracing
from tidewire.observability.tracing import tracer as _tracer
from tidewire.protocol.connection import ResponseReceived
from tidewire.protocol.messages import (
    ACKS_NONE,
    GroupPartition,
    InitProducerIdRequest,
    MetadataRequest,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProducerStateRequest,
    TopicDescription,
)
from tidewire.records._impl import append_routed as _append_routed
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._accumulator import (
    ROLLED,
    SEQUENCE_WRAP,
    Accumulator,
    BatchFuture,
    PartitionState,
    ProducerBatch,
    RecordFuture,
    encode_headers,
)
from ._routing import Router, RoutingStats, backoff_s, leader_lost
from ._settings import DEFAULT_BATCH_BYTES, MAX_BATCH_BYTES, ProducerSettings
from ._transport import Addresses, Transport
from .partitioner import fnv1a_32

__all__ = ["AsyncProducer", "Session"]

log = logging.getLogger("tidewire.producer")
#: Makes a message's future from ``(batch, index, timestamp)`` in C (no ``__new__`` call).
_new_tuple = tuple.__new__

#: Produce requests in flight at once (all partitions together): enough to keep a broker's
#: group commits full, few enough that a lost connection has a bounded amount to resend.
MAX_REQUESTS_IN_FLIGHT = 32
#: The longest pause between two retries of a batch (s); the first is ``retry_backoff_ms``.
RETRY_BACKOFF_MAX_S = 1.0
#: Bytes kept free below a topic's batch limit when batches are compressed: incompressible
#: data grows by a little under compression.
_COMPRESSION_SLACK = 1024
_HEADERS_NONE = b"\x00"
_time_ns = time.time_ns
#: What the producer answers while the metadata of a topic is not known yet.
_NEED_METADATA = -1
#: A writer's unkeyed records without a partition go to one partition for this many records,
#: then to the next: a function of the records alone, so every instance routes them alike.
WRITER_STICKY_RECORDS = 1024


class Session(enum.Enum):
    """The idempotent producer's identity, as a state machine (see ``TRANSITIONS``)."""

    DISABLED = "disabled"  # idempotence off: batches carry no producer id
    NEEDS_ID = "needs_id"  # ask INIT_PRODUCER_ID before the first batch
    READY = "ready"  # producer id and epoch known
    NEEDS_BUMP = "needs_bump"  # a sent batch was given up: new epoch once nothing is pending
    FATAL = "fatal"  # fenced, or the sequences broke: every later send fails


TRANSITIONS: dict[Session, frozenset[Session]] = {
    Session.DISABLED: frozenset(),
    Session.NEEDS_ID: frozenset({Session.READY, Session.FATAL}),
    Session.READY: frozenset({Session.NEEDS_BUMP, Session.FATAL}),
    Session.NEEDS_BUMP: frozenset({Session.READY, Session.FATAL}),
    Session.FATAL: frozenset(),
}


@dataclass(slots=True)
class _Topic:
    """What the producer knows of a topic."""

    partitions: list[PartitionState]
    limit: int  # the largest batch to build for it (bytes, before compression)
    sticky: int  # the partition unkeyed messages go to now
    sticky_batch: ProducerBatch | None = None
    unkeyed: int = 0  # a writer's unkeyed records so far (they rotate by count)


def _as_bytes(value: object, name: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"{name} must be bytes, bytearray, memoryview or None, not {type(value).__name__}"
    )


def _retrieved(fut: BatchFuture) -> None:
    """Mark a failed asyncio future's error as seen: a message nobody awaits is not an error
    to log at garbage collection (its future holds the error for whoever asks)."""
    if isinstance(fut, asyncio.Future):
        fut.exception()


class AsyncProducer:
    """A batching, pipelining producer for one broker.

    It opens its own connection to ``addr`` (it does not share an :class:`AsyncClient`'s).
    Use as ``async with AsyncProducer(addr, ...) as producer``; ``fut = await
    producer.send(topic, value)`` queues a message and ``await fut`` waits for its
    :class:`RecordMetadata`.

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used.
        linger_ms: how long a partition's open batch waits for more messages before it is
            sent (0: send as soon as the sender runs).
        batch_bytes: a batch is sent once it reaches this size (bytes, before compression),
            or when its linger expires, whichever comes first.
        buffer_bytes: the memory held by messages not yet answered; when it is full,
            ``send`` waits up to ``max_block_ms`` for room, then raises ``BufferFullError``.
        max_block_ms: see ``buffer_bytes``; also bounds the wait for a topic's metadata.
            0: never wait for room (a send that finds the buffer full raises at once); the
            first send to a topic still looks its metadata up, within
            ``request_timeout_ms``.
        compression: ``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"`` or ``"zstd"``, per batch.
        acks: ``"durable"`` (answered once stored under the topic's fsync policy, fsynced),
            ``"leader"`` (once written), ``"none"`` (no answer: offsets are -1, errors lost).
        idempotence: each batch stored once however often it is resent (needs a broker that
            serves INIT_PRODUCER_ID, and acks other than ``"none"``).
        retries: how many times a batch is resent after a retriable error; bounded in time by
            ``delivery_timeout_ms`` anyway.
        delivery_timeout_ms: a message not answered this long after ``send`` fails with the
            last error (``RequestTimedOutError`` if it never left).
        retry_backoff_ms: the first pause before a retry; it doubles up to 1 s.
        max_in_flight_per_partition: batches sent and not answered per partition (at most 5
            with idempotence). Without idempotence and above 1, a retry may reorder messages.
        pipeline_partial_batches: send a batch that is still filling (under ``batch_bytes``,
            its linger over) while a batch of its partition is unanswered, as Kafka's
            producer does. False (the default): it goes once its partition has nothing
            unanswered, with what arrived meanwhile, or once full; full batches are
            pipelined either way, up to ``max_in_flight_per_partition``. On a local
            network the wait is shorter than the broker's time per request (at 5,000
            msg/s, 2.4-3.1 -> 6.4-7.6 messages a request after fsync, broker CPU a message
            -12-22%, p50 -22-33%: docs/performance.md); over a long round trip, True saves
            up to one round trip a message.
        request_timeout_ms: how long one produce request may take.
        max_request_bytes: the data of one produce request (a larger single batch goes
            alone).
        metadata_max_age_ms: how often partition counts are refreshed.
        connect_timeout_ms: how long opening the connection may take.
        writer_id: make this producer the writer of that name (1..255 bytes of UTF-8; see
            the module docstring): records an earlier writer of the same name stored are
            skipped (their futures answer offset -1), batches are cut by size alone (not by
            ``linger_ms``), unkeyed records rotate through the partitions every
            ``WRITER_STICKY_RECORDS``, a topic's partition count is read once, and a batch
            that cannot be delivered fails the producer (a new writer instance resumes).
        tls: TLS to the broker: :class:`~tidewire.client.TlsOptions`, True (the system's
            CAs), or None (plaintext). A failed handshake fails the sends with
            :class:`~tidewire.security.tls.TlsError` (not retried).
        credentials: the API key to authenticate every connection with
            (:class:`~tidewire.client.Credentials`), or None. A key the broker refuses fails
            the sends with :class:`~tidewire.errors.AuthenticationFailedError` (not retried).

    Raises:
        InvalidConfigError: an option out of its range.
        ValueError: ``addr`` is not ``HOST:PORT``.
    """

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        linger_ms: int = 5,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        buffer_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        compression: str = "none",
        acks: str = "durable",
        idempotence: bool = True,
        retries: int = 2**31 - 1,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        max_in_flight_per_partition: int = 5,
        pipeline_partial_batches: bool = False,
        request_timeout_ms: int = 30_000,
        max_request_bytes: int = 1024 * 1024,
        metadata_max_age_ms: int = 300_000,
        connect_timeout_ms: int = 10_000,
        writer_id: str | None = None,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        s = self._settings = ProducerSettings(
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            buffer_bytes=buffer_bytes,
            max_block_ms=max_block_ms,
            compression=compression,
            acks=acks,
            idempotence=idempotence,
            retries=retries,
            delivery_timeout_ms=delivery_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            max_in_flight_per_partition=max_in_flight_per_partition,
            pipeline_partial_batches=pipeline_partial_batches,
            request_timeout_ms=request_timeout_ms,
            max_request_bytes=max_request_bytes,
            metadata_max_age_ms=metadata_max_age_ms,
            connect_timeout_ms=connect_timeout_ms,
            writer_id=writer_id,
        )
        self._writer = s.writer_id
        self._addr = addr if isinstance(addr, str) else ",".join(addr)

        def connect(address: Addresses) -> Transport:
            return Transport(
                address,
                request_timeout_s=s.request_timeout_ms / 1000,
                connect_timeout_s=s.connect_timeout_ms / 1000,
                max_in_flight=MAX_REQUESTS_IN_FLIGHT + 4,  # and metadata, producer id
                tls=tls,
                credentials=credentials,
            )

        self._transport = connect(addr)
        #: Each partition's leader in a cluster (its produce requests go there).
        self._router = Router(self._transport, connect)
        self._codec = s.codec
        self._acks = s.acks_value
        self._idempotent = s.idempotence
        self._session = Session.NEEDS_ID if s.idempotence else Session.DISABLED
        self.producer_id = -1
        self.producer_epoch = -1
        self._fatal: TidewireError | None = None
        self._topics: dict[str, _Topic] = {}
        self._acc: Accumulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._blocking = False
        self._wake = asyncio.Event()
        #: A lone message's batch leaves from its ``send`` (see :meth:`_send_now`): with
        #: ``linger_ms=0`` on the asyncio twin, where a batch may go as soon as it opens.
        self._inline = s.linger_ms == 0 and self._writer is None
        #: True while ``send`` appends (a batch that opens then is sent by ``send`` itself,
        #: not by the sender task), and whether one did.
        self._deferring = False
        self._ready = False
        self._space = asyncio.Event()
        self._on_space: list[Any] = []  # the blocking twin's condition, when it has one
        self._meta_lock = asyncio.Lock()
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._flying: set[ProducerBatch] = set()
        self._requests = 0  # produce requests in flight
        self._slow = 0  # of which sent by a task (Transport.request), not request_soon
        self._closing = False  # no more sends
        self._aborting = False  # no more retries
        self._closed = False
        self._refresh_at = 0.0
        self._identified = asyncio.Event()  # set once the session is READY or FATAL
        self._sticky_start: dict[str, int] = {}  # a writer's first partition per topic
        #: The compiled path of ``send`` (messages without headers, partition or timestamp),
        #: or None: the pure codec; a writer, which routes unkeyed records by count and skips
        #: what an earlier instance stored; and once closing or failed (then the Python path
        #: raises).
        self._append_routed = _append_routed if self._writer is None else None

    # --- lifecycle ----------------------------------------------------------------------------

    def _bind(self, *, blocking: bool = False) -> Accumulator:
        """Attach to the running loop and start the sender (on first use)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._blocking = blocking
        if blocking:
            self._inline = False  # a send from another thread never sends from its own step

            def new_future() -> BatchFuture:
                return concurrent.futures.Future()

            def wake() -> None:
                loop.call_soon_threadsafe(self._wake.set)
        else:
            new_future = loop.create_future
            wake = self._batch_ready
        self._acc = Accumulator(
            batch_bytes=self._settings.batch_bytes,
            buffer_bytes=self._settings.buffer_bytes,
            linger_s=self._settings.linger_ms / 1000,
            new_future=new_future,
            wake=wake,
            on_release=self._released,
            threadsafe=blocking,
            by_size=self._writer is not None,
        )
        self._sender = self._spawn(self._run_sender(), "tidewire producer sender")
        return self._acc

    def _batch_ready(self) -> None:
        """The accumulator opened or closed a batch (the asyncio twin, on the loop's thread):
        wake the sender, unless ``send`` ships it itself (:meth:`_send_now`)."""
        if self._deferring:
            self._ready = True
        else:
            self._wake.set()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("producer task %s failed", task.get_name(), exc_info=task.exception())

    async def __aenter__(self) -> AsyncProducer:
        if self._acc is None:
            self._bind()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> Session:
        """The idempotent session's state."""
        return self._session

    @property
    def failure(self) -> TidewireError | None:
        """The error that failed the producer (every later send raises it), or None."""
        return self._fatal

    async def send_values(
        self, topic: str, values: Sequence[bytes | None], *, timestamp: int | None = None
    ) -> None:
        """Queue many unkeyed values at once (no futures: :meth:`flush`, then
        :attr:`failure`, tell whether they were stored): several times cheaper per message
        than :meth:`send`. They are routed as :meth:`send` routes unkeyed messages.

        Raises:
            as :meth:`send`.
        """
        acc = self._acc or self._bind()
        ts = _time_ns() // 1_000_000 if timestamp is None else timestamp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.max_block_ms / 1000
        i, refreshed = 0, False
        while i < len(values):
            self._space.clear()
            got = self._append_values(acc, topic, values, i, ts)
            if got == _NEED_METADATA:
                if refreshed:
                    raise self._no_partition(topic, None)
                await self._load_topic(topic, self._metadata_wait_s(deadline - loop.time()))
                refreshed = True
                continue
            if got < len(values):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._buffer_full(len(values[got] or b""))
                try:
                    async with asyncio.timeout(remaining):
                        await self._space.wait()
                except TimeoutError:
                    raise self._buffer_full(len(values[got] or b"")) from None
            else:
                await asyncio.sleep(0)  # let the sender ship the full batches
            i = got

    @property
    def skipped(self) -> int:
        """A writer's records skipped so far because an earlier instance stored them."""
        acc = self._acc
        return 0 if acc is None else sum(s.skipped for s in acc.partitions.values())

    def _move(self, to: Session) -> None:
        if to not in TRANSITIONS[self._session]:
            raise RuntimeError(f"producer session: {self._session.name} -> {to.name}")
        self._session = to

    # --- send ---------------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> RecordFuture:
        """Queue one message; return its future (``await`` it for the
        :class:`RecordMetadata`).

        The partition: ``partition`` if given; else ``fnv1a_32(key) % partitions`` for a
        keyed message; else unkeyed messages fill one partition's batch and then move on to
        the next partition (round robin per batch).

        Args:
            topic: the topic (created on first publish if the broker does that).
            value: the payload (None: a null value).
            key: the key (routes the message, and is stored with it).
            headers: ``(str, bytes | None)`` pairs.
            partition: an explicit partition.
            timestamp: ms since the epoch (default: now).

        Raises:
            BufferFullError: no room in ``buffer_bytes`` within ``max_block_ms``.
            BatchTooLargeError: the message alone is larger than the topic accepts.
            UnknownTopicError: no such topic, and the broker does not create it.
            UnknownPartitionError: ``partition`` is not one of the topic's.
            ProducerClosedError: the producer is closing or closed.
            ProducerFencedError, OutOfOrderSequenceError: the producer failed earlier.
            TypeError: an argument of the wrong type.
        """
        acc = self._acc or self._bind()
        t = _tracer()  # None without an OpenTelemetry SDK: nothing else is done for tracing
        if t is not None:
            return await self._send_traced(t, acc, topic, value, key, headers, partition, timestamp)
        if (
            (routed := self._append_routed) is not None  # first: the pure codec's one check
            and headers is None
            and partition is None
            and timestamp is None
        ):
            # The common case, a message into the open batch it is routed to (an unkeyed one:
            # its topic's sticky partition), in one compiled call (None: the path below has
            # more to do).
            fut = routed(self._topics, topic, key, value, _time_ns(), acc, RecordFuture)
            if fut is not None:
                if self._wake.is_set():
                    await asyncio.sleep(0)  # as below
                return fut  # type: ignore[no-any-return]
        self._deferring = self._inline
        got: tuple[ProducerBatch, int, int] | int | None = None
        sent = False
        try:
            got = self._append(acc, topic, value, key, headers, partition, timestamp)
        finally:
            self._deferring = False
            if self._ready:
                # The message opened a batch (linger 0): it leaves from this step, when nothing
                # stands in its way (the sender task's loop turn saved: a lone message's
                # latency). Else the sender ships it, or the batch that closed before an error.
                self._ready = False
                sent = type(got) is tuple and self._send_now()
                if not sent:
                    self._wake.set()
        if sent:  # got is the batch and index: only a tuple is sent from here
            return _new_tuple(RecordFuture, cast("tuple[ProducerBatch, int, int]", got))
        if type(got) is tuple:
            if self._wake.is_set():
                # A batch is ready: let the sender ship it now. A caller that sends in a
                # tight loop would otherwise fill the whole buffer before anything leaves.
                await asyncio.sleep(0)
            return _new_tuple(RecordFuture, got)
        return RecordFuture(
            *(
                await self._send_slowly(
                    acc,
                    topic,
                    value,
                    key=key,
                    headers=headers,
                    partition=partition,
                    timestamp=timestamp,
                )
            )
        )

    async def _send_traced(  # noqa: PLR0917
        self,
        t: Tracer,
        acc: Accumulator,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        partition: int | None,
        timestamp: int | None,
    ) -> RecordFuture:
        """:meth:`send` with a publish span, its context written into the headers."""
        span, headers = _tracing.start_publish(t, topic, headers, partition, self._addr)
        try:
            got = self._append(acc, topic, value, key, headers, partition, timestamp)
            if type(got) is tuple:
                if self._wake.is_set():
                    await asyncio.sleep(0)
            else:
                got = await self._send_slowly(
                    acc,
                    topic,
                    value,
                    key=key,
                    headers=headers,
                    partition=partition,
                    timestamp=timestamp,
                )
        except BaseException as exc:
            _tracing.end_span(span, exc)
            raise
        batch, index, ts = got
        _tracing.finish_publish(span, batch.future, batch.state.partition, index)
        return RecordFuture(batch, index, ts)

    async def _send_slowly(
        self,
        acc: Accumulator,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        partition: int | None,
        timestamp: int | None,
    ) -> tuple[ProducerBatch, int, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.max_block_ms / 1000
        refreshed = False
        while True:
            self._space.clear()
            got = self._append(acc, topic, value, key, headers, partition, timestamp)
            if isinstance(got, tuple):
                return got
            if got == _NEED_METADATA:
                if refreshed:
                    raise self._no_partition(topic, partition)
                await self._load_topic(topic, self._metadata_wait_s(deadline - loop.time()))
                refreshed = True
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._buffer_full(got)
            try:
                async with asyncio.timeout(remaining):
                    await self._space.wait()
            except TimeoutError:
                raise self._buffer_full(got) from None

    def _buffer_full(self, need: int) -> BufferFullError:
        s = self._settings
        return BufferFullError(
            f"buffer_bytes={s.buffer_bytes:,} stayed full for max_block_ms={s.max_block_ms:,}: "
            f"a message of {need:,} bytes found no room"
        )

    def _no_partition(self, topic: str, partition: int | None) -> TidewireError:
        meta = self._topics.get(topic)
        n = len(meta.partitions) if meta else 0
        return UnknownPartitionError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")

    def _append(  # noqa: PLR0917 (the hot path: positional arguments cost least)
        self,
        acc: Accumulator,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        partition: int | None,
        timestamp: int | None,
    ) -> tuple[ProducerBatch, int, int] | int:
        """The hot path of ``send`` (both twins; any thread): the batch and index, or the
        bytes it waits for, or ``_NEED_METADATA``."""
        if self._closing or self._fatal is not None:
            raise self._refusal()
        if value is not None and value.__class__ is not bytes:
            value = _as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes(key, "key")
        hbytes = encode_headers(headers) if headers else _HEADERS_NONE
        if timestamp is None:
            timestamp = _time_ns() // 1_000_000
        elif isinstance(timestamp, bool) or not isinstance(timestamp, int):
            raise TypeError(f"timestamp must be an int (ms), not {type(timestamp).__name__}")
        meta = self._topics.get(topic)
        if meta is None:
            if not isinstance(topic, str):
                raise TypeError(f"topic must be str, not {type(topic).__name__}")
            return _NEED_METADATA
        if key is None and partition is None and self._writer is not None:
            # A writer's unkeyed record: by its count, so that every instance agrees.
            partition = (meta.sticky + meta.unkeyed // WRITER_STICKY_RECORDS) % len(meta.partitions)
            meta.unkeyed += 1
        if key is None and partition is None:
            # Unkeyed: the sticky partition (the most common case, so the first branch).
            sticky = meta.sticky_batch
            if sticky is not None and sticky.state.open is not sticky:
                meta.sticky = (meta.sticky + 1) % len(meta.partitions)  # its batch was sent
                meta.sticky_batch = None
            got = acc.append(
                meta.partitions[meta.sticky], value, None, hbytes, timestamp, meta.limit, False
            )
            if type(got) is int:
                if got != ROLLED:
                    return got
                meta.sticky = (meta.sticky + 1) % len(meta.partitions)  # full: move on
                got = acc.append(
                    meta.partitions[meta.sticky], value, None, hbytes, timestamp, meta.limit
                )
                if type(got) is int:
                    return got
            batch, index = got  # type: ignore[misc]
            if batch is not sticky:
                meta.sticky_batch = batch
            return batch, index, timestamp
        parts = meta.partitions
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise TypeError(f"partition must be an int, not {type(partition).__name__}")
            if not 0 <= partition < len(parts):
                if partition < 0:
                    raise self._no_partition(topic, partition)
                return _NEED_METADATA  # the topic may have grown
            state = parts[partition]
        else:
            state = parts[fnv1a_32(key) % len(parts)]  # type: ignore[arg-type]
        if state.skipped < state.skip:  # a writer's record that the broker holds already
            state.skipped += 1
            assert state.stored is not None
            return state.stored, 0, timestamp
        got = acc.append(state, value, key, hbytes, timestamp, meta.limit)
        if type(got) is int:
            return got
        batch, index = got  # type: ignore[misc]
        return batch, index, timestamp

    def _append_values(
        self, acc: Accumulator, topic: str, values: Sequence[bytes | None], start: int, ts: int
    ) -> int:
        """The hot path of ``send_values`` (both twins): the index reached (less than
        ``len(values)`` when the buffer is full), or ``_NEED_METADATA``."""
        if self._closing or self._fatal is not None:
            raise self._refusal()
        meta = self._topics.get(topic)
        if meta is None:
            if not isinstance(topic, str):
                raise TypeError(f"topic must be str, not {type(topic).__name__}")
            return _NEED_METADATA
        n_parts = len(meta.partitions)
        writer = self._writer is not None
        i, total = start, len(values)
        while i < total:
            if writer:  # rotation by count, as send() routes a writer's unkeyed records
                k = meta.unkeyed % WRITER_STICKY_RECORDS
                state = meta.partitions[
                    (meta.sticky + meta.unkeyed // WRITER_STICKY_RECORDS) % n_parts
                ]
                end = min(i + WRITER_STICKY_RECORDS - k, total)
            else:
                sticky = meta.sticky_batch
                if sticky is not None and sticky.state.open is not sticky:
                    meta.sticky = (meta.sticky + 1) % n_parts  # its batch was sent
                    meta.sticky_batch = None
                state = meta.partitions[meta.sticky]
                end = total
            if state.skipped < state.skip:  # a writer's records the broker holds already
                k = min(state.skip - state.skipped, end - i)
                state.skipped += k
                meta.unkeyed += k
                i += k
                continue
            j = acc.append_values(state, values, i, end, ts, meta.limit)
            if writer:
                meta.unkeyed += j - i
            elif state.open is not None:
                meta.sticky_batch = state.open
            if j < end:
                return j
            i = j
        return i

    def _refusal(self) -> TidewireError:
        if self._fatal is not None:
            return type(self._fatal)(f"the producer failed earlier: {self._fatal.message}")
        return ProducerClosedError("the producer is closed")

    def _released(self) -> None:
        """Memory was released (on the loop's thread): buffer waiters may try again."""
        self._space.set()
        for cond in self._on_space:
            with cond:
                cond.notify_all()

    # --- metadata -----------------------------------------------------------------------------

    async def _load_topic(self, topic: str, timeout_s: float) -> None:
        """Learn ``topic``'s partitions, creating it by a publish if it does not exist.

        Raises:
            UnknownTopicError: it does not exist and the broker does not create it.
            BufferFullError: the wait took longer than ``max_block_ms``... as TimeoutError.
        """
        try:
            async with asyncio.timeout(max(timeout_s, 0)):
                async with self._meta_lock:
                    desc = (await self._describe([topic]))[topic]
                    if desc.error_code == UnknownTopicError.code:
                        await self._create_by_publish(topic)
                        desc = (await self._describe([topic]))[topic]
                    if desc.error_code:
                        raise for_code(desc.error_code)(desc.error_message)
                    if self._writer is not None:
                        if topic in self._topics:
                            return  # a writer reads a topic's partitions once
                        await self._learn_stored(desc)
                    self._learn(desc)
        except TimeoutError:
            s = self._settings
            limit = (
                f"max_block_ms={s.max_block_ms:,}"
                if s.max_block_ms
                else f"request_timeout_ms={s.request_timeout_ms:,} (max_block_ms=0)"
            )
            raise RequestTimedOutError(f"no metadata for topic {topic!r} within {limit}") from None

    def _metadata_wait_s(self, remaining_s: float) -> float:
        """How long ``send`` may wait for a topic's metadata: what is left of
        ``max_block_ms``; with ``max_block_ms=0`` (never wait for buffer room) a topic not
        known yet must still be looked up once, bounded by ``request_timeout_ms``."""
        s = self._settings
        return remaining_s if s.max_block_ms else s.request_timeout_ms / 1000

    async def _describe(self, topics: list[str]) -> dict[str, TopicDescription]:
        """The topics' metadata, and in a cluster their partitions' leaders (learned by the
        router: any node answers, the bootstrap connection's first)."""
        meta = await self._router.refresh(topics)
        return {t.name: t for t in meta.topics}

    async def _learn_stored(self, desc: TopicDescription) -> None:
        """A writer: ask what earlier instances stored in each partition of the topic, and
        continue its sequences there (the records up to there are skipped).

        Raises:
            TidewireError: the producer failed, or the broker could not answer.
        """
        await self._identified.wait()
        if self._fatal is not None:
            raise self._refusal()
        acc = self._acc
        assert acc is not None
        req = ProducerStateRequest(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            partitions=[GroupPartition(desc.name, p.partition) for p in desc.partitions],
        )
        response = await self._transport.request(req)
        assert response is not None
        body = response.body
        if body.error_code:
            raise for_code(body.error_code)(body.error_message)
        for r in body.results:
            if r.error_code:
                raise for_code(r.error_code)(r.error_message)
            state = acc.partition(r.topic, r.partition)
            stored = r.last_sequence + 1  # -1: nothing stored yet
            with acc.lock:
                state.skip = stored
                state.next_sequence = state.acked_sequence = stored % SEQUENCE_WRAP
            done = acc._new_future()
            done.set_result(-1)
            state.stored = ProducerBatch(state, done, time.monotonic())
        sticky = fnv1a_32(self._writer.encode()) if self._writer is not None else 0
        self._sticky_start[desc.name] = sticky % max(len(desc.partitions), 1)

    def _learn(self, desc: TopicDescription) -> None:
        acc = self._acc
        assert acc is not None
        limit = desc.config.max_message_bytes or MAX_BATCH_BYTES
        limit = min(limit, MAX_BATCH_BYTES)
        if self._codec.value:
            limit -= min(_COMPRESSION_SLACK, limit // 2)
        states = [acc.partition(desc.name, p.partition) for p in desc.partitions]
        old = self._topics.get(desc.name)
        if old is not None and len(old.partitions) == len(states) and old.limit == limit:
            return
        if self._writer is not None:
            sticky = self._sticky_start.get(desc.name, 0)
        elif old is None:
            sticky = random.randrange(len(states))
        else:
            sticky = old.sticky % len(states)
        self._topics[desc.name] = _Topic(states, limit, sticky)
        self._refresh_at = time.monotonic() + self._settings.metadata_max_age_ms / 1000

    async def _create_by_publish(self, topic: str) -> None:
        """Make the broker create ``topic`` as on a first publish (METADATA with
        ``auto_create``; CREATE_TOPIC would create it even where the broker's owner turned
        auto-creation off)."""
        response = await self._transport.request(MetadataRequest(topics=[topic], auto_create=True))
        assert response is not None
        (desc,) = response.body.topics
        if desc.error_code:
            raise for_code(desc.error_code)(desc.error_message)

    async def _refresh(self) -> None:
        """Refresh every known topic's partitions (a topic may have grown)."""
        names = list(self._topics)
        if not names:
            return
        async with self._meta_lock:
            for name, desc in (await self._describe(names)).items():
                if desc.error_code:
                    self._topics.pop(name, None)
                else:
                    self._learn(desc)

    # --- the sender -----------------------------------------------------------------------------

    def _drain(self, acc: Accumulator, now: float) -> float | None:
        """Send what may be sent now and fail what expired (a step of the sender, or of
        :meth:`_send_now`); when something queued becomes ready (None: nothing to wait for
        but an answer or a new record)."""
        s = self._settings
        free = MAX_REQUESTS_IN_FLIGHT - self._requests
        requests, expired, next_at = acc.drain(
            now,
            max_request_bytes=s.max_request_bytes,
            max_in_flight_per_partition=s.max_in_flight_per_partition,
            pipeline_partial=s.pipeline_partial_batches,
            max_requests=max(free, 0),
            sequences=self._idempotent,
            allow_new=self._session_open(),
            expire_before=now - s.delivery_timeout_ms / 1000,
        )
        for batch in expired:
            self._give_up(
                batch,
                RequestTimedOutError(
                    f"the message was not delivered within delivery_timeout_ms="
                    f"{s.delivery_timeout_ms:,}"
                ),
                in_flight=False,
            )
        for batch_list in requests:
            self._start_request(batch_list)
        return next_at

    def _send_now(self) -> bool:
        """Send the batch a ``send`` just opened from that ``send``'s own step (linger 0),
        as the sender task would have one loop turn later. Returns whether that left the
        sender nothing to do: every queued batch went (else the caller wakes it).

        Only in the steady state: a producer id known (or none needed), one node, and no
        metadata refresh due (the sender does those). Order is kept as the sender keeps it
        (the same drain: a partition's batches go in order, at most
        ``max_in_flight_per_partition`` in flight; a request goes by the task path while one
        of that path is on its way)."""
        acc = self._acc
        assert acc is not None
        if not self._session_open() or self._router.clustered:
            return False
        now = time.monotonic()
        if now >= self._refresh_at and self._topics and self._settings.metadata_max_age_ms:
            return False
        if self._drain(acc, now) is not None:
            return False
        # A batch held for its partition's answer needs no sender: that answer wakes it.
        return not acc.has_queued(unheld=True)

    def _sender_needed(self) -> None:
        """An answer came: wake the sender only if it has something to do (batches waiting
        for a free slot or a retry, a session to renew, a close waiting for the last
        answer): an idle sender is not run once per answer."""
        acc = self._acc
        if self._closing or not self._session_open() or acc is None or acc.has_queued():
            self._wake.set()

    def _session_open(self) -> bool:
        """Whether new batches may go: the producer id is known, or none is needed."""
        return self._session is Session.READY or self._session is Session.DISABLED

    async def _run_sender(self) -> None:
        acc = self._acc
        assert acc is not None
        s = self._settings
        while True:
            if self._session is Session.NEEDS_ID or (
                self._session is Session.NEEDS_BUMP and not acc.sent_unanswered()
            ):
                await self._init_producer_id()
                continue
            self._wake.clear()
            now = time.monotonic()
            next_at = self._drain(acc, now)
            if self._closing and acc.empty:
                return
            if (
                self._topics
                and s.metadata_max_age_ms
                and now >= self._refresh_at
                and self._writer is None
            ):
                self._refresh_at = now + s.metadata_max_age_ms / 1000
                self._spawn(self._refresh_quietly(), "tidewire producer metadata")
            timeout = None if next_at is None else max(next_at - now, 0.0)
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _refresh_quietly(self) -> None:
        try:
            await self._refresh()
        except TidewireError as exc:
            log.info("refreshing metadata failed (tried again later): %s", exc)

    async def _init_producer_id(self) -> None:
        """Ask for a producer id (or, to renew the epoch, for this id's next epoch)."""
        s = self._settings
        deadline = time.monotonic() + s.delivery_timeout_ms / 1000
        bump = self._session is Session.NEEDS_BUMP
        attempt = 0
        while True:
            attempt += 1
            try:
                if self._writer is not None:
                    req = InitProducerIdRequest(writer_id=self._writer)
                else:
                    req = InitProducerIdRequest(
                        producer_id=self.producer_id if bump else -1,
                        producer_epoch=self.producer_epoch if bump else -1,
                    )
                response = await self._transport.request(req)
                assert response is not None
                body = response.body
                if body.error_code:
                    raise for_code(body.error_code)(body.error_message)
            except UnknownApiError as exc:
                self._fail_fatally(
                    UnknownApiError(
                        "the broker does not serve INIT_PRODUCER_ID, which an idempotent "
                        f"producer needs ({exc.message}); use idempotence=False"
                    )
                )
                return
            except TidewireError as exc:
                if exc.retriable and not self._aborting and time.monotonic() < deadline:
                    await asyncio.sleep(self._backoff(attempt))
                    continue
                self._fail_fatally(exc)
                return
            self.producer_id, self.producer_epoch = body.producer_id, body.producer_epoch
            assert self._acc is not None
            if self._writer is None:  # a writer's sequences come from the broker
                self._acc.reset_sequences()
            self._move(Session.READY)
            self._identified.set()
            log.debug("producer id %d, epoch %d", self.producer_id, self.producer_epoch)
            return

    def _backoff(self, attempt: int) -> float:
        first = self._settings.retry_backoff_ms / 1000
        return float(min(first * 2 ** max(attempt - 1, 0), RETRY_BACKOFF_MAX_S))

    def _start_request(self, batches: list[ProducerBatch]) -> None:
        for batch in batches:
            batch.build(self._codec, self.producer_id, self.producer_epoch)
            self._flying.add(batch)
        router = self._router
        if not router.clustered:  # one node: one connection, the request as drained
            self._requests += 1
            if (
                self._acks != ACKS_NONE
                and not self._slow
                and self._transport.request_soon(
                    *self._request_of(batches),
                    lambda got: self._answered_soon(batches, got),
                    self._settings.request_timeout_ms / 1000,
                )
                is not None
            ):
                # Written in this step, answered from the read callback: no task, and the
                # batches are settled in the turn their answer is read (a lone message's
                # latency). Only while no request of the task path is on its way, which
                # could otherwise be overtaken (a partition's batches go in order).
                return
            self._slow += 1  # counted from here: the task writes its request a turn later
            self._spawn(self._produce(batches, self._transport), "tidewire produce")
            return
        # A cluster: a request per leader node, each holding that node's partitions.
        by_node: dict[int, list[ProducerBatch]] = {}
        for batch in batches:
            by_node.setdefault(router.leader(batch.state.topic, batch.state.partition), []).append(
                batch
            )
        for group in by_node.values():
            first = group[0].state
            transport = router.transport_for(first.topic, first.partition)
            self._requests += 1
            self._slow += 1
            self._spawn(self._produce(group, transport), "tidewire produce")

    def _request_of(
        self, batches: list[ProducerBatch]
    ) -> tuple[ProduceRequest, list[bytes | bytearray]]:
        data = [b.data or b"" for b in batches]
        req = ProduceRequest(
            acks=self._acks,
            timeout_ms=self._settings.request_timeout_ms,
            partitions=[
                ProducePartition(b.state.topic, b.state.partition, len(d))
                for b, d in zip(batches, data, strict=True)
            ],
        )
        return req, data

    def _answered_soon(
        self, batches: list[ProducerBatch], got: ResponseReceived | TidewireError
    ) -> None:
        """The answer to a request sent by ``request_soon`` (from the read callback): the
        batches' futures are settled first (their waiters run first in the next turn), then
        the sender is woken if it has anything to do."""
        self._requests -= 1
        try:
            if isinstance(got, TidewireError) or got.error is not None:
                if self._closed:
                    return  # the connection closed under it: close() fails them as closed
                exc = got if isinstance(got, TidewireError) else got.error
                assert exc is not None
                for batch in batches:
                    self._failed(batch, exc)
                return
            try:
                self._answered(batches, got)
            except Exception as exc:  # a bug: its batches fail with it, the transport logs it
                for batch in batches:
                    if batch in self._flying:
                        self._give_up(batch, exc, in_flight=True)
                raise
        finally:
            self._sender_needed()

    async def _produce(self, batches: list[ProducerBatch], transport: Transport) -> None:
        req, data = self._request_of(batches)
        try:
            response = await transport.request(req, data, expect_response=self._acks != ACKS_NONE)
        except TidewireError as exc:
            for batch in batches:
                self._failed(batch, exc)
            return
        except Exception as exc:  # a bug: its batches fail with it, the task logs it
            for batch in batches:
                self._give_up(batch, exc, in_flight=True)
            raise
        finally:
            self._slow -= 1
            self._requests -= 1
            self._wake.set()
        if response is None:  # acks=none
            for batch in batches:
                self._stored(batch, -1)
            return
        self._answered(batches, response)

    def _answered(self, batches: list[ProducerBatch], response: ResponseReceived) -> None:
        assert isinstance(response.body, ProduceResponse)
        for batch, result in zip(batches, response.body.results, strict=True):
            if result.error_code:
                self._failed(batch, for_code(result.error_code)(result.error_message))
            else:
                self._stored(batch, result.base_offset)

    def _stored(self, batch: ProducerBatch, base_offset: int) -> None:
        assert self._acc is not None
        self._flying.discard(batch)
        self._acc.finish(batch, in_flight=True, stored=True)
        if not batch.future.done():
            batch.future.set_result(base_offset)

    def _give_up(self, batch: ProducerBatch, exc: BaseException, *, in_flight: bool) -> None:
        assert self._acc is not None
        self._flying.discard(batch)
        self._acc.finish(batch, in_flight=in_flight, stored=False)
        if not batch.future.done():
            batch.future.set_exception(exc)
            _retrieved(batch.future)
        if batch.sent and self._session is Session.READY:
            # Stored or not, nobody knows: the partition's sequence has a hole the broker
            # would refuse. A new epoch starts every sequence at 0 again; a writer cannot
            # (its sequences count its records): a new instance of it resumes instead.
            if self._writer is not None:
                err = exc if isinstance(exc, TidewireError) else ProducerClosedError(str(exc))
                self._fail_fatally(type(err)(f"writer {self._writer!r}: {err.message}"))
            else:
                self._move(Session.NEEDS_BUMP)

    def _failed(self, batch: ProducerBatch, exc: TidewireError) -> None:
        """``batch`` came back with ``exc``: retry it, or fail it (and maybe the producer)."""
        assert self._acc is not None
        retriable = exc.retriable
        if self._idempotent:
            if isinstance(exc, DuplicateSequenceError):
                self._stored(batch, -1)  # stored long ago; its offset is no longer known
                return
            if isinstance(exc, OutOfOrderSequenceError):
                # A batch before it is not stored yet (failed, or still on its way): it goes
                # again after that one. Only the next batch the broker expects is fatal.
                retriable = batch.base_sequence != batch.state.acked_sequence
            if not retriable and isinstance(exc, OutOfOrderSequenceError | ProducerFencedError):
                self._give_up(batch, exc, in_flight=True)
                self._fail_fatally(exc)
                return
        if isinstance(exc, UnknownTopicError | UnknownPartitionError):
            self._topics.pop(batch.state.topic, None)
        router = self._router
        lost = leader_lost(exc, router.clustered)
        if lost:
            # The partition's leader moved or is gone: ask the metadata for the new one; the
            # retry below goes to it (an idempotent batch with the same sequence numbers,
            # which a leader that has it already answers as a duplicate).
            router.forget(batch.state.topic, batch.state.partition)
            router.refresh_soon({*self._topics, batch.state.topic})
            if isinstance(exc, PartitionOfflineError):
                retriable = True  # an election is under way
        now = time.monotonic()
        if (
            retriable
            and batch.attempts <= self._settings.retries
            and now < batch.created + self._settings.delivery_timeout_ms / 1000
            and not self._aborting
            and self._session in (Session.DISABLED, Session.READY)
        ):
            self._flying.discard(batch)
            delay = self._backoff(batch.attempts)
            if lost:  # poll for the new leader at the routing pace, not the slower backoff
                delay = min(delay, backoff_s(batch.attempts))
            self._acc.retry(batch, now + delay)
            log.debug("retrying %r after %s", batch, exc)
        else:
            self._give_up(batch, exc, in_flight=True)

    def _fail_fatally(self, exc: TidewireError) -> None:
        if self._session is not Session.FATAL:
            self._move(Session.FATAL)
        self._fatal = exc
        self._append_routed = None  # every later send fails, by the Python path
        self._identified.set()
        log.error("producer failed: %s", exc)
        assert self._acc is not None
        for batch in self._acc.take_all():
            self._give_up(batch, type(exc)(exc.message), in_flight=False)

    # --- flush and close --------------------------------------------------------------------

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send every message queued so far at once and wait until each is answered
        (stored, or failed: see each message's future).

        Raises:
            TimeoutError: not all answered within ``timeout_s``.
        """
        acc = self._acc
        if acc is None:
            return
        acc.seal_open()
        waiting = [b.future for b in acc.pending()] + [b.future for b in self._flying]
        self._wake.set()
        if not waiting:
            return
        futs = [f if isinstance(f, asyncio.Future) else asyncio.wrap_future(f) for f in waiting]
        _, pending = await asyncio.wait(futs, timeout=timeout_s)
        if pending:
            raise TimeoutError(f"{len(pending):,} batches not answered within {timeout_s:g} s")

    async def close(self, *, flush: bool = True, timeout_s: float | None = None) -> None:
        """Stop accepting messages; send and wait for the queued ones (``flush=True``) or
        fail them with ``ProducerClosedError`` (``flush=False``); close the connection.

        ``timeout_s`` bounds the flush: what is still unanswered then fails. Idempotent.
        """
        if self._closed:
            return
        self._closing = True
        self._append_routed = None  # later sends fail, by the Python path
        acc = self._acc
        try:
            if acc is not None and flush and self._fatal is None:
                try:
                    await self.flush(timeout_s)
                except TimeoutError:
                    log.warning("close: messages still unanswered after %g s fail", timeout_s)
            self._aborting = True
            if acc is not None:
                for batch in acc.take_all():
                    self._give_up(
                        batch,
                        ProducerClosedError("the producer was closed before the message was sent"),
                        in_flight=False,
                    )
                self._wake.set()
                if self._sender is not None:
                    bound = self._settings.request_timeout_ms / 1000 + 1
                    try:
                        await asyncio.wait_for(asyncio.shield(self._sender), bound)
                    except TimeoutError:
                        log.warning("close: produce requests still unanswered after %g s", bound)
        finally:
            self._closed = True
            await self._router.close()
            await self._transport.close()  # fails whatever is still in flight
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks))
            for batch in list(self._flying):
                self._give_up(batch, ProducerClosedError("the producer was closed"), in_flight=True)

    @property
    def throttle_time_ms_total(self) -> int:
        """How long the broker held this producer's produce answers back in all (ms), because
        its principal was over a quota (0: never throttled)."""
        return self._router.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """What this producer's routing did: metadata refreshes, NotLeader retries and leader
        moves followed (a copy; see :class:`~tidewire.client.RoutingStats`)."""
        return self._router.stats_copy()

    @property
    def closed(self) -> bool:
        return self._closed
