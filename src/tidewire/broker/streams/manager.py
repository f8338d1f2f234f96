"""The lightweight streams of one broker (:class:`StreamManager`, ``broker.streams``).

Storage. Persistent messages live in the internal topic ``__streams`` (a few partitions,
fixed at its creation; a stream's partition is :func:`~.model.partition_of` its id). One send
request appends one record per partition it touches: key ``b"m"``, value the msgpack list of
its entries ``[stream, uuid, expires_at_ms, value]`` (encoded and decoded whole by msgspec);
the i-th entry of the record at offset ``o`` has position ``position(o, i)``; a header
``rings`` maps its streams whose ring size is not the default to theirs (restored at start
from a stream's oldest live message: a stream is forgotten only once all expired). What work-queue
receivers took (or a full ring pushed out) is a **take record**: key ``b"t"``, value the
msgpack list of ``[stream, pos]`` (every persistent message of ``stream`` at or below ``pos``
is taken); take records of one loop turn are written together and a receive answers once its
take record is as durable as the broker's fsync policy promises. In-memory messages never
touch the disk.

The index. Per stream one small slotted object (:class:`_Stream`): its persistent entries
(``None``, one ``(pos, expires)`` tuple, or an ``array('q')`` of interleaved pairs sorted by
position), the take cursor, the in-memory ring (a deque, only when there is one), recent
uuids (``None``, one string, or an insertion-ordered dict), the ring size and two timer
fields. A timer wheel of one-second buckets holds each stream at the second something is due
for it (its earliest expiry, or the end of its idle time when it is empty): a tick costs what
is due, never a walk over every stream. A bucket is a dict by stream id, so a stream moved to
an earlier second leaves it; the streams a send creates with one persistent message go into a
plain list of that send's instead (a list slot instead of a dict entry: created by the
million, and until their message expires they can only move earlier, when the tick skips
them in the list as it skips a stream due at another second). Persistent values are not
kept in memory: a receive or read decodes them from the log (a few recently decoded records
are cached).

Reclaim. Per partition the newest expiry of each segment's messages is known; whole segments
at the head of the log whose messages have all expired are deleted. A long-lived message
keeps its segment and every later one, as time-based retention does in Kafka.

Recovery. At start every partition is read from its start: entries that have not expired
are indexed, take records set the cursors, uuids refill the dedup windows.

In a cluster (:meth:`StreamManager.replicate`, given a :class:`StreamsReplication` by the
node layer) ``__streams`` is a replicated topic and a stream's **owner** is the leader of its
partition: the manager serves only the partitions this node leads. :meth:`~StreamManager.
take_over` indexes a partition from the local replica as recovery does (the new leader's log
is the partition's history); :meth:`~StreamManager.give_up` forgets its streams (their
in-memory messages with them) and answers the requests waiting on them with a retriable
:class:`NotLeaderError`. Any request naming a stream led elsewhere is refused the same way
(a send's items one by one). Persistent sends and take records are answered once every
in-sync replica holds them (refused below ``min_insync_replicas``), and reads see only what
is below the partition's high watermark.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import heapq
import logging
import struct
import time
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from tidewire._memory import give_back_in_thread
from tidewire.broker.offsets import STREAMS_TOPIC
from tidewire.broker.streams.model import (
    FROM_END,
    FROM_START,
    MAX_STREAM_ID_CHARS,
    POSITION_BITS,
    TOKEN_CHARS,
    TOKEN_WIDTH,
    SendItem,
    SendResult,
    StreamInfo,
    StreamMessage,
    StreamStats,
    check_stream_id,
    decode_token,
    encode_token,
    partition_of,
    token_block,
)
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    InvalidStreamError,
    LogClosedError,
    NotLeaderError,
    PartitionCorruptError,
    ShuttingDownError,
    StorageError,
    StreamFullError,
    TidewireError,
    TooManyStreamsError,
)
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, PartitionLog, intact_records

if TYPE_CHECKING:
    from tidewire.broker.core import Broker

__all__ = [
    "MAX_ENTRIES_PER_RECORD",
    "MAX_MESSAGES_PER_CALL",
    "MAX_RING_SIZE",
    "STREAMS_TOPIC",
    "StreamManager",
    "StreamsReplication",
]

log = logging.getLogger("tidewire.broker.streams")

#: Entries of one message record: the index of an entry has 16 bits of a position.
MAX_ENTRIES_PER_RECORD = (1 << POSITION_BITS) - 1
#: Messages one receive or read returns at most (each answer is held in memory whole).
MAX_MESSAGES_PER_CALL = 10_000
#: The largest ring: a ring's messages are held in memory.
MAX_RING_SIZE = 1_000_000
#: Streams one receive or read may name: each is looked at on every wake-up.
MAX_STREAMS_PER_CALL = 10_000
#: Decoded message records kept for receives and reads (a record holds up to 65,535
#: entries): at most this many, of at most :data:`RECORD_CACHE_BYTES` together. A record is
#: put there as it is written, so receivers woken by a send do not decode it again.
RECORD_CACHE = 256
RECORD_CACHE_BYTES = 64 * 1024 * 1024
#: How often the timers run with the real clock (seconds).
TICK_S = 0.25
#: Streams forgotten (and at least as many as remain) after which the index's table is made
#: anew and freed memory is given back to the system: about 120 MiB of in-memory streams.
GIVE_BACK_AFTER = 100_000
#: Bytes a record of entries leaves free below the log's largest batch (its framing).
_RECORD_SLACK = 4096

_KEY_MESSAGES = b"m"
_KEY_TAKES = b"t"
_DUPLICATE = SendResult(-1, "duplicate", "")
_OK = SendResult()

_encode = msgspec.msgpack.Encoder().encode
_decode_entries = msgspec.msgpack.Decoder(list[tuple[str, str, int, bytes]]).decode
#: A record's entries left undecoded (a receive or read decodes only the one it returns).
_decode_raw_entries = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_decode_entry = msgspec.msgpack.Decoder(tuple[str, str, int, bytes]).decode
_Entries = list[Any]  # of (stream, uuid, expires_at_ms, value) tuples or their msgspec.Raw
_decode_takes = msgspec.msgpack.Decoder(list[tuple[str, int]]).decode
#: A message record's header: the ring sizes of its streams that have not the default one.
_HEADER_RINGS = "rings"
_decode_rings = msgspec.msgpack.Decoder(dict[str, int]).decode
_crc = zlib.crc32
_TOKEN_RAW = struct.Struct(">BIq").pack  # model's token: version 1, crc32 of the id, position
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_b2a = binascii.b2a_base64


class StreamsReplication(Protocol):
    """How the partitions of ``__streams`` replicate in a cluster (the node layer's
    :class:`~tidewire.cluster.streams.ClusterStreams`); see :meth:`StreamManager.replicate`."""

    def partition_count(self) -> int | None:
        """The partitions of the cluster's ``__streams`` (None: not created yet)."""
        ...

    async def ensure_topic(self) -> None:
        """Create ``__streams`` in the cluster unless it exists (raises
        RequestTimedOutError when the cluster's store does not answer)."""
        ...

    def not_leader(self, partition: int) -> NotLeaderError:
        """The error that names the partition's leader (as this node knows it)."""
        ...

    def isr_error(self, partition: int) -> TidewireError | None:
        """NotEnoughReplicasError while the partition's ISR is below its
        ``min_insync_replicas`` (None: writes may go on)."""
        ...

    def high_watermark(self, partition: int) -> int:
        """The offset below which every in-sync replica holds the partition."""
        ...

    async def wait_replicated(self, partition: int, end: int) -> None:
        """Until every in-sync replica holds the partition below ``end`` (raises what
        :meth:`~tidewire.cluster.replication.ReplicaManager.wait_replicated` raises)."""
        ...

    def appended(self, partition: int) -> None:
        """Records were appended: the followers waiting in a fetch take them at once."""
        ...


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _token(crc: int, pos: int) -> str:
    """:func:`~.model.encode_token` with the id's crc computed already."""
    # 13 bytes: 18 base64 characters and two of padding
    return _b2a(_TOKEN_RAW(1, crc, pos), newline=False).translate(_URLSAFE)[:18].decode("ascii")


def _sid_crc(sid: str) -> int:
    return _crc(sid.encode("utf-8", "surrogatepass"))


class _Stream(msgspec.Struct, gc=False):
    """One stream's index (see the module docstring).

    A msgspec struct without GC tracking: a million of them cost the cyclic garbage
    collector nothing (a full collection would otherwise walk every one), and they are made
    in C. Nothing it holds refers back to it once its receivers are gone (their entries
    are removed when they return), so it never sits in a reference cycle.
    """

    sid: str
    part: int
    ring: int
    #: The second it was last used (its idle time starts there).
    used: int
    #: None, one (pos, expires_at_ms) tuple, or array('q') of interleaved pairs.
    ents: tuple[int, int] | array[int] | None = None
    #: Every persistent message at or below this position is taken.
    cursor: int = -1
    #: In-memory messages: (value, uuid, timestamp_ms, expires_at_ms, after) where
    #: ``after`` is the newest persistent position of the stream when it was sent.
    mem: deque[tuple[bytes, str, int, int, int]] | None = None
    uuids: str | dict[str, None] | None = None
    #: The second of the wheel bucket it sits in (0: none).
    due: int = 0
    waiters: dict[_Waiter, None] | None = None
    readers: dict[_Waiter, None] | None = None
    blocked: list[asyncio.Future[None]] | None = None


class _Waiter:
    __slots__ = ("by", "fut", "woken")

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut
        self.woken = False
        #: the stream whose message woke it ("": none, or woken to return)
        self.by = ""


