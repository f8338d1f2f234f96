"""Committed offsets of consumer groups, kept in the broker's own log.

The offsets live in an internal topic, :data:`OFFSETS_TOPIC`, of :data:`OFFSETS_PARTITIONS`
partitions with ``fsync=always`` and no retention; a group's records all go to one partition
(CRC-32 of the group id). Each commit is one record batch, one record per partition
committed:

- key: msgpack ``[0, group, topic, partition]`` (:class:`OffsetKey`; 0 is the version);
- value: msgpack ``[0, offset, metadata, commit_timestamp_ms]`` (:class:`OffsetValue`), or
  no value at all (a tombstone: the group's offset for that partition was deleted).

In a cluster the same partition also holds each group's *membership* (as Kafka's
``__consumer_offsets`` holds its group metadata), written by the coordinator at each
generation change so that a new coordinator carries the group on:

- key: msgpack ``[2, group]`` (:class:`MembershipKey`; 2 is Kafka's version of a group
  metadata key, so the two kinds never share a key);
- value: the coordinator's encoding of the group's generation and members (opaque here,
  see :meth:`tidewire.broker.groups.GroupCoordinator.snapshot`), or none: the group has no
  members any more.

An older version reading such a record skips it as undecodable (logged), so a log written by
a cluster still loads there.

At start :meth:`OffsetStore.load` reads every partition through and keeps the last value
per key, so the state is what the log says, and the log recovers like any other (torn tail
cut, CRCs checked). A commit is acknowledged only once its batch is fsynced, which is why a
committed offset never goes back across a crash: what was acknowledged is on disk, and a
commit that was written but not acknowledged before the crash can only move it forward.

**Compaction.** The logs roll every :data:`SEGMENT_BYTES`. When a partition's log holds
:data:`COMPACT_SEGMENTS` segments or more and is several times larger than its live entries,
the store rewrites it: it lets the commits in flight on that partition finish and holds new
ones back, appends every live entry of the partition again (its current value, with its
original commit time) and fsyncs it, then deletes the whole segments that lie before that
copy. A crash in between leaves the old segments and all or part of the copy: every record in
them is a value the key had, in log order, so the last one still wins. Tombstones need no
copy: the values they delete are in the same or earlier segments. So the log, and the time a
start takes to read it, stay proportional to the live offsets, not to the commits ever made.

**In a cluster** (:meth:`OffsetStore.replicate`) the topic is replicated like any other
(created through etcd by the node layer), and a partition's groups are served only by its
leader, their *coordinator*. The store then serves only the partitions it was told to
(:meth:`OffsetStore.take_over`: it forgets what it held of that partition and reads its log
again, which replication has kept up to date), and forgets those it gives up
(:meth:`OffsetStore.give_up`). A commit is appended on the leader and acknowledged once every
in-sync replica holds it (each fsynced: the topic is ``fsync=always``), so it survives the
leader's loss: the next leader is one of them. Its in-memory state changes only then.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import msgspec

from tidewire.errors import (
    NotCoordinatorError,
    OffsetOutOfRangeError,
    PartitionCorruptError,
    RecordBatchError,
)
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, PartitionLog

__all__ = [
    "OFFSETS_PARTITIONS",
    "OFFSETS_TOPIC",
    "QUEUE_DEFINITIONS_TOPIC",
    "QUEUE_TOPIC_PREFIX",
    "Committed",
    "MembershipKey",
    "OffsetKey",
    "OffsetStore",
    "OffsetValue",
    "OffsetsReplication",
    "is_internal_topic",
    "partition_for",
]

log = logging.getLogger("tidewire.broker")

#: The internal topic of committed offsets.
OFFSETS_TOPIC = "__consumer_offsets"
#: Its partitions: commits of different groups go to different logs and fsync in parallel.
#: Fixed, because a group's partition is derived from it.
OFFSETS_PARTITIONS = 8
#: Bytes read at a time while loading.
_READ_CHUNK = 4 * 1024 * 1024
#: Segment size of the offsets logs.
SEGMENT_BYTES = 1024 * 1024
#: A partition's log is compacted once it has this many segments ...
COMPACT_SEGMENTS = 4
#: ... and is this many times larger than a copy of its live entries.
COMPACT_RATIO = 4
#: Records per batch of the copy.
_COPY_BATCH = 2048


def internal_config() -> LogConfig:
    """The settings of every partition of the topic, whoever made it: acknowledged once
    fsynced, never deleted by retention (compaction keeps it small), default limits."""
    return LogConfig(
        fsync=FsyncPolicy.ALWAYS,
        retention_ms=-1,
        retention_bytes=-1,
        segment_bytes=SEGMENT_BYTES,
    )


TP = tuple[str, int]
#: A record to write to the topic: key, value (None: a tombstone), and what applies it to the
#: store's state once it is stored at a log offset.
_Record = tuple[bytes, bytes | None, Callable[[int], None]]


#: The durable exchanges, queues and bindings (see :mod:`tidewire.broker.queues.definitions`).
QUEUE_DEFINITIONS_TOPIC = "__queue_definitions"
#: A queue's own logs (its messages, its delivery state) are topics named with this prefix.
QUEUE_TOPIC_PREFIX = "__queue."
#: The shared log of persistent stream messages (see :mod:`tidewire.broker.streams`).
STREAMS_TOPIC = "__streams"
#: Every topic the broker keeps for itself: the offsets, the security state, the audit log,
#: the queue definitions, the streams' log (and, by their prefix, the queues' logs).
INTERNAL_TOPICS = frozenset(
    {OFFSETS_TOPIC, "__security", "__audit", QUEUE_DEFINITIONS_TOPIC, STREAMS_TOPIC}
)


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is a topic the broker keeps for itself: one of
    :data:`INTERNAL_TOPICS`, a queue's log (a name beginning :data:`QUEUE_TOPIC_PREFIX`), or a
    cluster node's audit log (``__audit.<node id>``).
    Clients may not create, alter, delete or publish to any of them, nor see them in
    listings; they may read them, except ``__security`` and ``__audit``."""
    # "__audit.": a cluster node's audit log (tidewire.security._logs.AUDIT_TOPIC_PREFIX).
    return name in INTERNAL_TOPICS or name.startswith((QUEUE_TOPIC_PREFIX, "__audit."))


