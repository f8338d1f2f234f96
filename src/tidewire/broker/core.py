"""The broker core: topics of partitioned logs, produce, fetch with long-poll, offsets.

One :class:`Broker` owns a :class:`~tidewire.storage.LogManager` and runs on one event loop;
the TCP server, the HTTP gateway and the embedded mode all call it. A topic is the set of
partition logs ``TOPIC-0`` .. ``TOPIC-(N-1)`` of the data directory; its settings are those of
its logs (:class:`~tidewire.storage.LogConfig`).

What a consumer may read: under ``fsync=always`` only what is on stable storage (the flushed
offset: the high watermark), so nothing a consumer saw can vanish in a power cut; under the
other policies everything written.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tidewire._tasks import cancel_and_wait
from tidewire.broker.consumer_groups import ConsumerGroups
from tidewire.broker.groups import GroupConfig, GroupCoordinator
from tidewire.broker.kafka_groups import KafkaGroupConfig, KafkaGroupCoordinator
from tidewire.broker.offsets import QUEUE_DEFINITIONS_TOPIC, OffsetStore, is_internal_topic
from tidewire.broker.producers import (
    MAX_EPOCH,
    NODE_ID_SHIFT,
    PRODUCER_IDS_FILE,
    SNAPSHOT_FILE,
    PartitionProducers,
    ProducerIds,
    StoredBatch,
    decode_snapshot,
    encode_snapshot,
    is_writer,
    node_id_floor,
    writer_producer_id,
)
from tidewire.broker.queues.manager import QueueManager
from tidewire.broker.streams.manager import StreamManager
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    InternalTopicError,
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    LogExistsError,
    LogNotFoundError,
    NotEnoughReplicasError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionCorruptError,
    PartitionOfflineError,
    ProducerFencedError,
    StorageError,
    TidewireError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.records import BatchHeader, iter_batches
from tidewire.security._logs import SECURITY_TOPIC
from tidewire.security.audit import AuditLog
from tidewire.security.config import SecurityConfig
from tidewire.security.store import SecurityStore
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, PartitionLog
from tidewire.storage.damage import Damage
from tidewire.storage.filecache import open_descriptors, raise_descriptor_limit
from tidewire.storage.fs import write_atomic_many
from tidewire.storage.log import (
    DEFAULT_PREALLOCATE_BYTES,
    AppendInfo,
    check_appendable,
    check_preallocate_bytes,
)
from tidewire.storage.manager import MAX_PARTITION, validate_topic_name

if TYPE_CHECKING:
    from tidewire.cluster.replication import ReplicaManager

__all__ = [
    "Broker",
    "BrokerConfig",
    "BrokerStats",
    "FetchResult",
    "PartitionStatus",
    "ProduceResult",
    "RepairOutcome",
    "StorageProblem",
    "Waiter",
]

log = logging.getLogger("tidewire.broker")

#: Released writers remembered (newest first out), so that a late attempt of a task whose job
#: committed is refused instead of writing its records again. A released writer's attempts
#: end within seconds; this many covers thousands of tasks a second for a minute.
MAX_RELEASED_WRITERS = 100_000
#: Writer ids in one release, and partitions in one producer-state question.
MAX_WRITERS_PER_RELEASE = 10_000
MAX_PARTITIONS_PER_STATE = 10_000
#: Partitions of all topics together, by default: each costs memory (its indexes, its state)
#: and a directory; 100,000 is ten times what the benchmark measures (docs/storage.md).
DEFAULT_MAX_PARTITIONS = 100_000
#: Log files kept open at most when max_open_files is 0 (a quarter of the descriptor limit
#: otherwise): enough for the active segment of 10,000 busy partitions.
MAX_DEFAULT_OPEN_FILES = 10_000
#: ... and at least: below that, reopening would be constant.
MIN_OPEN_FILES = 32
#: What one fetch answer carries at most by default: the clients' own default request size;
#: larger answers buy little throughput, while each is held in memory whole until sent.
DEFAULT_FETCH_MAX_BYTES = 16 * 1024 * 1024
#: The highest fetch_max_bytes allowed: a frame's length is an int32.
MAX_FETCH_MAX_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Settings of one broker.

    Attributes:
        data_dir: where the logs live.
        default_partitions: partitions of a topic created without a count.
        auto_create_topics: create a topic on its first publish.
        log: settings of new topics' logs (retention, segments, fsync policy, the largest
            batch accepted: ``max_batch_bytes``).
        max_fetch_waiters: long-poll fetches waiting at once; more are refused with
            :class:`~tidewire.errors.BackpressureError`.
        max_wait_ms: the longest a fetch may wait for data.
        fetch_max_bytes: the most data one fetch answer carries, whatever it asks for (one
            batch larger than that is still sent whole, alone). Each answer is held in memory
            whole until it is sent, so this bounds what one request can make the broker hold.
        producer_expiration_ms: an idempotent producer that has not written to a partition
            for this long is forgotten there (its next batch may start at any sequence).
        producer_snapshot_interval_ms: how often the state of idempotent producers is
            snapshotted (it is also snapshotted at a clean shutdown), which bounds how much
            of each log a start after a crash reads to rebuild it.
        groups: the consumer group coordinator's bounds.
        kafka_groups: the bounds and initial rebalance delay of Kafka clients' groups.
        max_open_files: log files (segments) kept open at once; idle ones are closed and
            opened again when used. 0: a quarter of the descriptor limit, at most
            :data:`MAX_DEFAULT_OPEN_FILES`.
        max_partitions: partitions of all topics together; a creation beyond is refused.
        preallocate_bytes: zeros written ahead of the appends of a busy ``fsync=always``
            partition, so that its fsyncs need not grow the file (0: never; see
            ``docs/storage.md``, "Zeros written ahead"). Applies to every log.
        stream_partitions: partitions of ``__streams``, the shared log of persistent stream
            messages (fixed when it is first created).
        stream_segment_bytes: segment size of ``__streams`` (expired segments are deleted
            whole).
        stream_default_ttl_ms: the TTL of a stream message sent without one.
        stream_max_ttl_ms: the longest TTL a stream message may ask for.
        stream_ring_size: messages that may wait in a stream for a receiver (beyond the
            receivers waiting), unless its first request said otherwise.
        stream_idle_ms: an empty stream nobody waits on is forgotten after this long.
        stream_dedup_window: uuids remembered per stream for deduplication.
        stream_max_count: streams at once; a send or receive creating more is refused.
        stream_max_receivers: stream receives and reads waiting at once.
        stream_max_wait_ms: the longest a stream receive, read or blocked send may wait.
        stream_max_message_bytes: the largest stream message value.
    """

    data_dir: str
    default_partitions: int = 1
    auto_create_topics: bool = True
    log: LogConfig = field(default_factory=LogConfig)
    max_fetch_waiters: int = 10_000
    max_wait_ms: int = 30_000
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    producer_expiration_ms: int = 7 * 24 * 3600 * 1000
    producer_snapshot_interval_ms: int = 60_000
    groups: GroupConfig = field(default_factory=GroupConfig)
    kafka_groups: KafkaGroupConfig = field(default_factory=KafkaGroupConfig)
    max_open_files: int = 0
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES
    stream_partitions: int = 4
    stream_segment_bytes: int = 16 * 1024 * 1024
    stream_default_ttl_ms: int = 24 * 3600 * 1000
    stream_max_ttl_ms: int = 30 * 24 * 3600 * 1000
    stream_ring_size: int = 100
    stream_idle_ms: int = 60_000
    stream_dedup_window: int = 1_000
    stream_max_count: int = 10_000_000
    stream_max_receivers: int = 200_000
    stream_max_wait_ms: int = 300_000
    stream_max_message_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        self._check_streams()
        if self.max_open_files < 0:
            raise InvalidConfigError(
                f"max_open_files={self.max_open_files} must be >= 0 (0: from the descriptor limit)"
            )
        if self.max_partitions < 1:
            raise InvalidConfigError(f"max_partitions={self.max_partitions} must be >= 1")
        check_preallocate_bytes(self.preallocate_bytes)
        if not 1 <= self.default_partitions <= MAX_PARTITION:
            raise InvalidConfigError(
                f"default_partitions={self.default_partitions} must be within 1..{MAX_PARTITION:,}"
            )
        if self.max_fetch_waiters < 1:
            raise InvalidConfigError("max_fetch_waiters must be >= 1")
        if not 0 <= self.max_wait_ms <= 3_600_000:
            raise InvalidConfigError(f"max_wait_ms={self.max_wait_ms} must be within 0..3,600,000")
        if not 1024 <= self.fetch_max_bytes <= MAX_FETCH_MAX_BYTES:
            raise InvalidConfigError(
                f"fetch_max_bytes={self.fetch_max_bytes:,} must be within "
                f"1,024..{MAX_FETCH_MAX_BYTES:,}"
            )
        if self.producer_expiration_ms < 1:
            raise InvalidConfigError("producer_expiration_ms must be >= 1")
        if self.producer_snapshot_interval_ms < 1:
            raise InvalidConfigError("producer_snapshot_interval_ms must be >= 1")

    def _check_streams(self) -> None:
        bounds = (
            ("stream_partitions", self.stream_partitions, 1, 1024),
            ("stream_segment_bytes", self.stream_segment_bytes, 1024, 1 << 30),
            ("stream_max_ttl_ms", self.stream_max_ttl_ms, 1, 10 * 365 * 24 * 3600 * 1000),
            ("stream_default_ttl_ms", self.stream_default_ttl_ms, 1, self.stream_max_ttl_ms),
            ("stream_ring_size", self.stream_ring_size, 0, 1_000_000),
            ("stream_idle_ms", self.stream_idle_ms, 0, 365 * 24 * 3600 * 1000),
            ("stream_dedup_window", self.stream_dedup_window, 0, 1_000_000),
            ("stream_max_count", self.stream_max_count, 1, 1 << 40),
            ("stream_max_receivers", self.stream_max_receivers, 1, 100_000_000),
            ("stream_max_wait_ms", self.stream_max_wait_ms, 0, 3_600_000),
            ("stream_max_message_bytes", self.stream_max_message_bytes, 1, 256 * 1024 * 1024),
        )
        for name, value, lo, hi in bounds:
            if not lo <= value <= hi:
                raise InvalidConfigError(f"{name}={value:,} must be within {lo:,}..{hi:,}")


