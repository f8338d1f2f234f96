"""Where a queue keeps its messages and its delivery state.

A **durable** queue ``Q`` owns the internal topic ``__queue.Q`` of two partitions:

- partition 0, the **message log**: the published record batches, appended as they came
  (the broker writes only the base offset); a message's id is its offset here. Whole
  segments below the lowest unsettled message are deleted.
- partition 1, the **state log**: what happened to the messages, as records whose value is
  msgpack (``[kind, ...]``; every entry is idempotent, so applying one twice, or a stale one
  after a snapshot, changes nothing):

  - ``[0, [offset, ...]]`` SETTLED: acknowledged, dead-lettered, expired or dropped;
  - ``[1, [[offset, count], ...]]`` COUNTS: deliveries so far of messages taken back;
  - ``[2, base, last, expires_at_ms, deliver_at_ms]`` PROPS: a publish's TTL and delay;
  - ``[3, floor, [settled...], [[offset, count]...], [[base, last, exp, due]...]]``
    SNAPSHOT: the whole state; everything before it may go.

  Recovery reads the state log through and applies it to the message log's batches. When the
  state log holds :data:`COMPACT_SEGMENTS` segments, a snapshot is appended and the segments
  before it deleted, so it stays proportional to the unsettled messages.

Both logs use ``fsync=always``: a publish is confirmed, and a settle answered, only once
fsynced. A **transient** queue keeps its batches in memory (:class:`MemoryMessages`) and has no
state log.

**In a cluster** (:class:`QueueReplication`, :mod:`tidewire.cluster.queues`) both logs are the
two partitions of a replicated topic: an append is made only where this node leads the
partition with enough in-sync replicas, and returns once every in-sync replica holds it.
"""

from __future__ import annotations

import bisect
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from tidewire.broker.offsets import QUEUE_TOPIC_PREFIX
from tidewire.errors import OffsetOutOfRangeError, PartitionCorruptError
from tidewire.records import BatchBuilder, BatchHeader, iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, PartitionLog

__all__ = [
    "COMPACT_SEGMENTS",
    "QUEUE_TOPIC_PREFIX",
    "DurableMessages",
    "MemoryMessages",
    "MessageLog",
    "QueueReplication",
    "StateLog",
    "Stored",
    "queue_topic",
]

#: Segment size of a message log: large enough that rolling is rare, small enough that
#: settled messages are given back to the disk soon.
MESSAGE_SEGMENT_BYTES = 64 * 1024 * 1024
#: Segment size of a state log (acks are small records).
STATE_SEGMENT_BYTES = 1024 * 1024
#: A state log is compacted (snapshot, then older segments deleted) at this many segments.
COMPACT_SEGMENTS = 4
#: Bytes read at a time while loading.
_READ_CHUNK = 4 * 1024 * 1024

SETTLED, COUNTS, PROPS, SNAPSHOT = 0, 1, 2, 3

_BASE_OFFSET = struct.Struct(">q")  # a batch's first 8 bytes
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list)


class QueueReplication(Protocol):
    """How one of a durable queue's logs replicates in a cluster (one per partition:
    :mod:`tidewire.cluster.queues`)."""

    def check_leader(self) -> None:
        """Before an append: this node leads the partition with at least
        ``min_insync_replicas`` in-sync replicas.

        Raises:
            NotLeaderError, NotEnoughReplicasError: nothing is appended.
        """

    async def wait_replicated(self, end: int) -> None:
        """After an append: until every in-sync replica holds the partition below ``end``.

        Raises:
            NotLeaderError, NotEnoughReplicasAfterAppendError, RequestTimedOutError.
        """


def queue_topic(name: str) -> str:
    """The internal topic holding a durable queue's logs."""
    return QUEUE_TOPIC_PREFIX + name


def message_config() -> LogConfig:
    """A message log: acknowledged once fsynced, deleted only as messages are settled."""
    return LogConfig(
        fsync=FsyncPolicy.ALWAYS,
        retention_ms=-1,
        retention_bytes=-1,
        segment_bytes=MESSAGE_SEGMENT_BYTES,
    )


