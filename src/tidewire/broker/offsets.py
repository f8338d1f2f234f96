"""Committed offsets of consumer groups, kept in the broker's own log.

The offsets live in an internal topic, :data:`OFFSETS_TOPIC`, of :data:`OFFSETS_PARTITIONS`
partitions with ``fsync=always`` and no retention; a group's records all go to one partition
(CRC-32 of the group id). Each commit is one record batch, one record per partition
committed:

- key: msgpack ``[0, group, topic, partition]`` (:class:`OffsetKey`; 0 is the version);
- value: msgpack ``[0, offset, metadata, commit_timestamp_ms]`` (:class:`OffsetValue`), or
  no value at all (a tombstone: the group's offset for that partition was deleted).

The topic is compacted in spirit: at start :meth:`OffsetStore.load` reads every partition
through and keeps the last value per key, so the state is what the log says, and the log
recovers like any other (torn tail cut, CRCs checked). A commit is acknowledged only once
its batch is fsynced, which is why a committed offset never goes back across a crash: what
was acknowledged is on disk, and a commit that was written but not acknowledged before the
crash can only move it forward. Nothing rewrites the log yet, so it grows with every commit
and a start reads all of it.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from tidewire.errors import OffsetOutOfRangeError, PartitionCorruptError, RecordBatchError
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, PartitionLog

__all__ = [
    "OFFSETS_PARTITIONS",
    "OFFSETS_TOPIC",
    "Committed",
    "OffsetKey",
    "OffsetStore",
    "OffsetValue",
    "is_internal_topic",
]

log = logging.getLogger("tidewire.broker")

#: The internal topic of committed offsets.
OFFSETS_TOPIC = "__consumer_offsets"
#: Its partitions: commits of different groups go to different logs and fsync in parallel.
#: Fixed, because a group's partition is derived from it.
OFFSETS_PARTITIONS = 8
#: Bytes read at a time while loading.
_READ_CHUNK = 4 * 1024 * 1024

TP = tuple[str, int]


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is a topic the broker keeps for itself (clients may read it only)."""
    return name == OFFSETS_TOPIC


class OffsetKey(msgspec.Struct, array_like=True, frozen=True):
    version: int
    group: str
    topic: str
    partition: int


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
_value_decoder = msgspec.msgpack.Decoder(OffsetValue)
_encoder = msgspec.msgpack.Encoder()


def partition_for(group: str) -> int:
    """The partition of :data:`OFFSETS_TOPIC` that holds ``group``'s offsets."""
    return zlib.crc32(group.encode()) % OFFSETS_PARTITIONS


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

    def load(self) -> None:
        """Read the internal topic through, when it exists: the last value per key wins, a
        tombstone removes the key. An undecodable record is skipped (logged). The topic is
        created by the first write, so a broker whose groups never commit has none."""
        for p in range(OFFSETS_PARTITIONS):
            plog = self._logs.logs.get((OFFSETS_TOPIC, p))
            if plog is not None:
                self._load_partition(plog)

    def _log_for(self, group: str) -> PartitionLog:
        """The log of ``group``'s partition, creating the missing partitions of the topic.

        Raises:
            StorageError: a log cannot be created.
        """
        key = (OFFSETS_TOPIC, partition_for(group))
        plog = self._logs.logs.get(key)
        if plog is None:
            cfg = LogConfig(fsync=FsyncPolicy.ALWAYS, retention_ms=-1, retention_bytes=-1)
            for p in range(OFFSETS_PARTITIONS):
                if (OFFSETS_TOPIC, p) not in self._logs.logs:
                    self._logs.create_log(OFFSETS_TOPIC, p, cfg)
            plog = self._logs.logs[key]
        return plog

    def _load_partition(self, plog: PartitionLog) -> None:
        offset = plog.log_start_offset
        end = plog.log_end_offset
        skipped = 0
        while offset < end:
            try:
                r = plog.read(offset, _READ_CHUNK)
            except (PartitionCorruptError, OffsetOutOfRangeError) as exc:
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
            return False
        self._set(k.group, (k.topic, k.partition), v, log_offset)
        return True

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

    # --- writes ---------------------------------------------------------------------------------

    async def commit(self, group: str, offsets: Mapping[TP, tuple[int, str]]) -> None:
        """Store ``offsets`` (partition -> (offset, metadata)) for ``group`` as one batch, and
        return once it is fsynced; only then does the in-memory state change.

        Raises:
            StorageError, LogFailedError, BackpressureError: the log refused; nothing is
                acknowledged (a crash may still leave it on disk).
        """
        now = self._clock()
        await self._write(
            group,
            [
                (tp, OffsetValue(0, offset, metadata, now))
                for tp, (offset, metadata) in sorted(offsets.items())
            ],
        )

    async def delete(self, group: str) -> None:
        """Write a tombstone for every committed offset of ``group`` (durably), forgetting
        them."""
        await self._write(group, [(tp, None) for tp in sorted(self._offsets.get(group, {}))])

    async def _write(self, group: str, entries: Iterable[tuple[TP, OffsetValue | None]]) -> None:
        items = list(entries)
        if not items:
            return
        builder = BatchBuilder()
        now = self._clock()
        for (topic, partition), v in items:
            builder.append(
                None if v is None else _encoder.encode(v),
                key=_encoder.encode(OffsetKey(0, group, topic, partition)),
                timestamp_ms=now,
            )
        plog = self._log_for(group)
        (info,) = await plog.append_many_async([builder.build()], durable=True)
        for i, (tp, v) in enumerate(items):
            self._set(group, tp, v, info.base_offset + i)