def _pairs(ents: tuple[int, int] | array[int] | None) -> Sequence[int]:
    if ents is None:
        return ()
    return ents


def _first_after(ents: Sequence[int], pos: int) -> int:
    """Index (of pairs) of the first entry with position > ``pos``."""
    lo, hi = 0, len(ents) // 2
    while lo < hi:
        mid = (lo + hi) // 2
        if ents[2 * mid] <= pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _pack(pairs: Sequence[int]) -> tuple[int, int] | array[int] | None:
    if not pairs:
        return None
    if len(pairs) == 2:
        return (pairs[0], pairs[1])
    return array("q", pairs)


def _ceil_s(ms: int) -> int:
    return -(-ms // 1000)


class StreamManager:
    """Every stream of ``broker`` (see the module docstring).

    Args:
        broker: the broker (its logs open).
        clock: ms since the epoch; tests pass a fake one and call :meth:`tick`.
    """

    def __init__(self, broker: Broker, *, clock: Callable[[], int] | None = None) -> None:
        self.broker = broker
        self.clock: Callable[[], int] = clock or _now_ms
        cfg = broker.config
        self.default_ttl_ms = cfg.stream_default_ttl_ms
        self.max_ttl_ms = cfg.stream_max_ttl_ms
        self.default_ring = cfg.stream_ring_size
        self.idle_s = _ceil_s(cfg.stream_idle_ms)
        self.dedup_window = cfg.stream_dedup_window
        self.max_count = cfg.stream_max_count
        self.max_receivers = cfg.stream_max_receivers
        self.max_wait_ms = cfg.stream_max_wait_ms
        self.max_message_bytes = cfg.stream_max_message_bytes
        self.partitions = cfg.stream_partitions
        #: by partition: every one on a single node, those led here in a cluster
        self._logs: dict[int, PartitionLog] = {}
        self._always = False
        #: In a cluster (see :meth:`replicate`): how the partitions replicate, the ones this
        #: node leads and serves, and a count bumped whenever one is given up (a request
        #: that waited looks again at what it holds).
        self._rep: StreamsReplication | None = None
        self._led: set[int] = set()
        self._given_up = 0
        self._record_cap = self.log_config().max_batch_bytes - _RECORD_SLACK
        self._streams: dict[str, _Stream] = {}
        #: streams evicted since memory was last given back to the system
        self._evicted_kept = 0
        #: second -> the streams due then (by id: a stream sits in one bucket at most, so an
        #: evicted or rescheduled stream is referenced by no other bucket)
        self._wheel: dict[int, dict[str, _Stream]] = {}
        self._wheel_at = 0  # buckets below this second have run
        #: second -> lists of streams created due then (see the module docstring); a
        #: stream there may have moved to an earlier second since (its ``due`` says)
        self._cohorts: dict[int, list[list[_Stream]]] = {}
        self._seg_exp: list[dict[int, int]] = []  # per partition: segment base -> newest expiry
        self._pending_takes: list[dict[str, int]] = []
        #: per partition: receives waiting for the next take record (its end offset)
        self._take_futs: list[list[asyncio.Future[int]]] = []
        self._takes_scheduled = False
        #: writes whose request was cancelled, finishing on their own
        self._background: set[asyncio.Task[Any]] = set()
        self._cache: OrderedDict[tuple[int, int], tuple[int, _Entries]]
        self._cache = OrderedDict()
        self._cache_sizes: dict[tuple[int, int], int] = {}
        self._cache_bytes = 0
        self._n_waiters = 0
        self._n_readers = 0
        self._releases = 0
        self._rr = 0
        self._closed = False
        self._loaded = False
        self.draining = False
        self._stats = StreamStats()

    # --- lifecycle ------------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the index from ``__streams`` (created by the first persistent message)."""
        logs = self.broker.logs
        existing = sorted(p for (t, p) in logs.logs if t == STREAMS_TOPIC)
        if existing and existing != list(range(len(existing))):
            # A cluster node's replicas of some partitions (a single node makes them all):
            # opened as they are, none made here; in the cluster the node serves those it
            # leads (see replicate()).
            self.partitions = existing[-1] + 1
            self._seg_exp = [{} for _ in range(self.partitions)]
            for p in existing:
                self._logs[p] = logs.logs[(STREAMS_TOPIC, p)]
        elif existing:
            if len(existing) != self.partitions:
                log.warning(
                    "%s has %d partitions; stream_partitions=%d is ignored (fixed at creation)",
                    STREAMS_TOPIC,
                    len(existing),
                    self.partitions,
                )
            self.partitions = len(existing)
            self._open_logs()
        self._pending_takes = [{} for _ in range(self.partitions)]
        self._take_futs = [[] for _ in range(self.partitions)]
        self._loaded = True
        now = self.clock()
        self._wheel_at = now // 1000
        t0 = time.perf_counter()
        for p in sorted(self._logs):
            self._load_partition(p, now)
        if self._streams:
            log.info(
                "streams: %s loaded from %s in %.2f s",
                f"{len(self._streams):,}",
                STREAMS_TOPIC,
                time.perf_counter() - t0,
            )

    def _open_logs(self) -> None:
        """Open the partitions of ``__streams``, creating the missing ones."""
        logs = self.broker.logs
        cfg = self.log_config()
        self._record_cap = cfg.max_batch_bytes - _RECORD_SLACK
        self._always = cfg.fsync is FsyncPolicy.ALWAYS
        for p in range(self.partitions):
            plog = logs.logs.get((STREAMS_TOPIC, p))
            if plog is None:
                plog = logs.create_log(STREAMS_TOPIC, p, cfg)
            else:
                self._always = plog.config.fsync is FsyncPolicy.ALWAYS
                self._record_cap = plog.config.max_batch_bytes - _RECORD_SLACK
            self._logs[p] = plog
            self._seg_exp.append({})

    def _end_position(self, p: int) -> int:
        """The position the next message of partition ``p`` gets at the earliest."""
        plog = self._logs.get(p)
        return plog.log_end_offset << POSITION_BITS if plog is not None else 0

    def log_config(self) -> LogConfig:
        """The log settings of ``__streams``: the broker's fsync policy, no retention (the
        manager deletes whole expired segments), ``stream_segment_bytes`` segments."""
        base = self.broker.config.log
        return replace(
            base,
            retention_ms=-1,
            retention_bytes=-1,
            segment_bytes=self.broker.config.stream_segment_bytes,
            max_batch_bytes=max(base.max_batch_bytes, self.max_message_bytes + 256 * 1024),
        )

    def _load_partition(self, p: int, now: int) -> None:
        plog = self._logs[p]
        streams = self._streams
        bases = plog.segment_bases
        seg_exp = self._seg_exp[p]
        now_s = now // 1000
        default_ring = self.default_ring
        window = self.dedup_window
        wheel = self._wheel
        bucket_s = -1
        bucket: dict[str, _Stream] = {}
        n_new = 0
        for rec in intact_records(plog):
            value = rec.value
            assert value is not None  # intact_records yields records with a value
            if rec.key == _KEY_MESSAGES:
                try:
                    entries = _decode_entries(value)
                except msgspec.DecodeError:
                    continue
                rings = _rings(rec.headers) if rec.headers else None
                base = rec.offset << POSITION_BITS
                newest = 0
                last_exp = exp_s = -1
                n_live = 0
                for i, (sid, uuid, exp, _value) in enumerate(entries):
                    if exp != last_exp:  # a send's entries mostly share one expiry
                        last_exp = exp
                        exp_s = -(-exp // 1000)
                        if exp > newest:  # noqa: PLR1730 (max() costs a call)
                            newest = exp
                    if exp <= now:
                        continue
                    n_live += 1
                    s = streams.get(sid)
                    if s is None:
                        ring = rings.get(sid, default_ring) if rings else default_ring
                        s = streams[sid] = _Stream(sid, p, ring, now_s)
                        n_new += 1
                    if s.ents is None:
                        s.ents = (base | i, exp)
                    else:
                        _add_entry(s, base | i, exp)
                    due = s.due
                    if due == 0 or exp_s < due:
                        if due:
                            wheel[due].pop(sid, None)
                        s.due = exp_s
                        if exp_s != bucket_s:
                            bucket_s = exp_s
                            bucket = wheel.setdefault(exp_s, {})
                        bucket[sid] = s
                    if uuid and window:
                        _remember(s, uuid, window)
                self._stats.persistent_messages += n_live
                seg = bases[_segment_index(bases, rec.offset)]
                if newest > seg_exp.get(seg, 0):
                    seg_exp[seg] = newest
            elif rec.key == _KEY_TAKES:
                try:
                    takes = _decode_takes(value)
                except msgspec.DecodeError:
                    continue
                for sid, pos in takes:
                    s = streams.get(sid)
                    if s is not None and pos > s.cursor:
                        s.cursor = pos
        self._stats.created += n_new

    async def run(self) -> None:
        """Until cancelled: apply due timers and reclaim expired segments (a failing tick is
        logged and the next one runs as usual)."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception:
                log.exception("stream timers failed (tried again in %.2f s)", TICK_S)

    async def close(self) -> None:
        """Wake every waiter (they return nothing) and write the takes still pending."""
        self._closed = True
        self._wake_everyone()
        if any(self._pending_takes):
            self._write_takes()

    def release_waiters(self) -> None:
        """Make every receive and read waiting now return at once with what it has."""
        self._releases += 1
        self._wake_everyone()

    def _wake_everyone(self) -> None:
        for s in self._streams.values():
            for group in (s.waiters, s.readers):
                if group:
                    for w in group:
                        if not w.fut.done():
                            w.fut.set_result(None)
            if s.blocked:
                for f in s.blocked:
                    if not f.done():
                        f.set_result(None)

    def _check_open(self) -> None:
        if self._closed or not self._loaded:
            raise LogClosedError("the stream manager is closed")

    # --- in a cluster ---------------------------------------------------------------------------

    def replicate(self, replication: StreamsReplication | None) -> None:
        """Run as a node of a cluster (None: as a single node again): from now on no
        partition is served until :meth:`take_over` is called for it. What :meth:`load`
        indexed at start is forgotten: only a partition's leader knows it is current."""
        for p in sorted(self._led):
            self.give_up(p)
        self._rep = replication
        self._led = set()
        self._given_up += 1
        self._wake_everyone()
        self._streams.clear()
        self._wheel.clear()
        self._cohorts.clear()
        self._cache.clear()
        self._cache_sizes.clear()
        self._cache_bytes = 0
        self._logs = {}
        self._seg_exp = [{} for _ in range(self.partitions)]
        self._pending_takes = [{} for _ in range(self.partitions)]
        self._take_futs = [[] for _ in range(self.partitions)]
        self._stats = replace_stats(
            self._stats, persistent_messages=0, in_memory_messages=0, in_memory_bytes=0
        )
        if replication is None:  # a single node serves every local partition again
            self.load()

    def serves(self, stream: str) -> bool:
        """Whether requests for ``stream`` are served here (always on a single node; in a
        cluster, when this node leads its partition)."""
        rep = self._rep
        if rep is None:
            return True
        n = rep.partition_count()
        return n is not None and partition_of(stream, n) in self._led

    @property
    def led_partitions(self) -> frozenset[int]:
        """The partitions of ``__streams`` this node serves in a cluster."""
        return frozenset(self._led)

    def take_over(self, p: int) -> None:
        """This node now leads partition ``p`` of ``__streams``: index its streams from the
        local replica (as recovery does) and serve them."""
        rep = self._rep
        if rep is None:
            return
        n = rep.partition_count()
        if n is None or not 0 <= p < n:
            log.warning(
                "%s partition %d: not in the cluster's metadata; not served", STREAMS_TOPIC, p
            )
            return
        self._resize(n)
        if p in self._led:
            self.give_up(p)
        plog = self.broker.logs.logs.get((STREAMS_TOPIC, p))
        if plog is None:
            log.warning("%s partition %d: no local log; not served", STREAMS_TOPIC, p)
            return
        self._logs[p] = plog
        self._always = plog.config.fsync is FsyncPolicy.ALWAYS
        self._record_cap = plog.config.max_batch_bytes - _RECORD_SLACK
        before = len(self._streams)
        t0 = time.perf_counter()
        self._load_partition(p, self.clock())
        self._led.add(p)
        log.info(
            "%s partition %d: serving its streams (%s indexed in %.2f s)",
            STREAMS_TOPIC,
            p,
            f"{len(self._streams) - before:,}",
            time.perf_counter() - t0,
        )

    def give_up(self, p: int) -> None:
        """This node no longer leads partition ``p``: forget its streams (in-memory messages
        included: they live on their owner only), answer the receives, reads and blocked
        sends waiting on them with a retriable NotLeaderError, and fail the take records
        not written yet."""
        if self._rep is None or p not in self._led:
            return
        self._led.discard(p)
        self._given_up += 1
        stats = self._stats
        gone = [s for s in self._streams.values() if s.part == p]
        for s in gone:
            del self._streams[s.sid]
            for group in (s.waiters, s.readers):
                if group:
                    for w in group:
                        _resolve(w.fut)
            for f in s.blocked or ():
                _resolve(f)
            stats.persistent_messages -= len(_pairs(s.ents)) // 2
            for m in s.mem or ():
                self._forget_mem(m)
            if s.due:
                bucket = self._wheel.get(s.due)
                if bucket is not None:
                    bucket.pop(s.sid, None)
                    if not bucket:
                        del self._wheel[s.due]
        self._pending_takes[p] = {}
        futs, self._take_futs[p] = self._take_futs[p], []
        for fut in futs:
            if not fut.done():
                fut.set_exception(self._not_leader(p))
        for key in [k for k in self._cache if k[0] == p]:
            del self._cache[key]
            self._cache_bytes -= self._cache_sizes.pop(key)
        self._logs.pop(p, None)
        self._seg_exp[p] = {}
        log.info(
            "%s partition %d: no longer served here (%s streams forgotten)",
            STREAMS_TOPIC,
            p,
            f"{len(gone):,}",
        )

    def _resize(self, n: int) -> None:
        """The cluster's ``__streams`` has ``n`` partitions (fixed at its creation)."""
        if n == self.partitions:
            return
        self.partitions = n
        for lists in (self._seg_exp, self._pending_takes, self._take_futs):
            while len(lists) < n:
                lists.append(type(lists[0])() if lists else {})  # type: ignore[arg-type]

    def _not_leader(self, p: int) -> NotLeaderError:
        if self._rep is None:
            return NotLeaderError(f"{STREAMS_TOPIC} partition {p} is not served here")
        return self._rep.not_leader(p)

    async def _owned(self, ids: Sequence[str], *, write: bool) -> None:
        """:meth:`_check_owned`, creating ``__streams`` in the cluster first if need be."""
        assert self._rep is not None
        if self._rep.partition_count() is None:
            await self._rep.ensure_topic()
        self._check_owned(ids, write=write)

    def _check_owned(self, ids: Sequence[str], *, write: bool = False) -> None:
        """Raise unless this node owns every stream of ``ids`` (and, ``write``, may write
        their partitions).

        Raises:
            NotLeaderError: a stream's partition is led elsewhere (or ``__streams`` is not
                made yet): retriable, the client asks the owner.
            NotEnoughReplicasError: ``write`` and a partition's ISR below its minimum.
        """
        rep = self._rep
        assert rep is not None
        n = rep.partition_count()
        if n is None:
            raise NotLeaderError(f"{STREAMS_TOPIC} is being created in the cluster; try again")
        self._resize(n)
        seen: set[int] = set()
        for sid in ids:
            p = partition_of(sid, n)
            if p in seen:
                continue
            seen.add(p)
            if p not in self._led:
                exc = rep.not_leader(p)
                raise NotLeaderError(
                    f"stream {sid[:200]!r} is owned by the leader of {STREAMS_TOPIC} partition "
                    f"{p}: {exc.message}",
                    leader_id=exc.leader_id,
                    leader_host=exc.leader_host,
                    leader_port=exc.leader_port,
                )
            if write and (err := rep.isr_error(p)) is not None:
                raise err

    async def _send_in_cluster(
        self,
        items: Sequence[SendItem],
        *,
        ring_size: int | None,
        block_ms: int,
        tokens: bool,
    ) -> list[SendResult]:
        """:meth:`send` on a node of a cluster: the items of streams owned here are stored
        (persistent ones only while their partition's ISR is large enough); the others are
        answered NotLeaderError (or NotEnoughReplicasError) each, nothing of them stored."""
        rep = self._rep
        assert rep is not None
        if rep.partition_count() is None:
            await rep.ensure_topic()
        n = rep.partition_count()
        if n is None:
            raise NotLeaderError(f"{STREAMS_TOPIC} is being created in the cluster; try again")
        self._resize(n)
        results: list[SendResult] = [_OK] * len(items)
        keep: list[int] = []
        refusals: dict[int, tuple[SendResult | None, SendResult | None]] = {}
        for k, it in enumerate(items):
            p = partition_of(it.stream, n) if isinstance(it.stream, str) else 0
            got = refusals.get(p)
            if got is None:
                if p in self._led:
                    isr = rep.isr_error(p)
                    got = (None, None if isr is None else _error(isr))
                else:
                    got = (_error(rep.not_leader(p)), None)
                refusals[p] = got
            if got[0] is not None:
                results[k] = got[0]
            elif it.persistent and got[1] is not None:
                results[k] = got[1]
            else:
                keep.append(k)
        if len(keep) == len(items):
            return await self._send_here(
                items, ring_size=ring_size, block_ms=block_ms, tokens=tokens
            )
        if keep:
            stored = await self._send_here(
                [items[k] for k in keep], ring_size=ring_size, block_ms=block_ms, tokens=tokens
            )
            for k, r in zip(keep, stored, strict=True):
                results[k] = r
        return results

    def _refuse_moved(
        self, items: Sequence[SendItem], start: int, results: list[SendResult]
    ) -> None:
        """Answer ``items[start:]`` NotLeaderError: a partition was given up while the send
        waited for room, and nothing of them was stored."""
        for k in range(start, len(items)):
            p = partition_of(items[k].stream, self.partitions)
            if p in self._led:
                exc: NotLeaderError = NotLeaderError(
                    f"a partition of {STREAMS_TOPIC} moved while the send waited for room; "
                    "nothing of it from this item on was stored: send it again"
                )
            else:
                exc = self._not_leader(p)
            results[k] = _error(exc)

    async def _replicated(
        self,
        ends: dict[int, int],
        fresh: list[_Stream],
        items: Sequence[SendItem],
        results: list[SendResult],
    ) -> None:
        """In a cluster: wait until the in-sync replicas hold the records written (each
        partition up to ``ends``), then wake the readers of ``fresh``; a persistent item of a
        partition that failed gets the failure as its result (it is stored here, maybe not
        on the replicas: NotLeaderError, RequestTimedOutError,
        NotEnoughReplicasAfterAppendError)."""
        durable = asyncio.get_running_loop().create_task(self._replicated_then_wake(ends, fresh))
        try:
            failures = await asyncio.shield(durable)
        except asyncio.CancelledError:
            self._background.add(durable)
            durable.add_done_callback(self._background_done)
            raise
        if failures:
            n = self.partitions
            for k, it in enumerate(items):
                if it.persistent and results[k].code == 0:
                    exc = failures.get(partition_of(it.stream, n))
                    if exc is not None:
                        results[k] = _error(exc)

    async def _replicated_then_wake(
        self, ends: dict[int, int], fresh: list[_Stream]
    ) -> dict[int, TidewireError]:
        rep = self._rep
        assert rep is not None
        failures: dict[int, TidewireError] = {}
        try:
            for p, end in ends.items():
                try:
                    plog = self._logs.get(p)
                    if plog is None:
                        raise self._not_leader(p)
                    if self._always:
                        await plog.wait_durable(end)
                    await rep.wait_replicated(p, end)
                except TidewireError as exc:
                    failures[p] = exc
                except Exception as exc:  # an fsync failed: the item is not acknowledged
                    failures[p] = StorageError(f"{STREAMS_TOPIC}-{p}: {exc}")
        finally:
            _wake_readers(fresh)
        return failures

    # --- sending --------------------------------------------------------------------------------

    async def send(
        self,
        items: Sequence[SendItem],
        *,
        ring_size: int | None = None,
        block_ms: int = 0,
        tokens: bool = True,
    ) -> list[SendResult]:
        """Store ``items`` (one result each, in order; see the module docstring). With
        ``tokens`` False a persistent item's result carries no token (it costs a string per
        item to make and to answer: a sender that does not read by token need not ask).

        Raises:
            InvalidStreamError: ``ring_size`` or ``block_ms`` out of range.
            StorageError, LogFailedError: the log failed and nothing of the request was
                stored. When some items were stored (other partitions, in-memory ones), each
                item whose record failed gets the error as its result instead; its uuid is
                not remembered (a retry is stored) and it pushed no waiting message out.
        """
        self._check_open()
        if self._rep is not None:
            return await self._send_in_cluster(
                items, ring_size=ring_size, block_ms=block_ms, tokens=tokens
            )
        return await self._send_here(items, ring_size=ring_size, block_ms=block_ms, tokens=tokens)

    async def _send_here(
        self,
        items: Sequence[SendItem],
        *,
        ring_size: int | None,
        block_ms: int,
        tokens: bool,
    ) -> list[SendResult]:
        """:meth:`send` of items whose streams this broker serves."""
        self._check_ring(ring_size)
        if not 0 <= block_ms <= self.max_wait_ms:
            raise InvalidStreamError(
                f"block_ms={block_ms:,} must be within 0..{self.max_wait_ms:,} (stream_max_wait_ms)"
            )
        n = len(items)
        results: list[SendResult] = [_OK] * n
        ends: dict[int, int] = {}
        fresh: list[_Stream] = []
        failures: list[BaseException] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block_ms / 1000
        releases = self._releases
        given_up = self._given_up
        i = 0
        while i < n:
            i = self._store(
                items,
                i,
                results,
                ring_size=ring_size,
                block=block_ms > 0,
                tokens=tokens,
                ends=ends,
                fresh=fresh,
                failures=failures,
            )
            if i < n:  # items[i]'s stream is full and the send may wait for room
                s = self._streams.get(items[i].stream)
                if s is not None and not await self._wait_room(s, deadline):
                    if self._closed:
                        raise LogClosedError("the stream manager is closed")
                    if given_up != self._given_up and self._rep is not None:
                        # a partition was given up while this send waited: what is left
                        # goes to its new owner (nothing of it was stored here)
                        self._refuse_moved(items, i, results)
                        break
                    if self.draining or releases != self._releases:
                        # not a full stream: its wait was cut short (retriable elsewhere)
                        results[i] = _error(
                            ShuttingDownError(
                                f"the broker is shutting down: stream {s.sid[:200]!r} had no "
                                f"room (ring_size={s.ring:,}) and the send no longer waits "
                                f"for it (block_ms={block_ms:,}); nothing of it was stored"
                            )
                        )
                        i += 1
                        continue
                    results[i] = _error(
                        StreamFullError(
                            f"stream {s.sid[:200]!r} holds {self._waiting(s, self.clock()):,} "
                            f"waiting messages (ring_size={s.ring:,}) and none was taken "
                            f"within block_ms={block_ms:,}"
                        )
                    )
                    self._stats.blocked_sends_timed_out += 1
                    i += 1
        if failures and not any(r.code == 0 for r in results):
            raise failures[0]  # nothing stored: the request failed as a whole
        if ends:
            if self._rep is not None:
                await self._replicated(ends, fresh, items, results)
            elif self._always:
                # readers are woken once the records are durable, whatever happens to
                # this send (its client may be gone, the task cancelled)
                durable = loop.create_task(self._durable_then_wake(ends, fresh))
                try:
                    await asyncio.shield(durable)
                except asyncio.CancelledError:
                    self._background.add(durable)
                    durable.add_done_callback(self._background_done)
                    raise
            else:
                _wake_readers(fresh)
        return results

    async def _durable_then_wake(self, ends: dict[int, int], fresh: list[_Stream]) -> None:
        """Wait until each partition is durable up to ``ends``; then wake the readers of
        ``fresh`` (also when an fsync failed: they read what is durable)."""
        try:
            for p, end in ends.items():
                await self._logs[p].wait_durable(end)
        finally:
            _wake_readers(fresh)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        _consume_result(task)

    def _store(
        self,
        items: Sequence[SendItem],
        start: int,
        results: list[SendResult],
        *,
        ring_size: int | None,
        block: bool,
        tokens: bool = True,
        ends: dict[int, int],
        fresh: list[_Stream],
        failures: list[BaseException],
    ) -> int:
        """Store ``items[start:]`` up to the first that must wait for room (its index, or
        ``len(items)``); everything is written before this returns. An item whose record
        could not be written gets an error result (the failure is added to ``failures``)."""
        now = self.clock()
        now_s = now // 1000
        streams = self._streams
        default_ring = self.default_ring
        ring_default = default_ring if ring_size is None else ring_size
        stats = self._stats
        nparts = self.partitions
        # per partition: records being built [position of the first entry, entries,
        # bytes, newest expiry, item indices, ring sizes other than the default]
        recs: dict[int, list[list[Any]]] = {}
        exps: dict[int, tuple[int, int]] = {}
        cap = self._record_cap
        max_bytes = self.max_message_bytes
        window = self.dedup_window
        wheel = self._wheel
        bucket_s = -1
        bucket: dict[str, _Stream] = {}
        crc32 = _crc
        always = self._always or self._rep is not None
        stop = len(items)
        k = start
        n_persistent = 0
        n_created = 0
        # streams this call may create (nothing else creates or forgets one meanwhile)
        room_new = self.max_count - len(streams)
        # per partition: the record entries are added to (plist[-1] of recs), None before
        # the partition's first
        open_recs: list[list[Any] | None] = [None] * nparts
        # the new stream that holds one persistent message and nothing else takes the fast
        # path below: its object is made whole at once (an item it does not fit goes on
        # to the general path, which handles every case)
        fast = default_ring > 0 and ring_default == default_ring
        # what each token encodes: made together once the items are stored
        tok_k: list[int] = []
        tok_crc: list[int] = []
        tok_pos: list[int] = []
        # this call's lists of new streams in the timer wheel, by second
        cohorts: dict[int, list[_Stream]] = {}
        cohort_s = -1
        cohort: list[_Stream] = []
        #: (stream, uuid) -> (stream, item): remembered once the item is stored
        new_uuids: dict[tuple[str, str], tuple[_Stream, int]] = {}
        drops: dict[str, int] = {}  # stream -> waiting messages to push out
        dropping: dict[str, _Stream] = {}
        drop_selves: list[tuple[_Stream, int]] = []  # persistent, out of the queue at once
        while k < stop:
            it = items[k]
            sid = it.stream
            value = it.value
            ttl = it.ttl_ms
            got = exps.get(ttl)
            s = streams.get(sid)
            crc = -1
            if (
                s is None
                and fast
                and got is not None
                and it.persistent
                and not it.uuid
                and len(value) <= max_bytes
                and 0 < len(sid) <= MAX_STREAM_ID_CHARS
                and "\x00" not in sid
                and n_created < room_new
            ):
                crc = crc32(sid.encode("utf-8", "surrogatepass"))
                p = crc % nparts
                rec = open_recs[p]
                size = len(value) + 3 * len(sid) + 24
                if rec is not None:
                    entries = rec[1]
                    if len(entries) < MAX_ENTRIES_PER_RECORD and rec[2] + size <= cap:
                        exp, exp_s = got
                        pos = rec[0] | len(entries)
                        entries.append((sid, "", exp, value))
                        rec[4].append(k)
                        rec[2] += size
                        if exp > rec[3]:  # noqa: PLR1730 (max() costs a call)
                            rec[3] = exp
                        s = streams[sid] = _Stream(
                            sid, p, ring_default, now_s, (pos, exp), -1, None, None, exp_s
                        )
                        if exp_s != cohort_s:
                            cohort_s = exp_s
                            if exp_s in cohorts:
                                cohort = cohorts[exp_s]
                            else:
                                cohort = cohorts[exp_s] = []
                                self._cohorts.setdefault(exp_s, []).append(cohort)
                        cohort.append(s)
                        n_created += 1
                        n_persistent += 1
                        if tokens:
                            tok_k.append(k)
                            tok_crc.append(crc)
                            tok_pos.append(pos)
                        if always:  # under fsync=always readers see it once durable
                            fresh.append(s)
                        k += 1
                        continue
            if s is None or got is None or len(value) > max_bytes:
                try:
                    if s is None and (not sid or len(sid) > MAX_STREAM_ID_CHARS or "\x00" in sid):
                        check_stream_id(sid)
                    if len(value) > max_bytes:
                        raise BatchTooLargeError(
                            f"a stream message of {len(value):,} bytes exceeds "
                            f"stream_max_message_bytes={max_bytes:,}"
                        )
                    if got is None:
                        ttl_ms = ttl or self.default_ttl_ms
                        if not 0 < ttl_ms <= self.max_ttl_ms:
                            raise InvalidStreamError(
                                f"ttl_ms={ttl:,} must be within 0..{self.max_ttl_ms:,} "
                                "(stream_max_ttl_ms; 0: the default)"
                            )
                        got = exps[ttl] = (now + ttl_ms, _ceil_s(now + ttl_ms))
                    if s is None:
                        if n_created >= room_new:
                            raise TooManyStreamsError(
                                f"{len(streams):,} streams exist (stream_max_count="
                                f"{self.max_count:,}); {sid[:200]!r} is not created"
                            )
                        if crc < 0:
                            crc = crc32(sid.encode("utf-8", "surrogatepass"))
                        s = streams[sid] = _Stream(sid, crc % nparts, ring_default, now_s)
                        n_created += 1
                except TidewireError as exc:
                    results[k] = _error(exc)
                    k += 1
                    continue
            uuid = it.uuid
            if uuid:
                u = s.uuids
                if (u is not None and (u == uuid if type(u) is str else uuid in u)) or (
                    window and (sid, uuid) in new_uuids
                ):
                    results[k] = _DUPLICATE
                    stats.duplicates += 1
                    k += 1
                    continue
            waiters = s.waiters
            room = s.ring
            # room 0: no message may wait, this one included (a persistent one is stored,
            # readable by token, but out of the work queue at once)
            if waiters:
                waiting = 0
                if s.mem or s.ents is not None:
                    waiting = self._waiting(s, now) - drops.get(sid, 0)
                if waiting >= room:  # the receivers waiting for this stream give room
                    room += _receivers(waiters, sid, waiting - room + 1)
                full = room <= 0 or waiting >= room
            else:
                full = room <= 0 or bool(
                    (s.mem or s.ents is not None)
                    and self._waiting(s, now) - drops.get(sid, 0) >= room
                )
            drop_self = False
            if full:
                if block:
                    break
                if room <= 0:
                    drop_self = True
                else:  # pushed out once the request's records are written
                    drops[sid] = drops.get(sid, 0) + 1
                    dropping[sid] = s
            if uuid and window:
                new_uuids[sid, uuid] = (s, k)
            exp, exp_s = got
            s.used = now_s
            if it.persistent:
                p = s.part
                plist = recs.get(p)
                if plist is None:
                    if not self._logs:
                        self._open_logs()
                    base = self._logs[p].log_end_offset << POSITION_BITS
                    plist = recs[p] = [[base, [], 0, 0, [], None]]
                    open_recs[p] = plist[-1]
                rec = plist[-1]
                entries = rec[1]
                size = len(value) + 3 * (len(sid) + len(uuid)) + 24
                if len(entries) >= MAX_ENTRIES_PER_RECORD or (entries and rec[2] + size > cap):
                    rec = open_recs[p] = [rec[0] + (1 << POSITION_BITS), [], 0, 0, [], None]
                    plist.append(rec)
                    entries = rec[1]
                pos = rec[0] | len(entries)
                entries.append((sid, uuid, exp, value))
                rec[4].append(k)
                if s.ring != default_ring:  # the ring size is kept for a restart
                    if rec[5] is None:
                        rec[5] = {}
                    rec[5][sid] = s.ring
                rec[2] += size
                if exp > rec[3]:  # noqa: PLR1730 (max() costs a call)
                    rec[3] = exp
                ents = s.ents
                if ents is None:
                    s.ents = (pos, exp)
                else:
                    _add_entry(s, pos, exp)
                n_persistent += 1
                if tokens:
                    if crc < 0:
                        crc = crc32(sid.encode("utf-8", "surrogatepass"))
                    tok_k.append(k)
                    tok_crc.append(crc)
                    tok_pos.append(pos)
                if drop_self:
                    drop_selves.append((s, pos))
                if always or s.readers:  # under fsync=always readers see it once durable
                    fresh.append(s)
            elif drop_self:
                stats.dropped += 1
            else:
                if s.mem is None:
                    s.mem = deque()
                ents = s.ents
                after = -1 if ents is None else ents[-2]
                s.mem.append((value, uuid, now, exp, after))
                stats.sent_in_memory += 1
                stats.in_memory_messages += 1
                stats.in_memory_bytes += len(value)
            due = s.due
            if due == 0 or exp_s < due:
                if due:
                    old = wheel.get(due)
                    if old is not None:
                        old.pop(sid, None)
                s.due = exp_s
                if exp_s != bucket_s:
                    bucket_s = exp_s
                    bucket = wheel.setdefault(exp_s, {})
                bucket[sid] = s
            if waiters and not drop_self:
                _wake_first(waiters, sid)
            k += 1
        stats.persistent_messages += n_persistent
        stats.sent_persistent += n_persistent
        stats.created += n_created
        if tok_k:
            text = token_block(tok_crc, tok_pos)
            width = TOKEN_WIDTH
            chars = TOKEN_CHARS
            if len(tok_k) == k - start:  # every item stored here has a token
                results[start:k] = [
                    SendResult(0, "", text[i : i + chars])
                    for i in range(0, width * k - width * start, width)
                ]
            else:
                for n, j in enumerate(tok_k):
                    results[j] = SendResult(0, "", text[n * width : n * width + chars])
        failed = self._append(recs, now, ends, results, failures)
        # what depended on the records being written: the uuids remembered, the take of a
        # message no room was left for, the oldest waiting messages pushed out
        for (_, uuid), (s, j) in new_uuids.items():
            if results[j].code == 0:
                _remember(s, uuid, window)
        for s, pos in drop_selves:
            if s.part not in failed and pos > s.cursor:
                s.cursor = pos
                self._note_take(s, pos)
                stats.dropped += 1
        for sid, n in drops.items():
            s = dropping[sid]
            if s.part in failed:  # (its in-memory messages may exceed the ring a while)
                continue
            for _ in range(n):
                self._drop_oldest(s, now)
        return k

    def _append(
        self,
        recs: dict[int, list[list[Any]]],
        now: int,
        ends: dict[int, int],
        results: list[SendResult],
        failures: list[BaseException],
    ) -> set[int]:
        """Write the records ``recs`` (per partition: [position of the first entry, entries,
        size estimate, newest expiry, item indices, ring sizes other than the default by
        stream]).
        Returns the partitions where a write failed: their unwritten entries are unindexed
        and their items answered with the error."""
        failed: set[int] = set()
        for p, plist in recs.items():
            plog = self._logs[p]
            for n, (base, entries, _estimate, newest, _idx, rings) in enumerate(plist):
                offset = base >> POSITION_BITS
                encoded = _encode(entries)
                b = BatchBuilder()
                headers = ((_HEADER_RINGS, _encode(rings)),) if rings else ()
                b.append(encoded, timestamp_ms=now, key=_KEY_MESSAGES, headers=headers)
                try:
                    info = plog.append(b.build())
                    if info.base_offset != offset:  # nothing else appends to __streams
                        raise AssertionError(f"{plog.directory}: at {info.base_offset}")
                except Exception as exc:
                    log.error("%s-%d: a message record failed: %s", STREAMS_TOPIC, p, exc)
                    gone = {e[0] for r in plist[n:] for e in r[1]}
                    self._unindex(
                        [s for sid in gone if (s := self._streams.get(sid)) is not None],
                        offset << POSITION_BITS,
                    )
                    err = exc if isinstance(exc, TidewireError) else StorageError(str(exc))
                    answer = _error(err)
                    n_failed = 0
                    for r in plist[n:]:
                        for j in r[4]:
                            results[j] = answer
                        n_failed += len(r[4])
                    self._stats.sent_persistent -= n_failed
                    failures.append(exc)
                    failed.add(p)
                    del plist[n:]
                    break
                ends[p] = offset + 1
                if self._rep is not None:
                    self._rep.appended(p)
                self._remember_record(p, offset, (now, entries), len(encoded))
                seg_exp = self._seg_exp[p]
                seg = plog.segment_bases[-1]
                if newest > seg_exp.get(seg, 0):
                    seg_exp[seg] = newest
        return failed

    def _unindex(self, streams: list[_Stream], from_pos: int) -> None:
        """Forget the entries at or after ``from_pos`` of ``streams`` (their write failed)."""
        for s in {s.sid: s for s in streams}.values():
            pairs = _pairs(s.ents)
            keep = list(pairs[: 2 * _first_after(pairs, from_pos - 1)])
            self._stats.persistent_messages -= (len(pairs) - len(keep)) // 2
            s.ents = _pack(keep)

    def _waiting(self, s: _Stream, now: int) -> int:
        """Messages of ``s`` a receive would take (expired ones not counted)."""
        n = 0
        if s.mem:
            n = sum(1 for m in s.mem if m[3] > now)
        ents = s.ents
        if ents is not None:
            i = _first_after(ents, s.cursor)
            n += sum(1 for j in range(2 * i + 1, len(ents), 2) if ents[j] > now)
        return n

    def _head(self, s: _Stream, now: int) -> tuple[int, int]:
        """The oldest waiting message of ``s``: ``(1, pos)`` persistent, ``(0, 0)`` the
        ring's head, ``(-1, 0)`` none (expired messages passed over and dropped)."""
        mem = s.mem
        while mem and mem[0][3] <= now:
            self._forget_mem(mem.popleft())
            self._stats.expired += 1
        pos = -1
        ents = s.ents
        if ents is not None:
            j = _first_after(ents, s.cursor)
            while 2 * j < len(ents):
                if ents[2 * j + 1] > now:
                    pos = ents[2 * j]
                    break
                j += 1
        if pos >= 0 and (not mem or pos <= mem[0][4]):
            return 1, pos
        if mem:
            return 0, 0
        return -1, 0

    def _forget_mem(self, m: tuple[bytes, str, int, int, int]) -> None:
        self._stats.in_memory_messages -= 1
        self._stats.in_memory_bytes -= len(m[0])

    def _drop_oldest(self, s: _Stream, now: int) -> bool:
        kind, pos = self._head(s, now)
        if kind < 0:
            return False
        self._stats.dropped += 1
        if kind == 0:
            assert s.mem is not None
            self._forget_mem(s.mem.popleft())
        else:
            s.cursor = pos
            self._note_take(s, pos)
        return True

    async def _wait_room(self, s: _Stream, deadline: float) -> bool:
        """Wait until ``s`` has room for one more waiting message; False at ``deadline``."""
        loop = asyncio.get_running_loop()
        releases = self._releases
        given_up = self._given_up
        while True:
            if given_up != self._given_up:
                return False  # its partition may have moved: the send looks again
            waiting = self._waiting(s, self.clock())
            room = s.ring
            if s.waiters and waiting >= room:
                room += _receivers(s.waiters, s.sid, waiting - room + 1)
            if room > 0 and waiting < room:
                return True
            left = deadline - loop.time()
            if left <= 0 or self._closed or self.draining or releases != self._releases:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            if s.blocked is None:
                s.blocked = []
            s.blocked.append(fut)
            handle = loop.call_later(left, _resolve, fut)
            try:
                await fut
            finally:
                handle.cancel()
                if s.blocked is not None:
                    with contextlib.suppress(ValueError):
                        s.blocked.remove(fut)
                    if not s.blocked:
                        s.blocked = None
                self._when_empty(s)  # a hand-over nobody took leaves it empty

    def _room_freed(self, s: _Stream) -> None:
        if s.blocked:
            for f in s.blocked:
                if not f.done():
                    f.set_result(None)

    # --- receiving (work queue) -----------------------------------------------------------------

    async def receive(
        self,
        streams: Sequence[str],
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        ring_size: int | None = None,
    ) -> list[StreamMessage]:
        """Take the oldest waiting messages of ``streams`` (up to ``max_messages`` in all),
        waiting up to ``wait_ms`` for one; ``[]`` when none came.

        Raises:
            InvalidStreamError: a bad id, a duplicated id, a bound out of range.
            TooManyStreamsError: a stream would be created beyond ``stream_max_count``.
            BackpressureError: ``stream_max_receivers`` receivers wait already.
            StorageError: the take record could not be written.
        """
        self._check_open()
        self._check_call(streams, max_messages, wait_ms)
        self._check_ring(ring_size)
        if self._rep is not None:
            await self._owned(streams, write=True)
        now = self.clock()
        ss = self._streams_for(streams, ring_size, now)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        releases = self._releases
        given_up = self._given_up
        while True:
            if given_up != self._given_up:  # a partition was given up meanwhile
                self._check_owned(streams)
                ss = self._streams_for(streams, ring_size, self.clock())
                given_up = self._given_up
            out = await self._take(ss, max_messages, now)
            if out:
                return out
            left = deadline - loop.time()
            if left <= 0 or self._closed or self.draining or releases != self._releases:
                return []
            if self._n_waiters + self._n_readers >= self.max_receivers:
                raise BackpressureError(
                    f"{self._n_waiters + self._n_readers:,} stream receivers wait already "
                    f"(stream_max_receivers={self.max_receivers:,})"
                )
            w = _Waiter(loop.create_future())
            for s in ss:
                if s.waiters is None:
                    s.waiters = {}
                s.waiters[w] = None
                _not_idle(s)
                self._room_freed(s)  # a blocked send (ring 0: a hand-over) may go now
            self._n_waiters += 1
            handle = loop.call_later(left, _resolve, w.fut)
            try:
                await w.fut
            except asyncio.CancelledError:
                if w.woken:  # a message woke it: let another receiver have it
                    for s in ss:
                        if s.waiters:
                            _wake_first(s.waiters, s.sid)
                raise
            finally:
                handle.cancel()
                self._n_waiters -= 1
                now = self.clock()
                now_s = now // 1000
                for s in ss:
                    if s.waiters is not None:
                        s.waiters.pop(w, None)
                        if not s.waiters:
                            s.waiters = None
                    s.used = now_s
                    self._when_empty(s)

    def _streams_for(self, ids: Sequence[str], ring_size: int | None, now: int) -> list[_Stream]:
        streams = self._streams
        now_s = now // 1000
        out = []
        missing = [sid for sid in ids if sid not in streams]
        if missing and len(streams) + len(missing) > self.max_count:
            raise TooManyStreamsError(
                f"{len(streams):,} streams exist (stream_max_count={self.max_count:,}); "
                f"{len(missing):,} more are not created"
            )
        ring = self.default_ring if ring_size is None else ring_size
        for sid in ids:
            s = streams.get(sid)
            if s is None:
                s = streams[sid] = _Stream(sid, partition_of(sid, self.partitions), ring, now_s)
                self._stats.created += 1
                self._schedule(s, now_s + self.idle_s)
            s.used = now_s
            out.append(s)
        return out

    async def _take(self, ss: list[_Stream], k: int, now: int) -> list[StreamMessage]:
        """Take up to ``k`` messages of ``ss`` (starting at a rotating stream, for fairness)
        and return once their take records are durable.

        Once a take record is queued the take is committed: cancelled while it is written,
        the receive gives back only the in-memory messages it took (the persistent ones are
        taken, as the record says; at most once). Failed before the record is queued (an
        unreadable message), or because a take record could not be written, the messages
        whose take is not recorded are put back at the head and the error is raised.
        """
        out: list[StreamMessage] = []
        # per stream taken from: [stream, cursor before, cursor after, in-memory messages]
        undo: list[list[Any]] = []
        n = len(ss)
        first = self._rr % n if n > 1 else 0
        self._rr += 1
        parts: set[int] = set()
        try:
            for j in range(n):
                if len(out) >= k:
                    break
                s = ss[(first + j) % n]
                mems: list[tuple[bytes, str, int, int, int]] = []
                step = [s, s.cursor, s.cursor, mems]
                while len(out) < k:
                    kind, pos = self._head(s, now)
                    if kind < 0:
                        break
                    if not mems and step[2] == step[1]:
                        undo.append(step)
                    if kind == 0:
                        assert s.mem is not None
                        m = s.mem.popleft()
                        self._forget_mem(m)
                        mems.append(m)
                        out.append(StreamMessage(s.sid, m[0], m[1], m[2], m[3], ""))
                    else:
                        out.append(self._message(s, pos))  # before the take: it may fail
                        s.cursor = step[2] = pos
                        parts.add(s.part)
        except BaseException:
            self._put_back(undo, None)
            raise
        for s, old_cursor, new_cursor, _mems in undo:
            if s.mem is not None and not s.mem:
                s.mem = None
            if new_cursor != old_cursor:
                self._note_take(s, new_cursor)
            self._room_freed(s)
            self._when_empty(s)
        # a receiver woken for one stream may have taken from another: pass the wake on
        for s in ss:
            if s.waiters and self._head(s, now)[0] >= 0:
                _wake_first(s.waiters, s.sid)
        if parts:
            # every partition's future is registered before any is awaited, so no failure
            # of one goes unseen while another is awaited
            loop = asyncio.get_running_loop()
            futs: dict[int, asyncio.Future[int]] = {}
            for p in parts:
                if self._pending_takes[p]:
                    fut: asyncio.Future[int] = loop.create_future()
                    self._take_futs[p].append(fut)
                    futs[p] = fut
            durable = loop.create_task(self._takes_durable(parts, futs))
            try:
                unwritten, failure = await asyncio.shield(durable)
            except asyncio.CancelledError:
                # committed: the take records are written whatever happens to this receive
                self._background.add(durable)
                durable.add_done_callback(self._background_done)
                self._put_back(undo, set())
                raise
            if failure is not None:
                self._put_back(undo, unwritten)
                raise failure
        self._stats.received += len(out)
        return out

    async def _takes_durable(
        self, parts: set[int], futs: dict[int, asyncio.Future[int]]
    ) -> tuple[set[int], BaseException | None]:
        """Wait until the take records of ``parts`` are durable. Returns the partitions
        whose take record was not written and the first failure (None: all durable)."""
        unwritten: set[int] = set()
        failure: BaseException | None = None
        for p in parts:
            fut = futs.get(p)
            plog = self._logs.get(p)
            try:
                if plog is None:  # given up (a cluster's partition moved)
                    raise self._not_leader(p)
                end = await fut if fut is not None else plog.log_end_offset
            except Exception as exc:  # the write failed: raised to the receiver
                unwritten.add(p)
                failure = failure or exc
                continue
            try:
                if self._always:
                    await plog.wait_durable(end)
                if self._rep is not None:
                    await self._rep.wait_replicated(p, end)
            except Exception as exc:  # written, maybe not durable: raised to the receiver
                failure = failure or exc
        return unwritten, failure

    def _put_back(self, undo: list[list[Any]], parts: set[int] | None) -> None:
        """Undo the takes of a receive that does not answer: its in-memory messages, and
        its persistent ones of ``parts`` (None: every partition) whose take is not
        recorded."""
        for s, old_cursor, new_cursor, mems in undo:
            if (parts is None or s.part in parts) and s.cursor == new_cursor:
                s.cursor = old_cursor  # (unless somebody took later messages meanwhile)
            if mems:
                if s.mem is None:
                    s.mem = deque()
                s.mem.extendleft(reversed(mems))
                for m in mems:
                    self._stats.in_memory_messages += 1
                    self._stats.in_memory_bytes += len(m[0])
            if s.waiters:
                _wake_first(s.waiters, s.sid)

    def _message(self, s: _Stream, pos: int) -> StreamMessage:
        offset = pos >> POSITION_BITS
        ts, entries = self._record(s.part, offset)
        entry = entries[pos & MAX_ENTRIES_PER_RECORD]
        if type(entry) is msgspec.Raw:
            entry = _decode_entry(entry)
        sid, uuid, exp, value = entry
        return StreamMessage(sid, value, uuid, ts, exp, _token(_sid_crc(sid), pos + 1))

    def _record(self, p: int, offset: int) -> tuple[int, _Entries]:
        key = (p, offset)
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            return got
        data = self._logs[p].read(offset, 1).data
        for pos0, h in iter_batches(data, verify=False):
            if h.base_offset <= offset <= h.last_offset:
                for rec in iter_records(memoryview(data)[pos0 : pos0 + h.size]):
                    if rec.offset == offset and rec.value is not None:
                        got = (rec.timestamp, _decode_raw_entries(rec.value))
                        self._remember_record(p, offset, got, len(rec.value))
                        return got
        raise PartitionCorruptError(f"{STREAMS_TOPIC}-{p}: no message record at {offset}")

    def _remember_record(
        self,
        p: int,
        offset: int,
        record: tuple[int, _Entries],
        size: int,
    ) -> None:
        cache, sizes = self._cache, self._cache_sizes
        key = (p, offset)
        cache[key] = record
        sizes[key] = size
        self._cache_bytes += size
        while len(cache) > 1 and (
            len(cache) > RECORD_CACHE or self._cache_bytes > RECORD_CACHE_BYTES
        ):
            old, _ = cache.popitem(last=False)
            self._cache_bytes -= sizes.pop(old)

    def _note_take(self, s: _Stream, pos: int) -> None:
        """Queue a take record ``[s, pos]`` (written at the end of this loop turn)."""
        self._pending_takes[s.part][s.sid] = pos
        if not self._takes_scheduled:
            self._takes_scheduled = True
            asyncio.get_running_loop().call_soon(self._write_takes)

    def _write_takes(self) -> None:
        self._takes_scheduled = False
        now = self.clock()
        for p, pending in enumerate(self._pending_takes):
            if not pending:
                continue
            self._pending_takes[p] = {}
            futs = self._take_futs[p]
            self._take_futs[p] = []
            b = BatchBuilder()
            b.append(_encode(list(pending.items())), timestamp_ms=now, key=_KEY_TAKES)
            try:
                plog = self._logs.get(p)
                if plog is None:  # given up (a cluster's partition moved)
                    raise self._not_leader(p)
                info = plog.append(b.build())
                if self._rep is not None:
                    self._rep.appended(p)
            except Exception as exc:
                log.error("%s-%d: a take record failed: %s", STREAMS_TOPIC, p, exc)
                for fut in futs:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            end = info.last_offset + 1
            for fut in futs:
                if not fut.done():
                    fut.set_result(end)

    # --- reading (fan-out) ----------------------------------------------------------------------

    async def read(
        self, positions: Mapping[str, str], *, max_messages: int = 100, wait_ms: int = 0
    ) -> tuple[list[StreamMessage], dict[str, str]]:
        """The persistent messages of each stream at or after its token (see the module
        docstring), up to ``max_messages`` in all, waiting up to ``wait_ms`` for one; and
        for every stream asked, the token to read it from next.

        Raises:
            InvalidStreamError: a bad id or token, a bound out of range.
            BackpressureError: ``stream_max_receivers`` receivers wait already.
        """
        self._check_open()
        ids = list(positions)
        self._check_call(ids, max_messages, wait_ms)
        if self._rep is not None:
            await self._owned(ids, write=False)
        starts: dict[str, int] = {}
        for sid in ids:
            check_stream_id(sid)
            token = positions[sid]
            if token == FROM_START:
                starts[sid] = 0
            elif token == FROM_END:
                starts[sid] = self._end_position(partition_of(sid, self.partitions))
            else:
                starts[sid] = decode_token(sid, token)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        releases = self._releases
        given_up = self._given_up
        while True:
            if given_up != self._given_up:  # a partition was given up meanwhile
                self._check_owned(ids)
                given_up = self._given_up
            out = self._read_now(starts, max_messages)
            left = deadline - loop.time()
            if out or left <= 0 or self._closed or self.draining or releases != self._releases:
                self._stats.read += len(out)
                return out, {sid: encode_token(sid, pos) for sid, pos in starts.items()}
            if self._n_waiters + self._n_readers >= self.max_receivers:
                raise BackpressureError(
                    f"{self._n_waiters + self._n_readers:,} stream receivers wait already "
                    f"(stream_max_receivers={self.max_receivers:,})"
                )
            ss = self._streams_for(ids, None, self.clock())
            w = _Waiter(loop.create_future())
            for s in ss:
                if s.readers is None:
                    s.readers = {}
                s.readers[w] = None
                _not_idle(s)
            self._n_readers += 1
            handle = loop.call_later(left, _resolve, w.fut)
            try:
                await w.fut
            finally:
                handle.cancel()
                self._n_readers -= 1
                now_s = self.clock() // 1000
                for s in ss:
                    if s.readers is not None:
                        s.readers.pop(w, None)
                        if not s.readers:
                            s.readers = None
                    s.used = now_s
                    self._when_empty(s)

    def _read_now(self, starts: dict[str, int], k: int) -> list[StreamMessage]:
        now = self.clock()
        out: list[StreamMessage] = []
        ids = list(starts)
        first = self._rr % len(ids)  # a rotating first stream: none is starved by the others
        self._rr += 1
        for sid in ids[first:] + ids[:first]:
            if len(out) >= k:
                break
            start = starts[sid]
            s = self._streams.get(sid)
            if s is None or s.ents is None:
                continue
            ents = s.ents
            if self._rep is not None:  # what every in-sync replica holds
                limit = self._rep.high_watermark(s.part) << POSITION_BITS
            elif self._always:
                limit = self._logs[s.part].flushed_offset << POSITION_BITS
            else:
                limit = 1 << 62
            j = _first_after(ents, start - 1)
            while 2 * j < len(ents) and len(out) < k:
                pos = ents[2 * j]
                if pos >= limit:
                    break
                if ents[2 * j + 1] > now:
                    out.append(self._message(s, pos))
                starts[sid] = pos + 1
                j += 1
        return out

    # --- describing -----------------------------------------------------------------------------

    def describe(self, stream: str) -> StreamInfo | None:
        """What ``stream`` holds now; None: no such stream.

        Raises:
            NotLeaderError: in a cluster, its partition is not led here.
        """
        if self._rep is not None:
            if self._rep.partition_count() is None:
                return None  # no stream was ever used in the cluster
            self._check_owned([stream])
        s = self._streams.get(stream)
        if s is None:
            return None
        return self._info(s, self.clock())

    def _info(self, s: _Stream, now: int) -> StreamInfo:
        pairs = _pairs(s.ents)
        live = [(pairs[j], pairs[j + 1]) for j in range(0, len(pairs), 2) if pairs[j + 1] > now]
        mem = [m for m in s.mem or () if m[3] > now]
        crc = _sid_crc(s.sid)
        times = [m[2] for m in mem]
        if live:  # the persistent ones' store times are in the log: read the two ends
            times.append(self._record(s.part, live[0][0] >> POSITION_BITS)[0])
            times.append(self._record(s.part, live[-1][0] >> POSITION_BITS)[0])
        end = live[-1][0] + 1 if live else self._end_position(s.part)
        return StreamInfo(
            stream=s.sid,
            partition=s.part,
            waiting=self._waiting(s, now),
            persistent=len(live),
            in_memory=len(mem),
            receivers=len(s.waiters or ()) + len(s.readers or ()),
            ring_size=s.ring,
            first_token=_token(crc, live[0][0]) if live else "",
            end_token=_token(crc, end),
            oldest_ms=min(times) if times else 0,
            newest_ms=max(times) if times else 0,
        )

    def list(self, *, prefix: str = "", after: str = "", limit: int = 1000) -> list[StreamInfo]:
        """The streams whose ids start with ``prefix``, sorted, after ``after``, at most
        ``limit`` (1..10,000)."""
        if not 1 <= limit <= MAX_MESSAGES_PER_CALL:
            raise InvalidStreamError(f"limit={limit:,} must be within 1..{MAX_MESSAGES_PER_CALL:,}")
        ids = heapq.nsmallest(
            limit, (sid for sid in self._streams if sid > after and sid.startswith(prefix))
        )
        now = self.clock()
        return [self._info(self._streams[sid], now) for sid in ids]

    def stats(self) -> StreamStats:
        """Counts over every stream."""
        st = self._stats
        return replace_stats(
            st,
            streams=len(self._streams),
            receivers=self._n_waiters + self._n_readers,
            log_bytes=sum(plog.size_bytes for plog in self._logs.values() if not plog.closed),
        )

    # --- timers ---------------------------------------------------------------------------------

    def _schedule(self, s: _Stream, at_s: int) -> None:
        """Put ``s`` in the bucket of second ``at_s`` (moved out of the one it was in; a
        second the wheel has passed already means the next tick)."""
        at_s = max(at_s, self._wheel_at)
        wheel = self._wheel
        if s.due:
            old = wheel.get(s.due)
            if old is not None:
                old.pop(s.sid, None)
                if not old:
                    del wheel[s.due]
        s.due = at_s
        bucket = wheel.get(at_s)
        if bucket is None:
            wheel[at_s] = {s.sid: s}
        else:
            bucket[s.sid] = s

    def tick(self) -> None:
        """Apply every timer due now: expire messages, evict idle empty streams, reclaim
        segments whose messages have all expired."""
        now = self.clock()
        now_s = now // 1000
        wheel, cohorts = self._wheel, self._cohorts
        if now_s - self._wheel_at > len(wheel) + len(cohorts):
            due = sorted({sec for sec in (*wheel, *cohorts) if sec <= now_s})
        else:
            due = [
                sec for sec in range(self._wheel_at, now_s + 1) if sec in wheel or sec in cohorts
            ]
        self._wheel_at = now_s + 1
        streams = self._streams
        for sec in due:
            bucket = wheel.pop(sec, None)
            groups = cohorts.pop(sec, [])
            if bucket is not None:
                groups.append(list(bucket.values()))
            for group in groups:
                for s in group:
                    # a stream may have moved to an earlier second since (and be gone)
                    if s.due == sec and streams.get(s.sid) is s:
                        s.due = 0
                        self._expire(s, now)
                        self._after_change(s, now)
        self._reclaim(now)
        if self._evicted_kept >= GIVE_BACK_AFTER and self._evicted_kept >= len(self._streams):
            self._give_back()

    def _give_back(self) -> None:
        """After most streams were forgotten: the index's table (a dict never shrinks when
        entries are deleted) made anew at its current size, and the C heap's free pages
        returned to the system (see :mod:`tidewire._memory`)."""
        n, self._evicted_kept = self._evicted_kept, 0
        self._streams = dict(self._streams)
        give_back_in_thread(f"{n:,} streams forgotten, {len(self._streams):,} left")

    def _expire(self, s: _Stream, now: int) -> None:
        expired = 0
        if s.mem:
            keep = [m for m in s.mem if m[3] > now]
            if len(keep) < len(s.mem):
                for m in s.mem:
                    if m[3] <= now:
                        self._forget_mem(m)
                expired += len(s.mem) - len(keep)
                s.mem = deque(keep) if keep else None
            elif not keep:
                s.mem = None
        ents = s.ents
        if ents is not None:
            pairs: list[int] = []
            gone = 0
            for j in range(0, len(ents), 2):
                if ents[j + 1] > now:
                    pairs += (ents[j], ents[j + 1])
                else:
                    gone += 1
            if gone:
                s.ents = _pack(pairs)
                self._stats.persistent_messages -= gone
                expired += gone
        if expired:
            self._stats.expired += expired
            self._room_freed(s)

    def _when_empty(self, s: _Stream) -> None:
        """Put an empty ``s`` in the wheel for the end of its idle time (if not earlier)."""
        if s.ents is None and not s.mem:
            at = s.used + self.idle_s
            if s.due == 0 or at < s.due:
                self._schedule(s, at)

    def _after_change(self, s: _Stream, now: int) -> None:
        """Put ``s`` in the wheel at its next due second, or evict it when idle and empty."""
        if s.due:
            return
        nxt = 0
        ents = s.ents
        if ents is not None:
            nxt = min(ents[j] for j in range(1, len(ents), 2))
        if s.mem:
            m = min(m[3] for m in s.mem)
            nxt = m if not nxt else min(nxt, m)
        if nxt:
            self._schedule(s, _ceil_s(nxt))
            return
        now_s = now // 1000
        if s.waiters or s.readers or s.blocked:
            # Not idle while waited on, and out of the wheel until the last one leaves (which
            # puts it back, _when_empty): a periodic look at every waited stream made ticks of
            # 100-300 ms an idle time after 100,000 receivers started waiting together.
            return
        idle_end = s.used + self.idle_s
        if idle_end > now_s:
            self._schedule(s, idle_end)
            return
        del self._streams[s.sid]
        self._stats.evicted += 1
        self._evicted_kept += 1

    def _reclaim(self, now: int) -> None:
        for p, plog in self._logs.items():
            if plog.closed:
                continue
            bases = plog.segment_bases
            seg_exp = self._seg_exp[p]
            upto = 0
            for j in range(len(bases) - 1):  # the active segment stays
                if seg_exp.get(bases[j], 0) > now:
                    break
                upto = bases[j + 1]
            if upto:
                try:
                    deleted = plog.delete_before(upto)
                except Exception as exc:  # the segments stay; tried again at the next tick
                    log.error(
                        "%s-%d: segments below %d not reclaimed: %s", STREAMS_TOPIC, p, upto, exc
                    )
                    continue
                for base in deleted:
                    seg_exp.pop(base, None)
                log.debug("%s-%d: segments below %d reclaimed", STREAMS_TOPIC, p, upto)

    # --- checks ---------------------------------------------------------------------------------

    def _check_call(self, streams: Sequence[str], max_messages: int, wait_ms: int) -> None:
        if not streams:
            raise InvalidStreamError("name at least one stream")
        if len(streams) > MAX_STREAMS_PER_CALL:
            raise InvalidStreamError(
                f"{len(streams):,} streams in one call exceed {MAX_STREAMS_PER_CALL:,}"
            )
        seen: set[str] = set()
        for sid in streams:
            check_stream_id(sid)
            if sid in seen:
                raise InvalidStreamError(f"stream {sid[:200]!r} is named twice")
            seen.add(sid)
        if not 1 <= max_messages <= MAX_MESSAGES_PER_CALL:
            raise InvalidStreamError(
                f"max_messages={max_messages:,} must be within 1..{MAX_MESSAGES_PER_CALL:,}"
            )
        if not 0 <= wait_ms <= self.max_wait_ms:
            raise InvalidStreamError(
                f"wait_ms={wait_ms:,} must be within 0..{self.max_wait_ms:,} (stream_max_wait_ms)"
            )

    @staticmethod
    def _check_ring(ring_size: int | None) -> None:
        if ring_size is not None and not 0 <= ring_size <= MAX_RING_SIZE:
            raise InvalidStreamError(f"ring_size={ring_size:,} must be within 0..{MAX_RING_SIZE:,}")


def replace_stats(st: StreamStats, **changes: int) -> StreamStats:
    """A copy of ``st`` with ``changes``."""
    return msgspec.structs.replace(st, **changes)


def _add_entry(s: _Stream, pos: int, exp: int) -> None:
    ents = s.ents
    if ents is None:
        s.ents = (pos, exp)
    elif type(ents) is tuple:
        s.ents = array("q", (ents[0], ents[1], pos, exp))
    else:
        assert isinstance(ents, array)
        ents.append(pos)
        ents.append(exp)


def _remember(s: _Stream, uuid: str, window: int) -> None:
    u = s.uuids
    if u is None:
        s.uuids = uuid
    elif type(u) is str:
        if window > 1:
            s.uuids = {u: None, uuid: None}
        else:
            s.uuids = uuid
    else:
        assert isinstance(u, dict)
        u[uuid] = None
        if len(u) > window:
            del u[next(iter(u))]


def _rings(headers: tuple[tuple[str, bytes | None], ...]) -> dict[str, int] | None:
    """The ring sizes a message record's headers carry (None: none, or unreadable)."""
    for key, value in headers:
        if key == _HEADER_RINGS and value is not None:
            try:
                return _decode_rings(value)
            except msgspec.DecodeError:
                return None
    return None


def _segment_index(bases: list[int], offset: int) -> int:
    lo, hi = 0, len(bases)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if bases[mid] <= offset:
            lo = mid
        else:
            hi = mid
    return lo


def _wake(w: _Waiter) -> None:
    if not w.fut.done():
        w.woken = True
        w.fut.set_result(None)


def _wake_readers(fresh: list[_Stream]) -> None:
    for s in fresh:
        if s.readers:
            for w in list(s.readers):
                _wake(w)


def _not_idle(s: _Stream) -> None:
    """``s`` is waited on: an empty stream's place in the wheel (the end of its idle time)
    is dropped, so that the tick skips it at no cost; the last receiver to leave puts it
    back (_when_empty). A stream holding messages keeps its place (their expiry)."""
    if s.ents is None and not s.mem:
        s.due = 0


def _wake_first(waiters: dict[_Waiter, None], sid: str) -> None:
    """Wake the longest waiting receiver that is not woken yet, for stream ``sid``."""
    for w in waiters:
        if not w.woken and not w.fut.done():
            _wake(w)
            w.by = sid
            return


def _receivers(waiters: dict[_Waiter, None], sid: str, upto: int) -> int:
    """The receivers of ``waiters`` that give stream ``sid`` room (up to ``upto``): those
    not woken yet and those woken for ``sid``. A receiver of many streams woken for another
    stream gives this one none (it takes one message, not one per stream)."""
    n = 0
    for w in waiters:
        if not w.woken or w.by == sid:
            n += 1
            if n >= upto:
                break
    return n


def _consume_result(task: asyncio.Task[Any]) -> None:
    """Retrieve a shielded task's outcome nobody awaits any more (its failure is logged)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("a write of a cancelled request failed: %s", task.exception())


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _error(exc: TidewireError) -> SendResult:
    return SendResult(exc.code, exc.message, "")