def state_config() -> LogConfig:
    """A state log: fsynced, never deleted by retention (compaction keeps it small)."""
    return LogConfig(
        fsync=FsyncPolicy.ALWAYS,
        retention_ms=-1,
        retention_bytes=-1,
        segment_bytes=STATE_SEGMENT_BYTES,
    )


@dataclass(frozen=True, slots=True)
class Stored:
    """One batch as stored: its offsets, its newest timestamp and its size (bytes)."""

    base: int
    last: int
    timestamp_ms: int
    size: int


class MessageLog:
    """The messages of a queue: append whole batches, read them back by offset."""

    @property
    def start(self) -> int:
        """The first offset still held."""
        raise NotImplementedError

    @property
    def end(self) -> int:
        """The offset the next message gets."""
        raise NotImplementedError

    async def append(self, batches: Sequence[tuple[memoryview, BatchHeader]]) -> list[Stored]:
        """Append checked batches at consecutive offsets; return once durable."""
        raise NotImplementedError

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset`` (at least one), within about
        ``max_bytes``; empty past the end."""
        raise NotImplementedError

    def delete_before(self, offset: int) -> None:
        """Give back the space of messages below ``offset`` (all settled)."""
        raise NotImplementedError

    def stored(self) -> Iterator[Stored]:
        """Every batch held, in offset order (for recovery)."""
        raise NotImplementedError

    def record(
        self, offset: int
    ) -> tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]:
        """The message at ``offset``: ``(timestamp_ms, key, value, headers)``.

        Raises:
            OffsetOutOfRangeError: no message there.
        """
        data = self.read(offset, 1)
        for pos, h in iter_batches(data, verify=False):
            if h.base_offset <= offset <= h.last_offset:
                for r in iter_records(memoryview(data)[pos : pos + h.size]):
                    if r.offset == offset:
                        return r.timestamp, r.key, r.value, r.headers
        raise OffsetOutOfRangeError(f"no message at offset {offset}")


class DurableMessages(MessageLog):
    """Messages in a partition log (``fsync=always``); replicated when ``replication`` is
    given (appended on the leader, returned once every in-sync replica holds them)."""

    def __init__(self, plog: PartitionLog, replication: QueueReplication | None = None) -> None:
        self.plog = plog
        self.replication = replication

    @property
    def start(self) -> int:
        return self.plog.log_start_offset

    @property
    def end(self) -> int:
        return self.plog.log_end_offset

    async def append(self, batches: Sequence[tuple[memoryview, BatchHeader]]) -> list[Stored]:
        rep = self.replication
        if rep is not None:
            rep.check_leader()
        infos = await self.plog.append_many_async(
            [v for v, _ in batches], durable=True, checked=[h for _, h in batches]
        )
        if rep is not None and infos:
            await rep.wait_replicated(infos[-1].last_offset + 1)
        return [Stored(i.base_offset, i.last_offset, i.max_timestamp, i.size) for i in infos]

    def read(self, offset: int, max_bytes: int) -> bytes:
        if offset >= self.plog.log_end_offset:
            return b""
        return self.plog.read(offset, max_bytes).data

    def delete_before(self, offset: int) -> None:
        self.plog.delete_before(offset)

    def stored(self) -> Iterator[Stored]:
        plog = self.plog
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            try:
                r = plog.read(offset, _READ_CHUNK)
            except PartitionCorruptError as exc:  # never served: its messages are lost
                if exc.damage_end <= offset:
                    return
                offset = exc.damage_end
                continue
            if not r.data:
                return
            for _, h in iter_batches(r.data, verify=False):
                if h.last_offset >= offset:
                    yield Stored(h.base_offset, h.last_offset, h.max_timestamp, h.size)
            offset = r.next_offset


class MemoryMessages(MessageLog):
    """Messages in memory only (a transient queue)."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._batches: list[bytes] = []
        self._start = 0
        self._end = 0

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._end

    async def append(self, batches: Sequence[tuple[memoryview, BatchHeader]]) -> list[Stored]:
        out = []
        for view, h in batches:
            buf = bytearray(view)
            _BASE_OFFSET.pack_into(buf, 0, self._end)
            self._bases.append(self._end)
            self._batches.append(bytes(buf))
            n = h.records_count
            out.append(Stored(self._end, self._end + n - 1, h.max_timestamp, h.size))
            self._end += n
        return out

    def read(self, offset: int, max_bytes: int) -> bytes:
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or offset >= self._end:
            return b""
        parts: list[bytes] = []
        size = 0
        while i < len(self._batches) and (not parts or size + len(self._batches[i]) <= max_bytes):
            parts.append(self._batches[i])
            size += len(self._batches[i])
            i += 1
        return b"".join(parts)

    def delete_before(self, offset: int) -> None:
        # Whole batches only: a batch goes once every one of its messages is below offset.
        n = 0
        while n + 1 < len(self._bases) and self._bases[n + 1] <= offset:
            n += 1
        if n and offset >= self._end:
            n = len(self._bases)
        if n:
            del self._bases[:n]
            del self._batches[:n]
            self._start = self._bases[0] if self._bases else self._end

    def stored(self) -> Iterator[Stored]:
        for buf in self._batches:
            for _, h in iter_batches(buf, verify=False):
                yield Stored(h.base_offset, h.last_offset, h.max_timestamp, h.size)