@dataclass(slots=True)
class BrokerStats:
    """Messages counted since the broker started (readable by an embedding program:
    :meth:`tidewire.embedded.EmbeddedBroker.stats`).

    - ``published``: messages appended to the logs (a retried idempotent batch stored once
      counts once);
    - ``delivered``: messages handed to readers over the binary protocol, by fetch (pull,
      group consumers) and by push subscriptions; a message read by three readers counts
      three times;
    - ``dropped``: messages a best-effort push subscription skipped because it lagged more
      than its ``max_lag_bytes``. Nothing else is ever dropped: a slow reader lags (its
      messages wait in the log) instead.
    """

    published: int = 0
    delivered: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """Where a produce request's batches for one partition were stored."""

    base_offset: int
    last_offset: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One partition's part of a fetch: whole batches, as stored."""

    topic: str
    partition: int
    data: bytes
    next_offset: int
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    damage: tuple[Damage, ...] = ()  # damaged ranges, quarantined ones included
    offline: str | None = None  # why the partition could not be opened, or None


@dataclass(frozen=True, slots=True)
class StorageProblem:
    """What a partition does not serve: ``kind`` is ``damaged`` (offsets ``start`` ..
    ``end - 1`` are refused), ``quarantined`` (read past as a gap; ``file`` holds the bytes)
    or ``offline`` (the partition could not be opened; ``reason`` says why)."""

    topic: str
    partition: int
    kind: str
    start: int = -1
    end: int = -1
    size_bytes: int = 0
    file: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RepairOutcome:
    """One damaged range and what :meth:`Broker.repair` did to it (``action``: ``none``,
    ``quarantined``, ``truncated``)."""

    partition: int
    damage: Damage
    action: str
    removed_offsets: int = 0
    removed_bytes: int = 0
    log_end_offset: int = -1


