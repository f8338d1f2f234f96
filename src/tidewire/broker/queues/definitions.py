"""Durable exchanges, queues and bindings, kept in the broker's own log.

They live in the internal topic :data:`DEFINITIONS_TOPIC` (one partition, ``fsync=always``,
no retention). Every change is one record batch, acknowledged only once fsynced:

- key: msgpack ``["exchange", name]``, ``["queue", name]`` or ``["binding", exchange,
  destination, destination_kind, key, [[name, value], ...]]``;
- value: msgpack map of the :class:`ExchangeSpec`, :class:`QueueSpec` or :class:`Binding`
  (by field name: a field added later takes its default when reading an older record), or
  no value at all (a tombstone: deleted).

Deleting a queue writes, in the same batch, tombstones for the bindings to it; deleting an
exchange, for its bindings: a crash leaves both or neither.

:meth:`DefinitionStore.load` reads the log through and keeps the last value per key, so the
definitions are what the log says; the log recovers like any other (torn tail cut, CRCs
checked), and a damaged range is skipped (reported in ``damage_skipped``) with the records
after it still applied.

**Compaction**, as for the committed offsets (:mod:`tidewire.broker.offsets`): once the log
holds :data:`COMPACT_SEGMENTS` segments and is :data:`COMPACT_RATIO` times larger than its
live entries, the store lets the writes in flight finish, holds new ones back, appends every
live entry again, fsyncs, and deletes the whole segments before that copy. A crash in between
leaves values each key had, in log order, so the last one still wins.

**In a cluster** (:meth:`DefinitionStore.replicate`) the topic is replicated on every node
(:mod:`tidewire.cluster.queues`): a change is written only on its leader and acknowledged once
every in-sync replica holds it; every other replica applies the records it copies
(:meth:`DefinitionStore.apply_copied`), so every node knows every exchange, queue and binding.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import msgspec

from tidewire.broker.offsets import QUEUE_DEFINITIONS_TOPIC
from tidewire.broker.queues.model import Binding, ExchangeSpec, QueueSpec
from tidewire.errors import OffsetOutOfRangeError, PartitionCorruptError, RecordBatchError
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, PartitionLog

__all__ = [
    "COMPACT_RATIO",
    "COMPACT_SEGMENTS",
    "DEFINITIONS_TOPIC",
    "SEGMENT_BYTES",
    "DefinitionStore",
    "Definitions",
    "DefinitionsReplication",
    "definitions_config",
]

log = logging.getLogger("tidewire.broker")

#: The internal topic of durable queue definitions.
DEFINITIONS_TOPIC = QUEUE_DEFINITIONS_TOPIC
#: Segment size of its log: definitions are small and change rarely.
SEGMENT_BYTES = 1024 * 1024
#: The log is compacted once it has this many segments ...
COMPACT_SEGMENTS = 4
#: ... and is this many times larger than a copy of its live entries (estimated at
#: :data:`_ENTRY_BYTES` each).
COMPACT_RATIO = 4
_ENTRY_BYTES = 256
#: Bytes read at a time while loading.
_READ_CHUNK = 4 * 1024 * 1024
#: Records per batch of a compaction's copy.
_COPY_BATCH = 1024


def definitions_config(segment_bytes: int = SEGMENT_BYTES) -> LogConfig:
    """The settings of the topic's partition: acknowledged once fsynced, never deleted by
    retention (compaction keeps it small)."""
    return LogConfig(
        fsync=FsyncPolicy.ALWAYS,
        retention_ms=-1,
        retention_bytes=-1,
        segment_bytes=segment_bytes,
    )


class _ExchangeKey(msgspec.Struct, array_like=True, frozen=True, tag="exchange"):
    name: str


class _QueueKey(msgspec.Struct, array_like=True, frozen=True, tag="queue"):
    name: str


class _BindingKey(msgspec.Struct, array_like=True, frozen=True, tag="binding"):
    exchange: str
    destination: str
    destination_kind: Literal["queue", "topic"]
    key: str
    arguments: tuple[tuple[str, str], ...]


_Key = _ExchangeKey | _QueueKey | _BindingKey
_Value = ExchangeSpec | QueueSpec | Binding

_encoder = msgspec.msgpack.Encoder()
_key_decoder = msgspec.msgpack.Decoder(_Key)
_value_decoders: dict[type, msgspec.msgpack.Decoder[_Value]] = {
    _ExchangeKey: msgspec.msgpack.Decoder(ExchangeSpec),
    _QueueKey: msgspec.msgpack.Decoder(QueueSpec),
    _BindingKey: msgspec.msgpack.Decoder(Binding),
}


class DefinitionsReplication(Protocol):
    """How the definitions are written in a cluster (:mod:`tidewire.cluster.queues`)."""

    async def check_leader(self) -> None:
        """Before a write: this node leads the topic (made through etcd by the first
        change) with at least ``min_insync_replicas`` in-sync replicas.

        Raises:
            NotLeaderError (naming the leader), NotEnoughReplicasError, RequestTimedOutError.
        """

    async def wait_replicated(self, end: int) -> None:
        """After a write: until every in-sync replica holds the topic below ``end``."""


def _binding_key(b: Binding) -> _BindingKey:
    return _BindingKey(b.exchange, b.destination, b.destination_kind, b.key, b.arguments)


def _key_of(v: _Value) -> _Key:
    if isinstance(v, ExchangeSpec):
        return _ExchangeKey(v.name)
    if isinstance(v, QueueSpec):
        return _QueueKey(v.name)
    return _binding_key(v)


@dataclass(frozen=True, slots=True)
class Definitions:
    """What the log holds: exchanges and queues by name, bindings by exchange, destination
    and key."""

    exchanges: list[ExchangeSpec] = field(default_factory=list)
    queues: list[QueueSpec] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)


class DefinitionStore:
    """The durable exchanges, queues and bindings, in memory, backed by
    :data:`DEFINITIONS_TOPIC`. The caller stores only durable things (a binding when both
    its ends are durable).

    Args:
        logs: the broker's log manager (open).
        segment_bytes: segment size of the log (smaller in tests of compaction).
        clock: ms since the epoch (record timestamps).
    """

    def __init__(
        self,
        logs: LogManager,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._logs = logs
        self._config = definitions_config(segment_bytes)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        # key -> (value, offset of its record: later records win)
        self._entries: dict[_Key, tuple[_Value, int]] = {}
        self._loaded = False
        self._writing = 0
        self._compacting: asyncio.Event | None = None
        self._quiet: asyncio.Condition | None = None
        self.compactions = 0
        #: Damaged ranges skipped while loading, as ``(first offset, end offset)``.
        self.damage_skipped: list[tuple[int, int]] = []
        self._replication: DefinitionsReplication | None = None

    def replicate(self, replication: DefinitionsReplication | None) -> None:
        """Write through ``replication`` from now on (None: as a single node again)."""
        self._replication = replication

    def apply_copied(self, data: bytes | memoryview) -> None:
        """Apply whole batches a follower copied from the leader (as :meth:`load` applies
        the log; undecodable records skipped)."""
        view = memoryview(data)
        self._loaded = True
        for pos, h in iter_batches(view, verify=False):
            try:
                records = list(iter_records(view[pos : pos + h.size]))
            except RecordBatchError as exc:
                log.error(
                    "%s: copied batch at %d skipped: %s", DEFINITIONS_TOPIC, h.base_offset, exc
                )
                continue
            for rec in records:
                self._apply(rec.key, rec.value, rec.offset)

    def reload(self) -> Definitions:
        """Forget what is in memory and read the log again (a follower's log was cut)."""
        self._entries.clear()
        self._loaded = False
        return self.load()

    # --- reading --------------------------------------------------------------------------------

    def load(self) -> Definitions:
        """Read the log through (once; later calls answer from memory): the last value per
        key wins, a tombstone removes the key, an undecodable record is skipped (logged). The
        log is created by the first write, so a broker that never stored a definition has
        none."""
        if not self._loaded:
            plog = self._logs.logs.get((DEFINITIONS_TOPIC, 0))
            if plog is not None:
                self._enforce_config(plog)
                self._load(plog)
            self._loaded = True
        return self.definitions()

    def definitions(self) -> Definitions:
        """The definitions in memory (as :meth:`load` returns them)."""
        d = Definitions()
        for value, _ in self._entries.values():
            if isinstance(value, ExchangeSpec):
                d.exchanges.append(value)
            elif isinstance(value, QueueSpec):
                d.queues.append(value)
            else:
                d.bindings.append(value)
        d.exchanges.sort(key=lambda e: e.name)
        d.queues.sort(key=lambda q: q.name)
        d.bindings.sort(
            key=lambda b: (b.exchange, b.destination_kind, b.destination, b.key, b.arguments)
        )
        return d

    def _enforce_config(self, plog: PartitionLog) -> None:
        """Give a log made with other settings (an older version, a client before internal
        topics were refused) the store's own."""
        old = plog.config
        if old == self._config:
            return
        if replace(old, segment_bytes=self._config.segment_bytes) != self._config:
            log.warning(
                "%s had settings the broker does not use for queue definitions (fsync=%s, "
                "retention_ms=%d, retention_bytes=%d); they are now fsync=always and no "
                "retention",
                plog.directory,
                old.fsync,
                old.retention_ms,
                old.retention_bytes,
            )
        self._logs.set_config(DEFINITIONS_TOPIC, 0, self._config)

    def _load(self, plog: PartitionLog) -> None:
        offset = plog.log_start_offset
        end = plog.log_end_offset
        skipped = 0
        while offset < end:
            try:
                r = plog.read(offset, _READ_CHUNK)
            except PartitionCorruptError as exc:
                if exc.damage_end <= offset:
                    log.error("%s: definitions read up to %d only: %s", plog.directory, offset, exc)
                    return
                self.damage_skipped.append((exc.damage_start, exc.damage_end))
                log.error(
                    "%s: queue definitions in the damaged range %d..%d of %s are lost; the "
                    "last intact value of each before and after it is kept: %s",
                    DEFINITIONS_TOPIC,
                    exc.damage_start,
                    exc.damage_end - 1,
                    plog.directory,
                    exc.message,
                )
                offset = exc.damage_end
                continue
            except OffsetOutOfRangeError as exc:
                log.error("%s: definitions read up to %d only: %s", plog.directory, offset, exc)
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
            log.warning("%s: %d undecodable definition record(s) skipped", plog.directory, skipped)

    def _apply(self, key: bytes | None, value: bytes | None, log_offset: int) -> bool:
        if key is None:
            return False
        try:
            k = _key_decoder.decode(key)
            v = None if value is None else _value_decoders[type(k)].decode(value)
        except msgspec.DecodeError:
            return False
        if v is not None and _key_of(v) != k:
            return False  # a value that is not the key's
        self._set(k, v, log_offset)
        return True

    def _set(self, k: _Key, v: _Value | None, log_offset: int) -> None:
        current = self._entries.get(k)
        if current is not None and current[1] > log_offset:
            return  # a later record was applied already
        if v is None:
            self._entries.pop(k, None)
        else:
            self._entries[k] = (v, log_offset)

    # --- writes ---------------------------------------------------------------------------------

    async def put_exchange(self, spec: ExchangeSpec) -> None:
        """Store an exchange (replacing one of that name); returns once fsynced.

        Raises:
            StorageError, LogFailedError, BackpressureError: the log refused; nothing is
                acknowledged (a crash may still leave it on disk).
        """
        await self._write([(_ExchangeKey(spec.name), spec)])

    async def delete_exchange(self, name: str) -> None:
        """Delete an exchange and, in the same batch, its bindings; returns once fsynced."""
        await self._write(
            [(_ExchangeKey(name), None)]
            + [
                (k, None)
                for k in self._entries
                if isinstance(k, _BindingKey) and k.exchange == name
            ]
        )

    async def put_queue(self, spec: QueueSpec) -> None:
        """Store a queue (replacing one of that name); returns once fsynced."""
        await self._write([(_QueueKey(spec.name), spec)])

    async def delete_queue(self, name: str) -> None:
        """Delete a queue and, in the same batch, the bindings to it; returns once fsynced."""
        await self._write(
            [(_QueueKey(name), None)]
            + [
                (k, None)
                for k in self._entries
                if isinstance(k, _BindingKey)
                and k.destination_kind == "queue"
                and k.destination == name
            ]
        )

    async def put_binding(self, b: Binding) -> None:
        """Store a binding; returns once fsynced."""
        await self._write([(_binding_key(b), b)])

    async def delete_binding(self, b: Binding) -> None:
        """Delete a binding; returns once fsynced."""
        await self._write([(_binding_key(b), None)])

    def _log(self) -> PartitionLog:
        plog = self._logs.logs.get((DEFINITIONS_TOPIC, 0))
        if plog is None:
            plog = self._logs.create_log(DEFINITIONS_TOPIC, 0, self._config)
        return plog

    def _condition(self) -> asyncio.Condition:
        if self._quiet is None:  # made on the loop that uses it
            self._quiet = asyncio.Condition()
        return self._quiet

    async def _write(self, items: Iterable[tuple[_Key, _Value | None]]) -> None:
        entries = list(items)
        if not self._loaded:
            self.load()  # compaction copies the live set: it must be known first
        while self._compacting is not None:
            await self._compacting.wait()
        builder = BatchBuilder()
        now = self._clock()
        for k, v in entries:
            builder.append(
                None if v is None else _encoder.encode(v),
                key=_encoder.encode(k),
                timestamp_ms=now,
            )
        rep = self._replication
        if rep is not None:
            await rep.check_leader()
        plog = self._log()
        self._writing += 1
        try:
            (info,) = await plog.append_many_async([builder.build()], durable=True)
            if rep is not None:
                await rep.wait_replicated(info.last_offset + 1)
            for i, (k, v) in enumerate(entries):
                self._set(k, v, info.base_offset + i)
        finally:
            self._writing -= 1
            if not self._writing:
                quiet = self._condition()
                async with quiet:
                    quiet.notify_all()
        if self._worth_compacting(plog):
            await self.compact()

    def _worth_compacting(self, plog: PartitionLog) -> bool:
        if self._compacting is not None or plog.segment_count < COMPACT_SEGMENTS:
            return False
        return plog.size_bytes > COMPACT_RATIO * max(len(self._entries) * _ENTRY_BYTES, 1)

    async def compact(self) -> None:
        """Rewrite the live entries at the end of the log and delete the segments before
        them (see the module docstring). Writes wait meanwhile.

        Raises:
            StorageError, LogFailedError: the copy or the deletion failed; the log still
                holds every live value (the old segments are deleted only after the copy is
                durable).
        """
        if self._compacting is not None:
            return
        plog = self._logs.logs.get((DEFINITIONS_TOPIC, 0))
        if plog is None:
            return
        done = self._compacting = asyncio.Event()
        try:
            quiet = self._condition()
            async with quiet:
                await quiet.wait_for(lambda: not self._writing)
            live = list(self._entries.items())
            now = self._clock()
            batches = []
            for i in range(0, len(live), _COPY_BATCH):
                builder = BatchBuilder()
                for k, (v, _) in live[i : i + _COPY_BATCH]:
                    builder.append(_encoder.encode(v), key=_encoder.encode(k), timestamp_ms=now)
                batches.append(builder.build())
            start = plog.log_end_offset
            infos = await plog.append_many_async(batches, durable=True) if batches else []
            n = 0
            for info in infos:
                for j in range(info.last_offset - info.base_offset + 1):
                    k, (v, _) = live[n]
                    self._set(k, v, info.base_offset + j)
                    n += 1
            deleted = plog.delete_before(infos[0].base_offset if infos else start)
            self.compactions += 1
            log.info(
                "%s: compacted %d live definition(s); %d segment(s) deleted",
                plog.directory,
                len(live),
                len(deleted),
            )
        finally:
            self._compacting = None
            done.set()