class StateLog:
    """A durable queue's state log (see the module docstring); replicated when
    ``replication`` is given (a write returns once every in-sync replica holds it)."""

    def __init__(self, plog: PartitionLog, replication: QueueReplication | None = None) -> None:
        self.plog = plog
        self.replication = replication

    async def write(self, *entries: list[object], durable: bool = True) -> None:
        """Append ``entries`` as one batch (one record each); return once fsynced unless
        ``durable`` is False (then once written). Replicated: once every in-sync replica
        holds it, in any case."""
        b = BatchBuilder()
        now = time.time_ns() // 1_000_000
        for e in entries:
            b.append(_encoder.encode(e), timestamp_ms=now)
        rep = self.replication
        if rep is not None:
            rep.check_leader()
        info = await self.plog.append_async(b.build(), durable=durable)
        if rep is not None:
            await rep.wait_replicated(info.last_offset + 1)

    async def wait_durable(self) -> None:
        """Return once everything appended so far is fsynced."""
        await self.plog.wait_durable(self.plog.log_end_offset)

    def entries(self) -> Iterator[list[Any]]:
        """Every intact entry, in log order (damaged ranges skipped)."""
        plog = self.plog
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            try:
                r = plog.read(offset, _READ_CHUNK)
            except PartitionCorruptError as exc:
                if exc.damage_end <= offset:
                    return
                offset = exc.damage_end
                continue
            if not r.data:
                return
            view = memoryview(r.data)
            for pos, h in iter_batches(view, verify=False):
                if h.last_offset < offset:
                    continue
                for rec in iter_records(view[pos : pos + h.size]):
                    if rec.offset >= offset and rec.value is not None:
                        try:
                            yield _decoder.decode(rec.value)
                        except msgspec.DecodeError:
                            continue  # not ours: skipped
            offset = r.next_offset

    def needs_compaction(self) -> bool:
        """Whether the log has grown to :data:`COMPACT_SEGMENTS` segments."""
        return self.plog.segment_count >= COMPACT_SEGMENTS

    async def compact(self, snapshot: list[object]) -> None:
        """Append ``snapshot`` (the whole state, taken now), fsync it, and delete the segments
        before it."""
        at = self.plog.log_end_offset
        await self.write(snapshot)
        self.plog.delete_before(at)


def open_logs(logs: LogManager, name: str) -> tuple[PartitionLog, PartitionLog]:
    """The message and state logs of durable queue ``name``, created when missing."""
    topic = queue_topic(name)
    out = []
    for p, cfg in ((0, message_config()), (1, state_config())):
        plog = logs.logs.get((topic, p))
        if plog is None:
            plog = logs.create_log(topic, p, cfg)
        out.append(plog)
    return out[0], out[1]