class OffsetKey(msgspec.Struct, array_like=True, frozen=True):
    version: int
    group: str
    topic: str
    partition: int


class MembershipKey(msgspec.Struct, array_like=True, frozen=True):
    version: int  # MEMBERSHIP_KEY_VERSION
    group: str


#: The first field of a :class:`MembershipKey`.
MEMBERSHIP_KEY_VERSION = 2


class OffsetValue(msgspec.Struct, array_like=True):
    version: int
    offset: int
    metadata: str
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed offset: the next offset the group will read; and where it was logged."""

    offset: int
    metadata: str
    timestamp_ms: int
    log_offset: int  # position of its record in the offsets topic: later records win


_key_decoder = msgspec.msgpack.Decoder(OffsetKey)
_membership_key_decoder = msgspec.msgpack.Decoder(MembershipKey)
_value_decoder = msgspec.msgpack.Decoder(OffsetValue)
_encoder = msgspec.msgpack.Encoder()


def partition_for(group: str) -> int:
    """The partition of :data:`OFFSETS_TOPIC` that holds ``group``'s offsets."""
    return zlib.crc32(group.encode()) % OFFSETS_PARTITIONS


class OffsetsReplication(Protocol):
    """What the store asks of the cluster layer for a partition of :data:`OFFSETS_TOPIC`."""

    def check_leader(self, partition: int) -> None:
        """Raise :class:`NotCoordinatorError` unless this node leads ``partition`` now."""

    def appended(self, partition: int) -> None:
        """Records were appended to ``partition``: wake its followers' waiting fetches."""

    def wait_replicated(self, partition: int, end: int) -> Awaitable[None]:
        """Until every in-sync replica holds the partition's records below ``end``.

        Raises:
            NotLeaderError, RequestTimedOutError: not replicated (in time)."""