class Broker:
    """The broker's state and operations. Use as ``async with Broker(config) as broker``.

    Args:
        config: the broker's settings.
        audit_retention_ms: how long the audit log keeps its records (-1: forever).
    """

    def __init__(
        self,
        config: BrokerConfig,
        *,
        security: SecurityConfig | None = None,
        audit_retention_ms: int | None = None,
    ) -> None:
        self.config = config
        #: Authentication, authorization, audit and quota settings.
        self.security_config = security if security is not None else SecurityConfig()
        self.audit_retention_ms = (
            audit_retention_ms
            if audit_retention_ms is not None
            else self.security_config.audit_retention_ms
        )
        #: The audit log (while the broker runs): who did what, allowed or denied.
        self.audit: AuditLog | None = None
        self.descriptors_before, self.descriptor_limit = raise_descriptor_limit()
        #: The log files kept open at most (see BrokerConfig.max_open_files).
        self.max_open_files = config.max_open_files or max(
            MIN_OPEN_FILES, min(MAX_DEFAULT_OPEN_FILES, self.descriptor_limit // 4)
        )
        self.logs = LogManager(
            config.data_dir,
            default_config=config.log,
            max_open_files=self.max_open_files,
            preallocate_bytes=config.preallocate_bytes,
        )
        #: Principals, keys, ACLs and quotas (the __security log), loaded by start().
        self.security = SecurityStore(self.logs, self.security_config)
        self.bootstrap_key_file: Path | None = None
        #: Per partition, what waits for its next append: futures (a fetch's task, a
        #: subscription), or :class:`ParkedFetch` (a fetch waiting without a task).
        self._waiters: dict[tuple[str, int], set[Waiter]] = {}
        self._n_waiters = 0
        self._closing = False
        self._releases = 0  # bumped by release_waiters(): fetches waiting then return
        self._maintenance: asyncio.Task[None] | None = None
        self._producer_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._producers: dict[tuple[str, int], PartitionProducers] = {}
        self._epochs: dict[int, int] = {}  # producer id -> newest epoch known
        #: In a cluster: tells the other nodes of an epoch bump made here (producer id, new
        #: epoch) before it is answered; None on a single node.
        self.on_epoch_bump: Callable[[int, int], Awaitable[None]] | None = None
        #: In a cluster: the cluster's topics and partition counts, from its metadata (see
        #: :meth:`group_topics`); None on a single node.
        self.cluster_topics: Callable[[], dict[str, int]] | None = None
        self._ids: ProducerIds | None = None
        self._ids_lock = asyncio.Lock()
        self._snapshot_lock = threading.Lock()
        self._released: OrderedDict[int, None] = OrderedDict()  # writers' producer ids
        self._groups: ConsumerGroups | None = None
        self._group_task: asyncio.Task[None] | None = None
        self._queues: QueueManager | None = None
        self._queue_task: asyncio.Task[None] | None = None
        #: The clock queues use (ms since the epoch); tests set a fake one before start().
        self.queue_clock: Callable[[], int] | None = None
        self._streams: StreamManager | None = None
        self._stream_task: asyncio.Task[None] | None = None
        #: The clock streams use (ms since the epoch); tests set a fake one before start().
        self.stream_clock: Callable[[], int] | None = None
        self.stats = BrokerStats()
        #: Replication (cluster mode: set by the node layer before serving); None on a single
        #: node, where this node leads everything it holds and nothing waits for replicas.
        self.replication: ReplicaManager | None = None
        #: The loop the broker was started on (asked once: each ``get_running_loop`` is a
        #: ``getpid`` system call on CPython 3.11, once a produce request on the fast path).
        self._loop: asyncio.AbstractEventLoop | None = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop: the one the broker was started on while it runs (an attribute
        check, no system call), else asked again (a broker used from another loop)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the data directory (recovering it) and start the background work."""
        self.logs.open()
        raised = (
            f" (raised from {self.descriptors_before:,})"
            if self.descriptors_before < self.descriptor_limit
            else ""
        )
        log.info(
            "descriptors: limit %s%s, %s open; log files keep at most %s open",
            f"{self.descriptor_limit:,}",
            raised,
            open_descriptors(),
            f"{self.max_open_files:,}",
        )
        try:
            self._load_producers()
            offsets = OffsetStore(self.logs)
            offsets.load()
            # Made here, as the offsets are: on the log manager the broker runs with.
            self.security = SecurityStore(self.logs, self.security_config)
            self.security.load()
            self.audit = AuditLog(self.logs, self.audit_retention_ms)
            self.audit.start()
            queues = QueueManager(self, clock=self.queue_clock)
            queues.load()
            streams = StreamManager(self, clock=self.stream_clock)
            streams.load()
        except BaseException:
            self.logs.close()
            raise
        coordinator = GroupCoordinator(self.group_topics, self.config.groups)
        self._groups = ConsumerGroups(
            coordinator,
            offsets,
            self.group_topics,
            self.list_offset,
            kafka_config=self.config.kafka_groups,
        )
        loop = self._loop = asyncio.get_running_loop()
        self._maintenance = loop.create_task(self.logs.run(), name="log maintenance")
        self._maintenance.add_done_callback(_log_task_failure)
        self._producer_task = loop.create_task(self._producer_upkeep(), name="producer upkeep")
        self._producer_task.add_done_callback(_log_task_failure)
        self._group_task = loop.create_task(self._group_upkeep(), name="group upkeep")
        self._group_task.add_done_callback(_log_task_failure)
        self._queues = queues
        self._queue_task = loop.create_task(queues.run(), name="queue timers")
        self._queue_task.add_done_callback(_log_task_failure)
        self._streams = streams
        self._stream_task = loop.create_task(streams.run(), name="stream timers")
        self._stream_task.add_done_callback(_log_task_failure)
        # Where the first start with authentication on left the first superuser's key.
        self.bootstrap_key_file = await self.security.bootstrap(Path(self.config.data_dir))

    @property
    def groups(self) -> ConsumerGroups:
        """The consumer groups (while the broker runs).

        Raises:
            InvalidRequestError: the broker is not running.
        """
        if self._groups is None:
            raise InvalidRequestError("the broker is not running")
        return self._groups

    @property
    def kafka_groups(self) -> KafkaGroupCoordinator:
        """The groups of Kafka clients (Kafka's classic group protocol; while the broker
        runs). Their committed offsets are in :attr:`groups`' offsets log.

        Raises:
            InvalidRequestError: the broker is not running.
        """
        return self.groups.kafka

    @property
    def queues(self) -> QueueManager:
        """The queues and exchanges (while the broker runs).

        Raises:
            InvalidRequestError: the broker is not running.
        """
        if self._queues is None:
            raise InvalidRequestError("the broker is not running")
        return self._queues

    @property
    def streams(self) -> StreamManager:
        """The lightweight streams (while the broker runs).

        Raises:
            InvalidRequestError: the broker is not running.
        """
        if self._streams is None:
            raise InvalidRequestError("the broker is not running")
        return self._streams

    async def _group_upkeep(self) -> None:
        """Until cancelled: expire group members' sessions and end overdue rebalances."""
        period = self.config.groups.check_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            if self._groups is not None:
                self._groups.coordinator.tick()

    async def close(self) -> None:
        """Stop the background work, wake every waiting fetch, flush and close the logs."""
        self._closing = True  # a fetch woken from here on returns instead of waiting again
        if self.replication is not None:
            await self.replication.close()
        tasks = (
            self._maintenance,
            self._producer_task,
            self._group_task,
            self._queue_task,
            self._stream_task,
        )
        for task in tasks:
            if task is not None:
                # a task that failed was logged when it ended (_log_task_failure): the rest
                # of the shutdown goes on
                await cancel_and_wait(task, ignore=(Exception,))
        self._maintenance = self._producer_task = self._group_task = self._queue_task = None
        self._stream_task = None
        if self._streams is not None:
            await self._streams.close()
            self._streams = None
        if self._queues is not None:
            await self._queues.close()
            self._queues = None
        if self.audit is not None:
            await self.audit.close()
            self.audit = None
        if self._groups is not None:
            self._groups.coordinator.close()
            await self._groups.close()
            self._groups = None
        if self._background:  # fsyncs that make acks=leader batches visible: let them end
            await asyncio.gather(*self._background, return_exceptions=True)
        for futs in list(self._waiters.values()):
            for fut in list(futs):  # a parked fetch leaves the sets as it is woken
                if not fut.done():
                    fut.set_result(None)
        if self._ids is not None:  # started, and not closed before
            # Those that changed since the last were written (an unchanged one's file is
            # its state; its offset may be older, and the next start reads from there).
            self._write_snapshots(self._take_snapshots(only_changed=True))
            self._ids = None
        await self.logs.close_async()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- topics ---------------------------------------------------------------------------------

    def topics(self) -> dict[str, int]:
        """Topic name -> partition count (the broker's internal topics left out)."""
        logs = self.logs
        return {
            name: logs.partition_count(name)
            for name in logs.topic_names()
            if not is_internal_topic(name)
        }

    def group_topics(self) -> dict[str, int]:
        """What consumer groups resolve subscriptions against: topic name -> partition
        count. On a single node :meth:`topics`; in a cluster the cluster's topics (a group's
        coordinator need not hold a replica of every partition, or of any, of a topic its
        members read)."""
        source = self.cluster_topics
        return self.topics() if source is None else source()

    def _topics_changed(self) -> None:
        if self._groups is not None:
            self._groups.coordinator.topics_changed()

    def create_topic(
        self, name: str, partitions: int | None = None, config: LogConfig | None = None
    ) -> int:
        """Create a topic; return its partition count.

        Raises:
            InvalidTopicError: a bad name or partition count.
            InternalTopicError: an internal topic's name, or one beginning with ``__``.
            TopicExistsError: it exists.
            StorageError: its directories cannot be created.
        """
        n = self._check_new_topic(name, partitions)
        try:
            self.logs.create_topic(name, range(n), config or self.config.log)
        except LogExistsError as exc:
            raise TopicExistsError(exc.message) from None
        log.info("created topic %s with %d partition(s)", name, n)
        self._topics_changed()
        return n

    async def create_topic_async(
        self, name: str, partitions: int | None = None, config: LogConfig | None = None
    ) -> int:
        """:meth:`create_topic`, with the file work (two fsyncs per partition, four more per
        creation) on worker threads, so that no creation stalls the other clients. Raises what
        :meth:`create_topic` raises."""
        n = self._check_new_topic(name, partitions)
        started = time.monotonic()
        try:
            await self.logs.create_topic_async(name, range(n), config or self.config.log)
        except LogExistsError as exc:
            raise TopicExistsError(exc.message) from None
        log.info(
            "created topic %s with %d partition(s) in %.2f s",
            name,
            n,
            time.monotonic() - started,
        )
        self._topics_changed()
        return n

    def _check_new_topic(self, name: str, partitions: int | None) -> int:
        """The partition count of a topic ``name`` about to be created, checked."""
        try:
            validate_topic_name(name)
        except InvalidConfigError as exc:
            raise InvalidTopicError(exc.message) from None
        _refuse_reserved(name)
        n = self.config.default_partitions if partitions is None else partitions
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITION:
            raise InvalidTopicError(f"partitions={n!r} must be within 1..{MAX_PARTITION:,}")
        if self.logs.partition_count(name):
            raise TopicExistsError(f"topic {name!r} exists already")
        self._check_partition_cap(n)
        return n

    def _check_partition_cap(self, more: int) -> None:
        have = len(self.logs.logs)
        if have + more > self.config.max_partitions:
            raise InvalidTopicError(
                f"{more:,} more partitions would make {have + more:,}, above "
                f"max_partitions={self.config.max_partitions:,}"
            )

    def check_first_publish(self, data: bytes) -> None:
        """Check ``data`` (record batches) as a first publish to a topic not yet created is
        checked: against the settings a new topic gets, before anything is created, so that
        a refused publish creates no topic.

        Raises:
            RecordBatchError: a malformed batch.
            BatchTooLargeError: a batch over the new topic's ``max_batch_bytes``.
        """
        self._split(memoryview(data), self.config.log.max_batch_bytes)

    def ensure_topic(self, name: str) -> None:
        """Create ``name`` as a first publish would (the default partition count and log
        settings) if it does not exist.

        Raises:
            UnknownTopicError: it does not exist and topics are not created on first publish.
            InvalidTopicError: the name is not allowed.
        """
        if (name, 0) in self.logs.logs or (name, 0) in self.logs.offline:
            return
        if not self.config.auto_create_topics:
            raise UnknownTopicError(
                f"topic {name!r} does not exist and this broker does not create topics on "
                "first publish"
            )
        self.create_topic(name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data.

        Raises:
            UnknownTopicError: no such topic.
            InvalidTopicError: an internal topic.
        """
        _refuse_internal(name)
        try:
            parts = self.logs.delete_topic(name)
        except LogNotFoundError:
            raise UnknownTopicError(f"topic {name!r} does not exist") from None
        except LogExistsError as exc:  # being created or deleted
            raise TopicExistsError(exc.message) from None
        self._topic_deleted(name, parts)

    async def delete_topic_async(self, name: str) -> None:
        """:meth:`delete_topic`, with the file work on a worker thread. Raises what
        :meth:`delete_topic` raises."""
        _refuse_internal(name)
        try:
            # Gone for every reader and writer at once; the files follow on a worker thread.
            parts, directories = self.logs.detach_topic(name)
        except LogNotFoundError:
            raise UnknownTopicError(f"topic {name!r} does not exist") from None
        except LogExistsError as exc:
            raise TopicExistsError(exc.message) from None
        self._topic_deleted(name, parts)
        await self.logs.remove_files_async(name, directories)

    def _topic_deleted(self, name: str, parts: Sequence[int]) -> None:
        for p in parts:
            self._wake(name, p)
            self._producers.pop((name, p), None)
        log.info("deleted topic %s", name)
        self._topics_changed()

    def alter_topic(
        self, name: str, *, partitions: int | None = None, config: LogConfig | None = None
    ) -> None:
        """Add partitions (never fewer) and/or change the settings of every partition.

        Raises:
            UnknownTopicError, InvalidTopicError (an internal topic too).
        """
        _refuse_internal(name)
        current = self.partition_count(name)
        if partitions is not None and not current <= partitions <= MAX_PARTITION:
            raise InvalidTopicError(
                f"partitions={partitions} must be within {current}..{MAX_PARTITION:,}: "
                "a topic can gain partitions but not lose them"
            )
        if partitions is not None:
            self._check_partition_cap(partitions - current)
        if config is not None:
            for p in range(current):
                self.logs.set_config(name, p, config)
        if partitions is not None and partitions > current:
            cfg = config or self.log(name, 0).config
            try:
                self.logs.create_topic(name, range(current, partitions), cfg)
            except LogExistsError as exc:
                raise TopicExistsError(exc.message) from None
            self._topics_changed()

    async def alter_topic_async(
        self, name: str, *, partitions: int | None = None, config: LogConfig | None = None
    ) -> None:
        """:meth:`alter_topic`, with the new partitions' files made on worker threads. Raises
        what :meth:`alter_topic` raises."""
        current = self.partition_count(name)
        if partitions is None or partitions <= current:
            self.alter_topic(name, partitions=partitions, config=config)
            return
        _refuse_internal(name)
        if partitions > MAX_PARTITION:
            raise InvalidTopicError(
                f"partitions={partitions} must be within {current}..{MAX_PARTITION:,}: "
                "a topic can gain partitions but not lose them"
            )
        self._check_partition_cap(partitions - current)
        self.alter_topic(name, config=config)  # the settings first, as alter_topic does
        cfg = config or self.log(name, 0).config
        try:
            await self.logs.create_topic_async(name, range(current, partitions), cfg)
        except LogExistsError as exc:
            raise TopicExistsError(exc.message) from None
        self._topics_changed()

    def partition_count(self, name: str) -> int:
        """Raises UnknownTopicError if ``name`` is not a topic."""
        n = self.logs.partition_count(name)
        if not n:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        return n

    def log(self, topic: str, partition: int) -> PartitionLog:
        """The log of one partition.

        Raises:
            UnknownTopicError, UnknownPartitionError.
        """
        plog = self.logs.logs.get((topic, partition))
        if plog is None:
            reason = self.logs.offline.get((topic, partition))
            if reason is not None:
                raise PartitionOfflineError(
                    f"partition {partition} of topic {topic!r} is offline: {reason}"
                )
            n = self.partition_count(topic)
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{n - 1}, not {partition}"
            )
        return plog

    def describe(self, name: str) -> list[PartitionStatus]:
        """Every partition's offsets, size, damaged ranges, and why it is offline if it is."""
        out = []
        for p in range(self.partition_count(name)):
            reason = self.logs.offline.get((name, p))
            if reason is not None:
                out.append(PartitionStatus(p, -1, -1, -1, 0, offline=reason))
            else:
                status = self._status(self.log(name, p), p)
                if self.replication is not None:  # a cluster: what a fetch reports
                    hw = self.replication.high_watermark(name, p)
                    status = replace(status, high_watermark=hw)
                out.append(status)
        return out

    def topic_config(self, name: str) -> LogConfig:
        """The settings of ``name`` (those of its first partition that is online; the
        broker's defaults if none is).

        Raises:
            UnknownTopicError: no such topic.
        """
        for p in range(self.partition_count(name)):
            plog = self.logs.logs.get((name, p))
            if plog is not None:
                return plog.config
        return self.config.log

    def _status(self, plog: PartitionLog, p: int) -> PartitionStatus:
        return PartitionStatus(
            p,
            plog.log_start_offset,
            plog.log_end_offset,
            _high_watermark(plog),
            plog.size_bytes,
            plog.damage,
        )

    def storage_problems(self) -> list[StorageProblem]:
        """Every damaged range and offline partition of the data directory (internal topics
        included), by topic and partition: what health checks report."""
        out: list[StorageProblem] = []
        for (topic, p), reason in sorted(self.logs.offline.items()):
            out.append(StorageProblem(topic, p, "offline", reason=reason))
        for (topic, p), plog in self.logs.logs.items():
            for d in plog.damage:
                out.append(
                    StorageProblem(
                        topic,
                        p,
                        "damaged" if d.quarantined is None else "quarantined",
                        d.start,
                        d.end,
                        d.size,
                        d.path if d.quarantined is None else d.quarantined,
                        d.reason,
                    )
                )
        out.sort(key=lambda x: (x.topic, x.partition, x.start))
        return out

    def repair(self, name: str, partition: int | None, action: str) -> list[RepairOutcome]:
        """Report, quarantine or truncate the damaged ranges of ``name`` (one partition, or
        every partition when ``partition`` is ``None``).

        Args:
            action: ``report`` (change nothing), ``quarantine`` (copy each damaged range's
                bytes to a file beside its log; readers then pass it as a gap) or
                ``truncate`` (cut each log where its first damaged range starts: the records
                after it, good ones included, are removed).

        Raises:
            UnknownTopicError, UnknownPartitionError, PartitionOfflineError,
            InvalidRequestError (an unknown action), StorageError.
            InvalidTopicError: ``truncate`` of an internal topic (the commits after the
                damage would be lost, moving committed offsets back: quarantine instead).
        """
        if action not in ("report", "quarantine", "truncate"):
            raise InvalidRequestError(
                f"repair action {action!r} must be report, quarantine or truncate"
            )
        if action == "truncate" and is_internal_topic(name):
            raise InvalidTopicError(
                f"topic {name!r} is internal: truncating it would drop the commits after the "
                "damage and move committed offsets back; quarantine the damage instead"
            )
        n = self.partition_count(name)
        parts = range(n) if partition is None else [partition]
        out: list[RepairOutcome] = []
        for p in parts:
            plog = self.log(name, p)
            pending = [d for d in plog.damage if d.quarantined is None]
            for d in plog.damage:
                if d.quarantined is not None or action == "report":
                    out.append(RepairOutcome(p, d, "none"))
            if action == "quarantine":
                for d in pending:
                    out.append(RepairOutcome(p, plog.quarantine(d.start), "quarantined"))
            elif action == "truncate" and pending:
                end, offsets, size = plog.truncate_at_damage(pending[0].start)
                for d in pending:
                    out.append(RepairOutcome(p, d, "truncated", offsets, size, end))
                    offsets = size = 0  # one cut removed them all
                self._forget_producers_above(name, p, end)
        return out

    # --- produce --------------------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        partition: int,
        data: bytes | memoryview,
        *,
        durable: bool | None = None,
    ) -> ProduceResult:
        """Append the whole batches in ``data`` to one partition, creating the topic first if
        auto-creation is on.

        Args:
            topic, partition: where.
            data: one or more whole batches, concatenated.
            durable: ``None`` (acks=durable): return once the batches are as durable as the
                topic's fsync policy promises (under ``always``: fsynced; under ``interval``
                and ``never``: written to the log, fsynced later); ``False`` (acks=leader):
                once written to the log, without waiting for an fsync under any policy;
                ``True``: once fsynced, whatever the policy.

        Raises:
            UnknownTopicError, UnknownPartitionError: no such place (auto-creation off).
            RecordBatchError: a malformed batch (no batch of ``data`` is stored).
            BatchTooLargeError: a batch over the topic's ``max_batch_bytes``.
            ProducerFencedError, OutOfOrderSequenceError, DuplicateSequenceError: an
                idempotent batch that may not be stored (see docs/protocol.md); nothing of
                ``data`` is stored.
            StorageError, PartitionCorruptError, LogFailedError: the log refused.

        An idempotent batch sent again (one of its producer's last five in this partition)
        is not stored twice: the result gives its original offsets.
        """
        _refuse_internal(topic)
        view = memoryview(data)
        if self.replication is not None:
            return await self._produce_replicated(topic, partition, view, durable)
        plog = self.logs.logs.get((topic, partition))
        if (
            plog is None
            and self.config.auto_create_topics
            and (topic, 0) not in self.logs.logs
            and (topic, 0) not in self.logs.offline
        ):
            # Checked before creating, against the settings the new topic gets.
            batches = self._split(view, self.config.log.max_batch_bytes)
            self.ensure_topic(topic)
            plog = self.log(topic, partition)
        else:
            plog = self.log(topic, partition)
            batches = self._split(view, plog.config.max_batch_bytes)
        if all(h.producer_id < 0 for _, _, h in batches):
            return await self._append_plain(topic, partition, plog, view, batches, durable=durable)
        return await self._produce_idempotent((topic, partition), plog, view, batches, durable)

    def produce_soon(
        self,
        topic: str,
        partition: int,
        data: bytes | memoryview,
        *,
        durable: bool | None,
        callback: Callable[[ProduceResult | None, BaseException | None], None],
    ) -> bool:
        """:meth:`produce` for a caller that does not await (the listener's produce fast
        path): the batches are checked and queued now, and ``callback`` gets the result (or
        the error) once they are as durable as :meth:`produce` promises, in the very step
        that makes them so (see ``PartitionLog.append_many_soon``): no task, no loop turn
        between the group commit's result and the answer.

        Returns:
            False, having done nothing, when the request needs what only :meth:`produce`
            does by awaiting: a cluster, a partition that does not exist here yet (auto
            creation and its errors), an idempotent batch sent again. The caller then calls
            :meth:`produce`. True: ``callback`` is called exactly once, maybe before this
            returns.

        Raises:
            What :meth:`produce` raises before anything is stored (a malformed or too large
            batch, a fenced or out-of-order producer, backpressure, a log that refuses
            writes); ``callback`` is then never called.
        """
        _refuse_internal(topic)
        if self.replication is not None:
            return False
        key = (topic, partition)
        plog = self.logs.logs.get(key)
        if plog is None:
            return False
        view = memoryview(data)
        batches = self._split(view, plog.config.max_batch_bytes)
        if len(batches) == 1:  # the common request: one batch, the whole of it
            only = batches[0][2]
            headers = [only]
            chunks = [view]
            plain = only.producer_id < 0
        else:
            headers = [h for _, _, h in batches]
            chunks = [view[start:end] for start, end, _ in batches]
            plain = all(h.producer_id < 0 for h in headers)
        if plain:

            def plain_done(infos: list[AppendInfo] | None, exc: BaseException | None) -> None:
                if infos is None:
                    callback(None, exc)
                    return
                result = self._stored(
                    topic, partition, plog, infos, nbytes=len(view), durable=durable
                )
                callback(result, None)

            plog.append_many_soon(chunks, durable=durable, checked=headers, callback=plain_done)
            return True
        state = self._producers.setdefault(key, PartitionProducers())
        plan = state.plan(headers, self._epochs)
        if plan.count(None) != len(plan):
            return False  # answered with the first copy's offsets once it is settled: awaits
        # As in _produce_idempotent, with every batch stored.
        done: asyncio.Future[bool] = self._running_loop().create_future()
        now = int(time.time() * 1000)
        first = plog.log_end_offset
        next_offset = first
        recorded: list[tuple[int, StoredBatch]] = []
        for h in headers:
            if h.producer_id >= 0:
                recorded.append((h.producer_id, state.record(h, next_offset, now, done)))
                if h.producer_epoch > self._epochs.get(h.producer_id, -1):
                    self._epochs[h.producer_id] = h.producer_epoch
            next_offset += h.last_offset_delta + 1

        def forget() -> None:
            if done.done():  # told already (the append's callback, then its raise)
                return
            done.set_result(False)
            for pid in {pid for pid, _ in recorded}:
                state.forget(pid, [b for p, b in recorded if p == pid])

        def idempotent_done(infos: list[AppendInfo] | None, exc: BaseException | None) -> None:
            if infos is None:
                forget()
                callback(None, exc)
                return
            done.set_result(True)
            result = self._stored(topic, partition, plog, infos, nbytes=len(view), durable=durable)
            if infos[0].base_offset != first:  # cannot happen: loud
                callback(
                    None,
                    StorageError(
                        f"{plog.directory}: batches stored at {infos[0].base_offset}, "
                        f"expected {first}"
                    ),
                )
                return
            callback(result, None)

        try:
            plog.append_many_soon(
                chunks, durable=durable, checked=headers, callback=idempotent_done
            )
        except BaseException:
            forget()
            raise
        return True

    def _stored(
        self,
        topic: str,
        partition: int,
        plog: PartitionLog,
        infos: list[AppendInfo],
        *,
        nbytes: int,
        durable: bool | None,
    ) -> ProduceResult:
        """Account for batches just stored (``nbytes`` of them), let readers see them when
        they may, and what their produce request is answered with."""
        self._visible_after_flush(topic, partition, plog, infos[-1].last_offset + 1, durable)
        self._wake(topic, partition)
        n = infos[-1].last_offset + 1 - infos[0].base_offset
        self.stats.published += n
        plog.messages_in += n
        plog.bytes_in += nbytes
        return ProduceResult(infos[0].base_offset, infos[-1].last_offset, plog.log_start_offset)

    async def _append_plain(
        self,
        topic: str,
        partition: int,
        plog: PartitionLog,
        view: memoryview,
        batches: list[tuple[int, int, BatchHeader]],
        *,
        durable: bool | None,
    ) -> ProduceResult:
        """Append batches of which none carries a producer id, as they are."""
        infos = await plog.append_many_async(
            [view[start:end] for start, end, _ in batches],
            durable=durable,
            checked=[h for _, _, h in batches],
        )
        return self._stored(topic, partition, plog, infos, nbytes=len(view), durable=durable)

    async def _produce_replicated(
        self, topic: str, partition: int, view: memoryview, durable: bool | None
    ) -> ProduceResult:
        """Produce in cluster mode: only on the partition's leader (no auto-creation: the
        node layer creates topics through the cluster metadata); ``acks=all`` (``durable``
        None or True) is refused while the ISR is below ``min_insync_replicas`` and answered
        once every in-sync replica holds the batches; ``acks=leader`` after the local append.

        Raises:
            NotLeaderError: this node does not lead the partition (nothing stored).
            NotEnoughReplicasError: acks=all and too few in-sync replicas (nothing stored).
            RequestTimedOutError: stored here, not replicated in time.
            What :meth:`produce` raises.
        """
        rep = self.replication
        assert rep is not None
        leader = rep.check_leader(topic, partition)
        if durable is not False and not leader.can_append_acks_all():
            raise NotEnoughReplicasError(
                f"{topic}/{partition}: {len(leader.isr)} in-sync replicas "
                f"{sorted(leader.isr)}, min_insync_replicas is {leader.min_insync}; "
                "nothing was stored"
            )
        plog = self.log(topic, partition)
        batches = self._split(view, plog.config.max_batch_bytes)
        if all(h.producer_id < 0 for _, _, h in batches):
            result = await self._append_plain(
                topic, partition, plog, view, batches, durable=durable
            )
        else:
            result = await self._produce_idempotent(
                (topic, partition), plog, view, batches, durable
            )
        if durable is not False:
            await rep.wait_replicated(topic, partition, result.last_offset + 1, rep.ack_timeout_s)
        return result

    async def _produce_idempotent(
        self,
        key: tuple[str, int],
        plog: PartitionLog,
        view: memoryview,
        batches: list[tuple[int, int, BatchHeader]],
        durable: bool | None,
    ) -> ProduceResult:
        """Produce batches of which some carry a producer id: each is stored unless it is a
        remembered batch sent again, which is answered with its original offsets."""
        state = self._producers.setdefault(key, PartitionProducers())
        plan = state.plan([h for _, _, h in batches], self._epochs)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        now = int(time.time() * 1000)
        next_offset = plog.log_end_offset
        recorded: list[tuple[int, StoredBatch]] = []
        places: list[tuple[int, int]] = []
        appends: list[memoryview] = []
        headers: list[BatchHeader] = []
        for (start, end, h), dup in zip(batches, plan, strict=True):
            if dup is not None:
                places.append((dup.base_offset, dup.last_offset))
                continue
            places.append((next_offset, next_offset + h.last_offset_delta))
            appends.append(view[start:end])
            headers.append(h)
            if h.producer_id >= 0:
                recorded.append((h.producer_id, state.record(h, next_offset, now, done)))
                if h.producer_epoch > self._epochs.get(h.producer_id, -1):
                    self._epochs[h.producer_id] = h.producer_epoch
            next_offset += h.last_offset_delta + 1
        if appends:
            try:
                infos = await plog.append_many_async(appends, durable=durable, checked=headers)
            except asyncio.CancelledError:
                # The batches were claimed and queued before the first wait: they are written
                # whatever becomes of this wait (a write that fails fails the log), so they stay
                # remembered, and a retry is answered with their offsets, not stored again.
                done.set_result(True)
                raise
            except BaseException:
                done.set_result(False)
                for pid in {pid for pid, _ in recorded}:
                    state.forget(pid, [b for p, b in recorded if p == pid])
                raise
            done.set_result(True)
            self._stored(*key, plog, infos, nbytes=sum(len(a) for a in appends), durable=durable)
            if infos[0].base_offset != places[plan.index(None)][0]:  # cannot happen: loud
                raise StorageError(
                    f"{plog.directory}: batches stored at {infos[0].base_offset}, expected "
                    f"{places[plan.index(None)][0]}"
                )
        else:
            done.set_result(True)
        for dup in plan:
            if dup is None:
                continue
            if dup.done is not None and not await asyncio.shield(dup.done):
                raise StorageError(
                    "the first copy of this batch failed to be stored; send it again"
                )
            if durable or (durable is None and plog.config.fsync is FsyncPolicy.ALWAYS):
                await plog.wait_durable(dup.last_offset + 1)
        return ProduceResult(places[0][0], places[-1][1], plog.log_start_offset)

    def _visible_after_flush(
        self, topic: str, partition: int, plog: PartitionLog, end: int, durable: bool | None
    ) -> None:
        """Under ``always`` consumers see only fsynced batches: when the producer did not wait
        for the fsync (acks=leader), start one anyway and wake the long-polls once it is
        done, so what was acknowledged becomes visible."""
        if durable is not False or plog.config.fsync is not FsyncPolicy.ALWAYS:
            return
        if plog.flushed_offset >= end:
            return

        async def flush_then_wake() -> None:
            try:
                await plog.wait_durable(end)
            except TidewireError as exc:  # the log refuses writes now; readers see below
                log.error("%s", exc.message)
            self._wake(topic, partition)

        task = asyncio.get_running_loop().create_task(flush_then_wake())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def split_batches(self, view: memoryview) -> list[tuple[int, int, BatchHeader]]:
        """Check every batch of ``view`` against the broker's ``max_batch_bytes``: each
        batch's ``(start, end, header)``.

        Raises:
            RecordBatchError, BatchTooLargeError, InvalidRequestError (no batch).
        """
        return self._split(view, self.config.log.max_batch_bytes)

    @staticmethod
    def _split(view: memoryview, max_batch_bytes: int) -> list[tuple[int, int, BatchHeader]]:
        """Check every batch of ``view`` before any is appended: all or nothing."""
        out: list[tuple[int, int, BatchHeader]] = []
        pos = 0
        if not len(view):
            raise InvalidRequestError("a produce request needs at least one batch")
        while pos < len(view):
            h = check_appendable(view, pos)
            if h.size > max_batch_bytes:
                # The topic setting's name (LogConfig.max_batch_bytes in the storage API).
                raise BatchTooLargeError(
                    f"batch of {h.size:,} bytes exceeds max_message_bytes={max_batch_bytes:,}"
                )
            out.append((pos, pos + h.size, h))
            pos += h.size
        return out

    # --- idempotent producers -------------------------------------------------------------------

    async def init_producer_id(
        self, producer_id: int = -1, producer_epoch: int = -1, *, writer_id: str = ""
    ) -> tuple[int, int]:
        """A producer identity: a new id with epoch 0 (``producer_id`` = -1), or the same id
        with the next epoch, which fences every older instance of that producer.

        With ``writer_id``: the writer's producer id (:func:`writer_producer_id`) with its next
        epoch (0 the first time), fencing every earlier instance of that writer; a writer
        continues its sequences across epochs (see docs/protocol.md, "Deterministic
        writers").

        Raises:
            ProducerFencedError: ``producer_epoch`` is older than the id's newest epoch, or
                the writer was released.
            InvalidRequestError: an id this broker never handed out, or an epoch without id;
                a writer id with a producer id, of a bad length, or past the last epoch.
            StorageError: the next block of ids (or the writer's epoch) could not be written.
        """
        ids = self._ids
        if ids is None:
            raise InvalidRequestError("the broker is not running")
        if writer_id:
            if producer_id != -1 or producer_epoch != -1:
                raise InvalidRequestError("a writer_id comes without producer_id and epoch")
            return await self._init_writer(ids, writer_id)
        if producer_id >= 0:
            # Known from a log (a replica copied its batches) counts as handed out too.
            if not ids.issued(producer_id) and producer_id not in self._epochs:
                raise InvalidRequestError(f"producer id {producer_id} was never handed out")
            newest = self._epochs.get(producer_id, -1)
            if producer_epoch < newest:
                raise ProducerFencedError(
                    f"producer id {producer_id} epoch {producer_epoch} is fenced: epoch "
                    f"{newest} exists"
                )
            if producer_epoch < MAX_EPOCH:
                # Fenced at once (a second caller with the same epoch is refused above),
                # and on disk before the answer, so the fence outlives a restart.
                self._epochs[producer_id] = producer_epoch + 1
                async with self._ids_lock:
                    try:
                        await asyncio.to_thread(ids.bump, producer_id, producer_epoch + 1)
                    except OSError as exc:
                        raise StorageError(f"cannot record the producer epoch: {exc}") from exc
                if self.on_epoch_bump is not None:
                    await self.on_epoch_bump(producer_id, producer_epoch + 1)
                return producer_id, producer_epoch + 1
        elif producer_epoch != -1:
            raise InvalidRequestError("producer_epoch needs a producer_id")
        async with self._ids_lock:  # one writer of the file at a time
            if ids.next_needs_reserve():
                try:
                    await asyncio.to_thread(ids.reserve)
                except OSError as exc:
                    raise StorageError(f"cannot reserve producer ids: {exc}") from exc
            pid = ids.take()
        self._epochs[pid] = 0
        return pid, 0

    async def _init_writer(self, ids: ProducerIds, writer_id: str) -> tuple[int, int]:
        pid = writer_producer_id(writer_id)
        if pid in self._released:
            raise ProducerFencedError(
                f"writer {writer_id!r} was released (the job it wrote for committed): a late "
                "attempt may not write again"
            )
        epoch = self._epochs.get(pid, -1) + 1
        if epoch > MAX_EPOCH:
            raise InvalidRequestError(
                f"writer {writer_id!r} started {epoch:,} times: past the last epoch {MAX_EPOCH:,}"
            )
        # Fenced at once for a concurrent caller, and on disk before the answer.
        self._epochs[pid] = epoch
        async with self._ids_lock:
            try:
                await asyncio.to_thread(ids.bump_writer, pid, epoch, int(time.time() * 1000))
            except OSError as exc:
                raise StorageError(f"cannot record the writer's epoch: {exc}") from exc
        if self.on_epoch_bump is not None:
            await self.on_epoch_bump(pid, epoch)
        return pid, epoch

    def fence_producer_epoch(self, producer_id: int, epoch: int) -> None:
        """Another cluster node bumped ``producer_id`` to ``epoch``: older epochs of it are
        refused here from now on (``ProducerFencedError``), and a writer's next epoch comes
        after it."""
        if epoch > self._epochs.get(producer_id, -1):
            self._epochs[producer_id] = epoch

    async def producer_state(
        self, producer_id: int, producer_epoch: int, partitions: Sequence[tuple[str, int]]
    ) -> list[tuple[int, int] | TidewireError]:
        """What ``producer_id`` stored in each partition: ``(epoch, last_sequence)``, with
        ``(-1, -1)`` where the partition holds nothing of it, or that partition's error.

        It waits for the producer's appends still in flight there to end (a failed one is
        rolled back), and under ``fsync=always`` for its last batch to be fsynced: what it
        answers is stored, and stays stored across a crash.

        Args:
            producer_id: the producer.
            producer_epoch: the asking instance's epoch (-1: do not check).
            partitions: ``(topic, partition)`` pairs, at most
                :data:`MAX_PARTITIONS_PER_STATE`.

        Raises:
            ProducerFencedError: ``producer_epoch`` is older than the id's newest.
            InvalidRequestError: too many partitions.
        """
        if len(partitions) > MAX_PARTITIONS_PER_STATE:
            raise InvalidRequestError(
                f"{len(partitions):,} partitions in one producer-state request exceed "
                f"{MAX_PARTITIONS_PER_STATE:,}"
            )
        newest = self._epochs.get(producer_id, -1)
        if 0 <= producer_epoch < newest:
            raise ProducerFencedError(
                f"producer id {producer_id} epoch {producer_epoch} is fenced: epoch {newest} exists"
            )
        out: list[tuple[int, int] | TidewireError] = []
        for topic, partition in partitions:
            try:
                plog = self.log(topic, partition)
                state = self._producers.get((topic, partition))
                entry = None if state is None else await state.settled(producer_id)
                if entry is None:
                    out.append((-1, -1))
                    continue
                if entry.last_seq is None:
                    raise OutOfOrderSequenceError(
                        f"{topic}-{partition} no longer knows the last sequence of producer id "
                        f"{producer_id} (its last appends failed or were not all recovered)"
                    )
                if entry.batches and plog.config.fsync is FsyncPolicy.ALWAYS:
                    await plog.wait_durable(entry.batches[-1].last_offset + 1)
                out.append((entry.epoch, entry.last_seq))
            except TidewireError as exc:
                out.append(exc)
        return out

    async def release_writers(self, writer_ids: Sequence[str]) -> int:
        """Forget the state of these writers in every partition: their job committed and no
        attempt of it will run again. A writer released here cannot start again (for the
        last :data:`MAX_RELEASED_WRITERS` released, until the broker restarts).

        Returns:
            How many partitions held state of one of them.

        Raises:
            InvalidRequestError: a bad writer id, or more than :data:`MAX_WRITERS_PER_RELEASE`.
            StorageError: the writers could not be removed from the ids file.
        """
        ids = self._ids
        if ids is None:
            raise InvalidRequestError("the broker is not running")
        if len(writer_ids) > MAX_WRITERS_PER_RELEASE:
            raise InvalidRequestError(
                f"{len(writer_ids):,} writer ids in one release exceed {MAX_WRITERS_PER_RELEASE:,}"
            )
        pids = {writer_producer_id(w) for w in writer_ids}
        released = 0
        for state in self._producers.values():
            for pid in pids & state.entries.keys():
                del state.entries[pid]
                state.changed = True
                released += 1
        for pid in pids:
            self._epochs.pop(pid, None)
            self._released[pid] = None
            self._released.move_to_end(pid)
        while len(self._released) > MAX_RELEASED_WRITERS:
            self._released.popitem(last=False)
        async with self._ids_lock:
            try:
                await asyncio.to_thread(ids.drop_writers, pids)
            except OSError as exc:
                raise StorageError(f"cannot record the released writers: {exc}") from exc
        return released

    def _expire_writers(self, cutoff_ms: int) -> set[int]:
        """Writers handed out before ``cutoff_ms`` that no partition holds state of any more:
        forgotten in memory; the caller drops them from the ids file."""
        ids = self._ids
        if ids is None:
            return set()
        old = {pid for pid, (_, ms) in ids.writers.items() if ms < cutoff_ms}
        if not old:
            return old
        for state in self._producers.values():
            old -= state.entries.keys()
        for pid in old:
            self._epochs.pop(pid, None)
        return old

    def use_producer_id_range(self, node_id: int) -> None:
        """As cluster node ``node_id``: hand out producer ids only from the node's own range
        (:func:`~tidewire.broker.producers.node_id_floor`), so that no two nodes hand out one
        id, and accept ids of the other nodes' ranges (a producer renews its epoch at any
        node). Called by the node layer once the broker is started.

        Raises:
            InvalidConfigError: a node id too large for a range of its own.
        """
        try:
            floor = node_id_floor(node_id)
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None
        end = floor + (1 << NODE_ID_SHIFT)
        ids = self._ids
        if ids is None:
            raise InvalidRequestError("the broker is not running")
        seen = max((pid for pid in self._epochs if floor <= pid < end), default=-1)
        ids.use_range(floor, end, seen)

    def replica_appended(self, topic: str, partition: int, data: bytes | memoryview) -> None:
        """Batches copied from the leader (whole batches, as the fetcher appends them) are
        being stored in this replica: take their producer ids into the partition's producer
        state and the newest epochs, as the leader did when it stored them. A follower that
        becomes leader then answers an idempotent batch sent again with its original offsets,
        continues the sequences and fences older epochs, as its predecessor would have.

        Called before the append is awaited (no produce can come in between); if the append
        fails, :meth:`replica_truncated` rebuilds the state from the log.
        """
        if topic == SECURITY_TOPIC:  # users, keys, ACLs: applied on every replica
            self.security.replica_appended(data)
        elif topic == QUEUE_DEFINITIONS_TOPIC and self._queues is not None:  # idem
            self._queues.definitions_copied(data)
        state: PartitionProducers | None = None
        now = int(time.time() * 1000)
        for _, h in iter_batches(data, verify=False):
            if h.producer_id < 0:
                continue
            if state is None:
                state = self._producers.setdefault((topic, partition), PartitionProducers())
            state.observe(h, h.max_timestamp if h.max_timestamp > 0 else now)
            if h.producer_epoch > self._epochs.get(h.producer_id, -1):
                self._epochs[h.producer_id] = h.producer_epoch

    def replica_truncated(self, topic: str, partition: int, end: int) -> None:
        """This replica's log was cut at ``end`` (it diverged from the leader, or an append
        of copied batches failed): rebuild the partition's producer state from the log."""
        self._forget_producers_above(topic, partition, end)
        if topic == SECURITY_TOPIC:
            self.security.reload()
        elif topic == QUEUE_DEFINITIONS_TOPIC and self._queues is not None:
            self._queues.definitions_truncated()

    def _forget_producers_above(self, topic: str, partition: int, end: int) -> None:
        """Rebuild one partition's producer state from its log after it was cut at ``end``
        (the batches above it no longer count)."""
        plog = self.log(topic, partition)
        now = int(time.time() * 1000)
        state = PartitionProducers()
        for h in _headers_from(plog, plog.log_start_offset):
            state.observe(h, h.max_timestamp if h.max_timestamp > 0 else now)
        state.changed = True
        self._producers[(topic, partition)] = state
        log.info("%s-%d: producer state rebuilt after a cut at offset %d", topic, partition, end)

    def _load_producers(self) -> None:
        """Rebuild every partition's producer state: a valid snapshot, then the batch headers
        of the log from the snapshot's offset on."""
        now = int(time.time() * 1000)
        for key, plog in self.logs.logs.items():
            state, start, read = self._read_snapshot(plog)
            unseen = plog.scanned_without_producers_from
            if unseen is None or start < unseen:  # else the open's scan saw no producer there
                for h in _headers_from(plog, start):
                    state.observe(h, h.max_timestamp if h.max_timestamp > 0 else now)
            # Written again at the next snapshot unless the one read reaches the log's end
            # (after a clean shutdown: nothing to rewrite at the next one). One missing,
            # unreadable or removed (past the log's end) is written again.
            state.changed = not read or start < plog.log_end_offset
            self._producers[key] = state
            for pid, entry in state.entries.items():
                if entry.epoch > self._epochs.get(pid, -1):
                    self._epochs[pid] = entry.epoch
        path = f"{self.logs.data_dir}/{PRODUCER_IDS_FILE}"
        seen = max((pid for pid in self._epochs if not is_writer(pid)), default=-1)
        try:
            ids = ProducerIds(self.logs.fs, path, seen)
        except ValueError as exc:
            raise StorageError(str(exc)) from None
        for pid, (epoch, _) in ids.writers.items():
            if epoch > self._epochs.get(pid, -1):
                self._epochs[pid] = epoch
        # Bumps on disk that no log shows yet still fence; those the logs show are dropped
        # from the file at its next write.
        for pid, epoch in list(ids.epochs.items()):
            if epoch > self._epochs.get(pid, -1):
                self._epochs[pid] = epoch
            else:
                del ids.epochs[pid]
        self._ids = ids

    def _read_snapshot(self, plog: PartitionLog) -> tuple[PartitionProducers, int, bool]:
        """The state to start from, the offset from which the log is read to complete it, and
        whether they come from the partition's snapshot file."""
        path = f"{plog.directory}/{SNAPSHOT_FILE}"
        fs = self.logs.fs
        try:
            if fs.exists(path):
                offset, state = decode_snapshot(fs.read_file(path))
                if offset <= plog.log_end_offset:
                    return state, max(offset, plog.log_start_offset), True
                log.warning(
                    "%s: producer snapshot at offset %d is past the log end %d; rebuilding "
                    "from the log",
                    plog.directory,
                    offset,
                    plog.log_end_offset,
                )
                fs.remove(path)
        except (OSError, ValueError) as exc:
            log.warning("%s: producer snapshot not used: %s", plog.directory, exc)
        return PartitionProducers(), plog.log_start_offset, False

    def _take_snapshots(self, *, only_changed: bool) -> list[tuple[str, bytes]]:
        """On the loop: the snapshot file of every partition's producer state (that changed)."""
        out: list[tuple[str, bytes]] = []
        for (topic, p), state in self._producers.items():
            plog = self.logs.logs.get((topic, p))
            if plog is None or plog.closed or (only_changed and not state.changed):
                continue
            out.append(
                (f"{plog.directory}/{SNAPSHOT_FILE}", encode_snapshot(state, plog.log_end_offset))
            )
            state.changed = False
        return out

    def _write_snapshots(self, snapshots: list[tuple[str, bytes]]) -> list[str]:
        """Write snapshots taken by :meth:`_take_snapshots` (blocking I/O; many at once with
        two syncs of the file system, :func:`write_atomic_many`; one writer at a time: a
        close's may follow a periodic one still running in its thread). A snapshot that
        cannot be written is logged (the next start reads more of the log instead), and its
        path returned, for :meth:`_snapshots_failed`."""
        with self._snapshot_lock:
            try:
                errors = write_atomic_many(self.logs.fs, snapshots, self.logs.data_dir)
            except OSError as exc:
                log.error("writing %d producer snapshots failed: %s", len(snapshots), exc)
                return [path for path, _ in snapshots]
        failed = []
        for (path, _), error in zip(snapshots, errors, strict=True):
            if error is not None:
                log.error("writing the producer snapshot %s failed: %s", path, error)
                failed.append(path)
        return failed

    def _snapshots_failed(self, paths: list[str]) -> None:
        """On the loop: the states whose snapshot files ``paths`` could not be written count
        as changed again, so the next round (or the close) writes them."""
        if not paths:
            return
        dirs = {os.path.dirname(path) for path in paths}
        for key, state in self._producers.items():
            plog = self.logs.logs.get(key)
            if plog is not None and plog.directory in dirs:
                state.changed = True

    async def _producer_upkeep(self) -> None:
        """Until cancelled: expire idle producers and snapshot the changed states."""
        period = self.config.producer_snapshot_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            cutoff = int(time.time() * 1000) - self.config.producer_expiration_ms
            for state in self._producers.values():
                state.expire(cutoff)
            failed = await asyncio.to_thread(
                self._write_snapshots, self._take_snapshots(only_changed=True)
            )
            self._snapshots_failed(failed)
            gone = self._expire_writers(cutoff)
            if gone and self._ids is not None:
                async with self._ids_lock:
                    try:
                        await asyncio.to_thread(self._ids.drop_writers, gone)
                    except OSError as exc:  # tried again at the next round
                        log.error("dropping expired writers from the ids file failed: %s", exc)

    # --- fetch ----------------------------------------------------------------------------------

    async def fetch(
        self,
        wants: Sequence[tuple[str, int, int, int]],
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> list[FetchResult]:
        """Read from several partitions; wait up to ``max_wait_ms`` for ``min_bytes``.

        Args:
            wants: ``(topic, partition, offset, max_bytes)`` per partition.
            max_wait_ms: long-poll: how long to wait when less than ``min_bytes`` is there
                (capped by the broker's ``max_wait_ms``).
            min_bytes: return at once when at least this much is there.
            max_bytes: budget of the whole response (at least one batch is returned), at most
                the broker's ``fetch_max_bytes``.

        Raises:
            UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError,
            PartitionCorruptError: for the first partition that fails.
            BackpressureError: too many fetches are waiting.
        """
        now = self.fetch_now(
            wants, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes
        )
        if now is not None:
            return now
        max_bytes = min(max_bytes, self.config.fetch_max_bytes)
        wait = min(max_wait_ms, self.config.max_wait_ms) / 1000
        if self._n_waiters >= self.config.max_fetch_waiters:
            raise BackpressureError(
                f"{self._n_waiters:,} fetches are waiting "
                f"(max_fetch_waiters={self.config.max_fetch_waiters:,})"
            )
        loop = self._running_loop()
        deadline = loop.time() + wait
        releases = self._releases
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            keys = {(t, p) for t, p, _, _ in wants}
            self._add_waiters(keys, fut)
            try:
                await _woken_or_timeout(fut, max(deadline - loop.time(), 0))
            finally:
                self._drop_waiters(keys, fut)
            results = self._read(wants, max_bytes)
            if self._wait_over(results, min_bytes, releases, deadline):
                return self._delivered(wants, results)

    def fetch_now(
        self,
        wants: Sequence[tuple[str, int, int, int]],
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> list[FetchResult] | None:
        """:meth:`fetch` when it need not wait: what it returns at once (data enough, no wait
        asked for, or the broker closing), else None, having delivered nothing (the caller
        then awaits :meth:`fetch`). Same arguments and errors as :meth:`fetch`, but never
        ``BackpressureError``."""
        max_bytes = min(max_bytes, self.config.fetch_max_bytes)
        results = self._read(wants, max_bytes)
        wait = min(max_wait_ms, self.config.max_wait_ms) / 1000
        if wait <= 0 or self._closing or sum(len(r.data) for r in results) >= min_bytes:
            return self._delivered(wants, results)
        return None

    def park_fetch(
        self,
        wants: Sequence[tuple[str, int, int, int]],
        answer: Callable[[list[FetchResult] | None], None],
        *,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        room: Callable[[], bool],
    ) -> ParkedFetch | None:
        """:meth:`fetch` for a reader :meth:`fetch_now` left waiting, without a task: the
        fetch waits on the partitions' wake-ups as a callback, and ``answer`` is called
        once, with what :meth:`fetch` would have returned, as soon as it has it (in the
        loop's callback after the wake-up, where a woken task would have run: a task, its
        coroutines and their turns fewer). ``answer(None)``: nothing was delivered, and the fetch
        must be served the usual way (a partition failed, or ``room()`` said its answer
        does not fit now). None: it cannot wait here (``max_fetch_waiters`` are waiting:
        :meth:`fetch` refuses it). :meth:`ParkedFetch.cancel` drops it (its connection
        closed)."""
        if self._n_waiters >= self.config.max_fetch_waiters or self._closing:
            return None
        loop = self._running_loop()
        wait = min(max_wait_ms, self.config.max_wait_ms) / 1000
        parked = ParkedFetch(
            self,
            wants,
            answer,
            min_bytes,
            min(max_bytes, self.config.fetch_max_bytes),
            room,
            loop.time() + wait,
        )
        parked.park(loop)
        return parked

    def _wait_over(
        self, results: list[FetchResult], min_bytes: int, releases: int, deadline: float
    ) -> bool:
        """Whether a long-poll that read ``results`` answers now: enough data, the broker
        closing or its waiters released since ``releases``, or its ``deadline`` passed."""
        return (
            sum(len(r.data) for r in results) >= min_bytes
            or self._closing
            or self._releases != releases
            or self._running_loop().time() >= deadline
        )

    def _delivered(
        self, wants: Sequence[tuple[str, int, int, int]], results: list[FetchResult]
    ) -> list[FetchResult]:
        """Count the messages ``results`` hand over (from each wanted offset on)."""
        for (_, _, offset, _), r in zip(wants, results, strict=True):
            if r.next_offset > offset:
                self.count_delivered(r.topic, r.partition, r.next_offset - offset, len(r.data))
        return results

    def count_delivered(self, topic: str, partition: int, messages: int, nbytes: int) -> None:
        """Count ``messages`` (``nbytes`` of batches) of one partition handed to a reader
        (``stats.delivered`` and the partition's counters; per fetch or push, never per
        message)."""
        self.stats.delivered += messages
        plog = self.logs.logs.get((topic, partition))
        if plog is not None:
            plog.messages_out += messages
            plog.bytes_out += nbytes

    @property
    def fetch_waiters(self) -> int:
        """Long-poll fetches waiting for data now."""
        return self._n_waiters

    def _read(
        self, wants: Sequence[tuple[str, int, int, int]], max_bytes: int
    ) -> list[FetchResult]:
        out: list[FetchResult] = []
        budget = max_bytes
        for topic, partition, offset, part_max in wants:
            try:
                plog = self.log(topic, partition)
            except (UnknownTopicError, UnknownPartitionError):
                if self.replication is not None:
                    # A cluster node that is no replica (any more: the partition was moved
                    # away): NotLeaderError, retriable, so the reader asks the metadata again.
                    self.replication.check_leader(topic, partition)
                raise
            hw = (
                _high_watermark(plog)
                if self.replication is None
                else self.replication.high_watermark(topic, partition)
            )
            limit = max(min(part_max, budget), 1)
            r = plog.read(offset, limit, max_offset=hw)
            if budget < max_bytes and len(r.data) > budget:  # only the first data may exceed
                r = replace(r, data=b"", next_offset=offset)
            budget = max(budget - len(r.data), 0)
            out.append(
                FetchResult(topic, partition, bytes(r.data), r.next_offset, hw, r.log_start_offset)
            )
        return out

    # --- push delivery (the subscription side; see server/push.py) ----------------------------

    def read_partition(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> FetchResult:
        """Whole batches of one partition from the one holding ``offset``, at most
        ``max_bytes`` unless the first batch alone is larger (it is then returned alone).

        Raises:
            UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError,
            PartitionCorruptError: as for :meth:`fetch`.
        """
        return self._read([(topic, partition, offset, max_bytes)], max_bytes)[0]

    def bytes_behind(self, topic: str, partition: int, offset: int) -> int:
        """How many bytes of batches lie between ``offset`` and the high watermark
        (estimated from the offset index: over by at most one index interval).

        Raises:
            UnknownTopicError, UnknownPartitionError: no such partition.
        """
        plog = self.log(topic, partition)
        hw = (
            _high_watermark(plog)
            if self.replication is None
            else self.replication.high_watermark(topic, partition)
        )
        return max(plog.bytes_after(offset) - plog.bytes_after(hw), 0)

    def high_watermark(self, topic: str, partition: int) -> int:
        """The offset below which records are visible to readers (in cluster mode: the
        replicated one, below which every in-sync replica holds them)."""
        if self.replication is not None:
            return self.replication.high_watermark(topic, partition)
        return _high_watermark(self.log(topic, partition))

    async def wait_for_data(
        self, keys: Sequence[tuple[str, int]], timeout_s: float | None = None
    ) -> None:
        """Wait until one of these partitions is appended to (the same wake-ups long-poll
        fetches wait on), the broker closes or releases its waiters, or ``timeout_s`` passes.
        The caller re-reads afterwards: a wake-up is a hint, not a promise of data. While
        the broker is closing nothing more is appended: it waits out the timeout (a caller
        that loops on it must not spin).

        Raises:
            BackpressureError: ``max_fetch_waiters`` are waiting already.
        """
        if self._closing:
            await asyncio.sleep(1.0 if timeout_s is None else timeout_s)
            return
        if self._n_waiters >= self.config.max_fetch_waiters:
            raise BackpressureError(
                f"{self._n_waiters:,} fetches are waiting "
                f"(max_fetch_waiters={self.config.max_fetch_waiters:,})"
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._add_waiters(keys, fut)
        try:
            await _woken_or_timeout(fut, timeout_s)
        finally:
            self._drop_waiters(keys, fut)

    def release_waiters(self) -> None:
        """Make every fetch waiting now return at once with what it has (a listener that is
        shutting down answers its long-polls instead of dropping them)."""
        self._releases += 1
        if self._streams is not None:
            self._streams.release_waiters()
        for futs in list(self._waiters.values()):
            for fut in list(futs):  # a parked fetch leaves the sets as it is woken
                if not fut.done():
                    fut.set_result(None)

    def begin_drain(self) -> None:
        """The server is draining: every fetch waiting now returns at once with what it has,
        a fetch from here on does not wait, and every member waiting in a join is told to
        join again (``RebalanceInProgressError``, retriable). Produce and the rest go on
        working until :meth:`close`."""
        self._closing = True
        if self._streams is not None:
            self._streams.draining = True
        self.release_waiters()
        if self._groups is not None:
            self._groups.coordinator.close()
            self._groups.kafka.release_waiters()

    def add_waiter(self, keys: Iterable[tuple[str, int]], waiter: Waiter) -> bool:
        """Make ``waiter`` wait on the wake-ups of the partitions ``keys``, as a long-poll
        fetch does, without a future or a task: its ``set_result(None)`` is called once one
        of them may be read further, or the broker releases its waiters. The caller re-reads
        then (a wake-up is a hint, not a promise of data) and undoes this with
        :meth:`drop_waiter`, woken or not. False: it cannot wait here
        (``max_fetch_waiters`` are waiting, or the broker is closing): poll instead."""
        if self._n_waiters >= self.config.max_fetch_waiters or self._closing:
            return False
        self._add_waiters(keys, waiter)
        return True

    def drop_waiter(self, keys: Iterable[tuple[str, int]], waiter: Waiter) -> None:
        """Undo :meth:`add_waiter` (whether ``waiter`` was woken or not)."""
        self._drop_waiters(keys, waiter)

    def _add_waiters(self, keys: Iterable[tuple[str, int]], fut: Waiter) -> None:
        """One waiter (a long-poll fetch's, a subscription's) on each of ``keys``: counted
        once towards ``max_fetch_waiters``."""
        for key in keys:
            self._add_waiter(key, fut)
        self._n_waiters += 1

    def _drop_waiters(self, keys: Iterable[tuple[str, int]], fut: Waiter) -> None:
        """Undo :meth:`_add_waiters` (whether ``fut`` was woken or not)."""
        self._n_waiters -= 1
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[key]

    def _add_waiter(self, key: tuple[str, int], fut: Waiter) -> None:
        """Make ``fut`` one of the waiters of partition ``key``; the partition's log wakes
        them itself (:attr:`PartitionLog.on_visible`) as soon as readers may see more: under
        ``always`` in the step that takes back the fsync, before the producers resume."""
        self._waiters.setdefault(key, set()).add(fut)
        plog = self.logs.logs.get(key)
        if plog is not None and plog.on_visible is None:
            plog.on_visible = functools.partial(self._wake, *key)

    def _wake(self, topic: str, partition: int) -> None:
        waiters = self._waiters.pop((topic, partition), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    # --- offsets --------------------------------------------------------------------------------

    def list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        """``-2``: the log start; ``-1``: the high watermark; else the first offset whose
        record timestamp is at or after ``timestamp`` (ms), or the high watermark if none."""
        plog = self.log(topic, partition)
        hw = (
            _high_watermark(plog)
            if self.replication is None
            else self.replication.high_watermark(topic, partition)
        )
        if timestamp == -2:
            return plog.log_start_offset
        if timestamp == -1:
            return hw
        found = plog.offset_for_timestamp(timestamp)
        return hw if found is None or found >= hw else found

    @staticmethod
    def batch_count(data: bytes) -> int:
        """How many whole batches ``data`` holds (a helper for callers and tests)."""
        return sum(1 for _ in iter_batches(data, verify=False))


def _headers_from(plog: PartitionLog, offset: int) -> Iterator[BatchHeader]:
    """The headers of the log's batches from the one holding ``offset`` to the end (damaged
    ranges, which are never served, skipped)."""
    end = plog.log_end_offset
    while offset < end:
        try:
            r = plog.read(offset, 4 * 1024 * 1024)
        except PartitionCorruptError as exc:
            if exc.damage_end <= offset:
                return
            offset = exc.damage_end
            continue
        except OffsetOutOfRangeError:
            return
        if not r.data:
            return
        for _, h in iter_batches(r.data, verify=False):
            if h.last_offset >= offset:
                yield h
        offset = r.next_offset


def _refuse_internal(topic: str) -> None:
    if is_internal_topic(topic):
        raise InternalTopicError(
            f"topic {topic!r} is internal to the broker: clients may read it, not create, "
            "alter, delete or publish to it"
        )


#: Topic names beginning with this are reserved for the broker's internal topics, so that no
#: client can create one before the broker does (with settings of its choosing). Topics of
#: such names created before this rule stay usable.
RESERVED_TOPIC_PREFIX = "__"


def _refuse_reserved(topic: str) -> None:
    """The guard of every client's topic creation: the broker creates its internal topics
    through the log manager, never through :meth:`Broker.create_topic`."""
    _refuse_internal(topic)
    if topic.startswith(RESERVED_TOPIC_PREFIX):
        raise InternalTopicError(
            f"topic {topic!r} cannot be created: names beginning with "
            f"{RESERVED_TOPIC_PREFIX!r} are reserved for the broker's internal topics"
        )


class ParkedFetch:
    """A long-poll fetch waiting for data without a task (:meth:`Broker.park_fetch`).

    It stands among a partition's waiters as a future would (``done``, ``set_result``): a
    wake-up reads in the loop's next callback and answers if there is enough, the wait is
    over or the broker released its waiters; else it waits again. The time limit is a timer
    of the loop's."""

    __slots__ = (
        "_answer",
        "_broker",
        "_deadline",
        "_done",
        "_keys",
        "_loop",
        "_max_bytes",
        "_min_bytes",
        "_releases",
        "_room",
        "_timer",
        "_wants",
    )

    def __init__(  # noqa: PLR0917 (one fetch's arguments, kept for its wake-ups)
        self,
        broker: Broker,
        wants: Sequence[tuple[str, int, int, int]],
        answer: Callable[[list[FetchResult] | None], None],
        min_bytes: int,
        max_bytes: int,
        room: Callable[[], bool],
        deadline: float,
    ) -> None:
        self._broker = broker
        self._wants = wants
        self._answer = answer
        self._min_bytes = min_bytes
        self._max_bytes = max_bytes
        self._room = room
        self._deadline = deadline
        self._keys = {(t, p) for t, p, _, _ in wants}
        self._releases = broker._releases
        self._done = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def park(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait (again) on the partitions' wake-ups and the time left."""
        self._loop = loop
        self._broker._add_waiters(self._keys, self)
        self._timer = loop.call_at(self._deadline, self._woken)

    def done(self) -> bool:
        return self._done

    def wait_left_ms(self) -> int:
        """How long the fetch may still wait (ms): what the usual way is given when it takes
        the fetch over (``answer(None)``); 0 once the wait is over or released."""
        b = self._broker
        if self._loop is None or b._closing or b._releases != self._releases:
            return 0
        return max(math.ceil((self._deadline - self._loop.time()) * 1000), 0)

    def set_result(self, _: None) -> None:
        """A wake-up (as a waiting future's): read in the loop's next callback, as a woken
        task would (a second wake-up meanwhile adds nothing)."""
        if self._done or self._timer is None:
            return  # answered, or its read is queued already
        self._unpark()
        assert self._loop is not None
        self._loop.call_soon(self._read)

    def cancel(self) -> None:
        """Drop it, unanswered (its connection closed)."""
        if not self._done:
            self._unpark()
            self._done = True

    def _woken(self) -> None:  # the time limit
        if not self._done:
            self._unpark()
            self._read()

    def _unpark(self) -> None:
        if self._timer is None:
            return  # woken already (a second key's wake-up in the same step)
        self._timer.cancel()
        self._timer = None
        self._broker._drop_waiters(self._keys, self)

    def _read(self) -> None:
        """Read, and answer or wait again. Contained: it runs inside another's callback (a
        log's wake-up, a drain's release), which must not see a bug of this one; such a
        fetch goes to the usual way, with nothing delivered."""
        try:
            self._read_or_wait()
        except Exception:
            log.exception("answering a waiting fetch failed")
            if not self._done:
                self._unpark()
                self._done = True
                self._answer(None)

    def _read_or_wait(self) -> None:
        if self._done or self._timer is not None:
            return  # answered, or waiting again
        b = self._broker
        answer = self._answer
        if not self._room():
            self._done = True
            answer(None)
            return
        try:
            results = b._read(self._wants, self._max_bytes)
        except TidewireError:
            self._done = True
            answer(None)  # the usual way gives each partition its own error
            return
        if b._wait_over(results, self._min_bytes, self._releases, self._deadline):
            delivered = b._delivered(self._wants, results)  # before done: a bug here is contained
            self._done = True
            answer(delivered)
            return
        assert self._loop is not None
        self.park(self._loop)  # a wake-up is a hint: not enough yet


class Waiter(Protocol):
    """What waits on a partition's wake-ups (:meth:`Broker.add_waiter`): a future, a parked
    fetch, a push subscription. ``set_result(None)`` is its wake-up, called only while
    ``done()`` is False."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...


async def _woken_or_timeout(fut: asyncio.Future[None], timeout_s: float | None) -> None:
    """Wait until ``fut`` is resolved (a wake-up) or ``timeout_s`` passes, whichever comes
    first. A timer resolves the future itself: no ``wait_for``/``shield`` pair, whose two
    extra futures cost two more turns of the loop between a wake-up and the reader."""
    timer = None
    if timeout_s is not None:
        timer = fut.get_loop().call_later(timeout_s, _resolve, fut)
    try:
        await fut
    finally:
        if timer is not None:
            timer.cancel()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _high_watermark(plog: PartitionLog) -> int:
    if plog.config.fsync is FsyncPolicy.ALWAYS:
        return plog.flushed_offset
    return plog.log_end_offset


def _log_task_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_name(), exc_info=task.exception())