class OffsetStore:
    """Every group's committed offsets, in memory, backed by :data:`OFFSETS_TOPIC`.

    Args:
        logs: the broker's log manager (open).
        clock: ms since the epoch (commit timestamps).
    """

    def __init__(self, logs: LogManager, clock: Callable[[], int] | None = None) -> None:
        self._logs = logs
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._offsets: dict[str, dict[TP, Committed]] = {}
        #: group -> (its last membership record's value, that record's log offset).
        self._memberships: dict[str, tuple[bytes, int]] = {}
        # Per partition of the internal topic: writes in flight, and a compaction under way
        # (which new writes wait for; it waits for the writes in flight).
        self._writing: dict[int, int] = {}
        self._compacting: dict[int, asyncio.Event] = {}
        self._quiet = asyncio.Condition()
        self.compactions = 0
        #: Damaged ranges of the internal topic skipped while loading, as
        #: ``(partition, first offset, end offset)`` (for health and metrics).
        self.damage_skipped: list[tuple[int, int, int]] = []
        #: In a cluster: how commits are replicated, and the partitions this node serves
        #: (leads, with their state loaded); None on a single node, which serves them all.
        self._replication: OffsetsReplication | None = None
        self._serving: set[int] | None = None

    # --- the cluster ----------------------------------------------------------------------------

    def replicate(self, replication: OffsetsReplication) -> None:
        """Run as a node of a cluster: from now on no partition is served until
        :meth:`take_over` is called for it (what was loaded from the local logs at start is
        forgotten: only the partition's leader knows it is up to date)."""
        self._replication = replication
        self._serving = set()
        self._offsets.clear()
        self._memberships.clear()

    def standalone(self) -> None:
        """Serve every partition again, as a single node (the node left its cluster)."""
        self._replication = None
        self._serving = None

    @property
    def clustered(self) -> bool:
        """Whether the store runs as a node of a cluster."""
        return self._serving is not None

    def serves(self, group: str) -> bool:
        """Whether this node is ``group``'s coordinator (always, on a single node)."""
        return self._serving is None or partition_for(group) in self._serving

    def check_coordinator(self, group: str) -> None:
        """Raise :class:`NotCoordinatorError` unless this node is ``group``'s coordinator."""
        if self._serving is not None and partition_for(group) not in self._serving:
            raise NotCoordinatorError(
                f"group {group!r}: this node does not coordinate it now (its coordinator is "
                f"the leader of {OFFSETS_TOPIC} partition {partition_for(group)})"
            )

    def take_over(self, p: int) -> None:
        """This node now leads partition ``p``: read its committed offsets from the local log
        (replicated up to the moment it took the lead) and serve its groups."""
        if self._serving is None:
            return
        self._forget_partition(p)
        plog = self._logs.logs.get((OFFSETS_TOPIC, p))
        if plog is not None:
            self._load_partition(plog, p)
        self._serving.add(p)
        log.info("%s partition %d: coordinating its groups", OFFSETS_TOPIC, p)

    def give_up(self, p: int) -> list[str]:
        """This node no longer leads partition ``p``: forget its groups' offsets.

        Returns:
            The groups of ``p`` it held.
        """
        if self._serving is None or p not in self._serving:
            return []
        self._serving.discard(p)
        groups = self._forget_partition(p)
        log.info("%s partition %d: no longer coordinating its groups", OFFSETS_TOPIC, p)
        return groups

    def _forget_partition(self, p: int) -> list[str]:
        groups = [g for g in self._offsets if partition_for(g) == p]
        for g in groups:
            del self._offsets[g]
        for g in [g for g in self._memberships if partition_for(g) == p]:
            del self._memberships[g]
        return groups

    def load(self) -> None:
        """Read the internal topic through, when it exists: the last value per key wins, a
        tombstone removes the key. An undecodable record is skipped (logged). The topic is
        created by the first write, so a broker whose groups never commit has none."""
        for p in range(OFFSETS_PARTITIONS):
            plog = self._logs.logs.get((OFFSETS_TOPIC, p))
            if plog is not None:
                self._enforce_config(p, plog)
                self._load_partition(plog, p)

    def _enforce_config(self, p: int, plog: PartitionLog) -> None:
        """Give a partition made by an older version (or, before internal topics were
        refused to clients, by a client) the broker's own settings: :func:`internal_config`,
        so that no commit is acknowledged before its fsync and none is ever deleted."""
        old, safe = plog.config, internal_config()
        if old == safe:
            return
        if replace(old, segment_bytes=safe.segment_bytes) != safe:  # more than a size
            log.warning(
                "%s had settings the broker does not use for its offsets (fsync=%s, "
                "retention_ms=%d, retention_bytes=%d); they are now fsync=always and no "
                "retention",
                plog.directory,
                old.fsync,
                old.retention_ms,
                old.retention_bytes,
            )
        self._logs.set_config(OFFSETS_TOPIC, p, safe)

    def _log_for(self, group: str) -> PartitionLog:
        """The log of ``group``'s partition, creating the missing partitions of the topic.

        Raises:
            StorageError: a log cannot be created.
        """
        key = (OFFSETS_TOPIC, partition_for(group))
        plog = self._logs.logs.get(key)
        if plog is None and self._serving is not None:  # the node layer makes it
            raise NotCoordinatorError(f"{OFFSETS_TOPIC} partition {key[1]} is not here")
        if plog is None:
            for p in range(OFFSETS_PARTITIONS):
                if (OFFSETS_TOPIC, p) not in self._logs.logs:
                    self._logs.create_log(OFFSETS_TOPIC, p, internal_config())
            plog = self._logs.logs[key]
        return plog

    def _load_partition(self, plog: PartitionLog, p: int) -> None:
        """Apply every intact record of ``plog``; a damaged range is skipped (reported), and
        the records after it still apply: the state is the last intact value of each key, and
        no committed offset goes back to an older value because of the damage."""
        offset = plog.log_start_offset
        end = plog.log_end_offset
        skipped = 0
        while offset < end:
            try:
                r = plog.read(offset, _READ_CHUNK)
            except PartitionCorruptError as exc:
                if exc.damage_end <= offset:
                    log.error("%s: offsets read up to %d only: %s", plog.directory, offset, exc)
                    return
                self.damage_skipped.append((p, exc.damage_start, exc.damage_end))
                log.error(
                    "%s: committed offsets in the damaged range %d..%d of %s are lost; the "
                    "last intact commit of each key before and after it is kept: %s",
                    OFFSETS_TOPIC,
                    exc.damage_start,
                    exc.damage_end - 1,
                    plog.directory,
                    exc.message,
                )
                offset = exc.damage_end
                continue
            except OffsetOutOfRangeError as exc:
                log.error("%s: offsets read up to %d only: %s", plog.directory, offset, exc)
                return
            if not r.data:
                return
            view = memoryview(r.data)
            for pos, h in iter_batches(view, verify=False):
                try:
                    records = list(iter_records(view[pos : pos + h.size]))
                except RecordBatchError as exc:
                    log.error("%s: batch at %d skipped: %s", plog.directory, h.base_offset, exc)
                    continue
                for rec in records:
                    if rec.offset >= offset and not self._apply(rec.key, rec.value, rec.offset):
                        skipped += 1
            offset = r.next_offset
        if skipped:
            log.warning("%s: %d undecodable offset record(s) skipped", plog.directory, skipped)

    def _apply(self, key: bytes | None, value: bytes | None, log_offset: int) -> bool:
        if key is None:
            return False
        try:
            k = _key_decoder.decode(key)
            v = None if value is None else _value_decoder.decode(value)
        except msgspec.DecodeError:
            return self._apply_membership(key, value, log_offset)
        self._set(k.group, (k.topic, k.partition), v, log_offset)
        return True

    def _apply_membership(self, key: bytes, value: bytes | None, log_offset: int) -> bool:
        try:
            k = _membership_key_decoder.decode(key)
        except msgspec.DecodeError:
            return False
        if k.version != MEMBERSHIP_KEY_VERSION:
            return False
        self._set_membership(k.group, value, log_offset)
        return True

    def _set_membership(self, group: str, value: bytes | None, log_offset: int) -> None:
        current = self._memberships.get(group)
        if current is not None and current[1] > log_offset:
            return  # a later record was applied already
        if value is None:
            self._memberships.pop(group, None)
        else:
            self._memberships[group] = (value, log_offset)

    def _set(self, group: str, tp: TP, v: OffsetValue | None, log_offset: int) -> None:
        entries = self._offsets.get(group)
        current = None if entries is None else entries.get(tp)
        if current is not None and current.log_offset > log_offset:
            return  # a later record was applied already
        if v is None:
            if entries is not None:
                entries.pop(tp, None)
                if not entries:
                    del self._offsets[group]
            return
        self._offsets.setdefault(group, {})[tp] = Committed(
            v.offset, v.metadata, v.timestamp_ms, log_offset
        )

    # --- queries --------------------------------------------------------------------------------

    def groups(self) -> set[str]:
        """Every group with at least one committed offset."""
        return set(self._offsets)

    def get(self, group: str) -> dict[TP, Committed]:
        """A copy of ``group``'s committed offsets."""
        return dict(self._offsets.get(group, {}))

    def membership(self, group: str) -> bytes | None:
        """The value of ``group``'s last membership record (None: none, or a tombstone)."""
        got = self._memberships.get(group)
        return None if got is None else got[0]

    def memberships(self, p: int) -> dict[str, bytes]:
        """The last membership record of every group of partition ``p`` that has one."""
        return {g: v for g, (v, _) in self._memberships.items() if partition_for(g) == p}

    # --- writes ---------------------------------------------------------------------------------

    async def commit(self, group: str, offsets: Mapping[TP, tuple[int, str]]) -> None:
        """Store ``offsets`` (partition -> (offset, metadata)) for ``group`` as one batch, and
        return once it is fsynced; only then does the in-memory state change.

        Raises:
            StorageError, LogFailedError, BackpressureError: the log refused; nothing is
                acknowledged (a crash may still leave it on disk).
        """
        now = self._clock()
        items = [
            (tp, OffsetValue(0, offset, metadata, now))
            for tp, (offset, metadata) in sorted(offsets.items())
        ]
        await self._write(group, self._offset_records(group, items))

    async def delete(self, group: str) -> None:
        """Write a tombstone for every committed offset of ``group`` (durably), forgetting
        them."""
        items = [(tp, None) for tp in sorted(self._offsets.get(group, {}))]
        await self._write(group, self._offset_records(group, items))

    async def write_membership(self, group: str, value: bytes | None) -> None:
        """Store ``group``'s membership record (None: the group has no members any more) and
        return once it is fsynced (in a cluster: held by every in-sync replica); only then
        does :meth:`membership` answer it.

        Raises:
            NotCoordinatorError: this node does not coordinate ``group`` (any more).
            NotEnoughReplicasError, StorageError, LogFailedError, BackpressureError: the log
                refused; nothing is acknowledged.
        """
        key = _encoder.encode(MembershipKey(MEMBERSHIP_KEY_VERSION, group))

        def apply(log_offset: int) -> None:
            self._set_membership(group, value, log_offset)

        await self._write(group, [(key, value, apply)])

    def _offset_records(
        self, group: str, items: Iterable[tuple[TP, OffsetValue | None]]
    ) -> list[_Record]:
        """Commit (or tombstone) records of ``group``: key, value, and how to apply each
        once it is stored at a log offset."""

        def applier(tp: TP, v: OffsetValue | None) -> Callable[[int], None]:
            return lambda log_offset: self._set(group, tp, v, log_offset)

        return [
            (
                _encoder.encode(OffsetKey(0, group, topic, partition)),
                None if v is None else _encoder.encode(v),
                applier((topic, partition), v),
            )
            for (topic, partition), v in items
        ]

    async def _write(self, group: str, items: list[_Record]) -> None:
        if not items:
            return
        p = partition_for(group)
        self.check_coordinator(group)
        while (compacting := self._compacting.get(p)) is not None:
            await compacting.wait()
        builder = BatchBuilder()
        now = self._clock()
        for key, value, _ in items:
            builder.append(value, key=key, timestamp_ms=now)
        plog = self._log_for(group)
        self._writing[p] = self._writing.get(p, 0) + 1
        try:
            replication = self._replication
            if replication is not None:
                replication.check_leader(p)
            (info,) = await plog.append_many_async([builder.build()], durable=True)
            if replication is not None:
                replication.appended(p)
                await replication.wait_replicated(p, info.last_offset + 1)
                if self._serving is not None and p not in self._serving:
                    return  # given up meanwhile: the new coordinator read it from the log
            for i, (_, _, apply) in enumerate(items):
                apply(info.base_offset + i)
        finally:
            self._writing[p] -= 1
            if not self._writing[p]:
                async with self._quiet:
                    self._quiet.notify_all()
        if self._worth_compacting(p, plog):
            await self.compact(p)

    def _live(self, p: int) -> list[tuple[str, TP, Committed]]:
        return [
            (group, tp, c)
            for group, entries in self._offsets.items()
            if partition_for(group) == p
            for tp, c in entries.items()
        ]

    def _worth_compacting(self, p: int, plog: PartitionLog) -> bool:
        if p in self._compacting or plog.segment_count < COMPACT_SEGMENTS:
            return False
        live = sum(len(e) for g, e in self._offsets.items() if partition_for(g) == p)
        members = sum(len(v) for g, (v, _) in self._memberships.items() if partition_for(g) == p)
        return plog.size_bytes > COMPACT_RATIO * max(live * 96 + members, 1)

    async def compact(self, p: int) -> None:
        """Rewrite partition ``p``'s live entries at the end of its log and delete the
        segments before them (see the module docstring). Commits to ``p`` wait meanwhile.

        Raises:
            StorageError, LogFailedError: the copy or the deletion failed; the log still
                holds every live value (the old segments are deleted only after the copy is
                durable).
        """
        if p in self._compacting:
            return
        plog = self._logs.logs.get((OFFSETS_TOPIC, p))
        if plog is None:
            return
        done = self._compacting[p] = asyncio.Event()
        try:
            async with self._quiet:
                await self._quiet.wait_for(lambda: not self._writing.get(p))
            live = self._live(p)
            members = [(g, v) for g, v in self._memberships.items() if partition_for(g) == p]
            batches = []
            for i in range(0, len(live), _COPY_BATCH):
                builder = BatchBuilder()
                for group, (topic, partition), c in live[i : i + _COPY_BATCH]:
                    builder.append(
                        _encoder.encode(OffsetValue(0, c.offset, c.metadata, c.timestamp_ms)),
                        key=_encoder.encode(OffsetKey(0, group, topic, partition)),
                        timestamp_ms=c.timestamp_ms,
                    )
                batches.append(builder.build())
            now = self._clock()
            for i in range(0, len(members), _COPY_BATCH):
                builder = BatchBuilder()
                for group, (value, _) in members[i : i + _COPY_BATCH]:
                    key = _encoder.encode(MembershipKey(MEMBERSHIP_KEY_VERSION, group))
                    builder.append(value, key=key, timestamp_ms=now)
                batches.append(builder.build())
            start = plog.log_end_offset
            infos = await plog.append_many_async(batches, durable=True) if batches else []
            n = 0
            for info in infos:
                for k in range(info.last_offset - info.base_offset + 1):
                    if n < len(live):
                        group, tp, c = live[n]
                        copied = OffsetValue(0, c.offset, c.metadata, c.timestamp_ms)
                        self._set(group, tp, copied, info.base_offset + k)
                    else:
                        group, (raw, _) = members[n - len(live)]
                        self._set_membership(group, raw, info.base_offset + k)
                    n += 1
            deleted = plog.delete_before(infos[0].base_offset if infos else start)
            self.compactions += 1
            log.info(
                "%s: compacted %d live offset(s) and %d membership(s); %d segment(s) deleted",
                plog.directory,
                len(live),
                len(members),
                len(deleted),
            )
        finally:
            del self._compacting[p]
            done.set()
