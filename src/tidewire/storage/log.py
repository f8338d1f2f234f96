"""The partition log: an ordered list of segments with appends, reads, durability and recovery.

A :class:`PartitionLog` is owned by one thread (the broker's event loop): appends, reads,
truncation and retention run there and take no locks. The only work that leaves that thread is
the blocking part of a flush (fsync of segment files, directory sync, writing the sealed
segments' indexes), which :meth:`PartitionLog.wait_durable` runs in a worker thread while more
batches are appended — group commit: one fsync acknowledges every batch written before it
started. (Under ``never`` and ``interval`` a worker thread also asks the OS to start writing
back every :data:`WRITEBACK_BYTES` appended, as RocksDB's ``bytes_per_sync`` does: the device
works while the loop appends, dirty pages do not pile up, and the next fsync has little left
to write. It is a hint: what is durable, and when, does not change.)

Durability (:class:`~tidewire.storage.config.FsyncPolicy`): under ``always`` the caller awaits
:meth:`append_async`, which returns only once an fsync covers the batch; under ``interval``
the :class:`~tidewire.storage.manager.LogManager` flushes every ``flush_interval_ms``; under
``never`` only :meth:`close` flushes.

Recovery (:meth:`PartitionLog.open`): a segment whose persisted indexes check out (CRC, and the
``.log`` size they describe) was synced when sealed and is not scanned; every other segment is
re-read with each batch CRC-checked and its indexes rebuilt. The first invalid batch found is
either a torn tail — at or beyond the recovery point, in a segment whose indexes were not
persisted (so it was scanned): the segment is cut there, later segments are dropped, and the cut
is reported — or damage — below the recovery point, or found later by a read in a segment that
was trusted: the bytes up to the next valid batch (:meth:`Segment.find_valid_batch`) form a
damaged range (:class:`~tidewire.storage.damage.Damage`). A read in the range raises
:class:`~tidewire.errors.PartitionCorruptError` carrying the range, so a reader can go on past
it; every other offset is served, appends go on at the end, and the range is logged at ERROR,
recorded in :data:`DAMAGE_FILE` and listed in :attr:`PartitionLog.damage` until an operator
quarantines it (read past as a gap) or truncates the log there. Corrupt bytes are never served
and nothing but a torn tail is ever cut without being asked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import logging
import os
import struct
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, cast

from tidewire import _step
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    InvalidConfigError,
    LogClosedError,
    LogFailedError,
    OffsetOutOfRangeError,
    PartitionCorruptError,
    RecordBatchError,
    RecordCountError,
    ReplicaAppendError,
    StorageError,
    TidewireError,
)
from tidewire.records import Record, iter_batches, iter_records
from tidewire.records.batch import LOG_OVERHEAD, BatchHeader, check_batch, check_whole_batch
from tidewire.storage.config import FsyncPolicy, LogConfig
from tidewire.storage.damage import (
    DAMAGE_FILE,
    Damage,
    copy_to_quarantine,
    quarantine_name,
    read_damage_file,
    write_damage_file,
)
from tidewire.storage.epochs import EpochHistory
from tidewire.storage.flusher import flush_threads_idle, run_flush_job
from tidewire.storage.fs import FileHandle, FileSystem, write_atomic
from tidewire.storage.segment import (
    PREFIX,
    ZERO_TAIL,
    BadBatch,
    CorruptBatchFound,
    Segment,
    SegmentMark,
    segment_name,
)

__all__ = [
    "DAMAGE_FILE",
    "EPOCH_FILE",
    "AppendInfo",
    "Damage",
    "PartitionLog",
    "ReadResult",
    "RecoveryReport",
    "check_appendable",
]

log = logging.getLogger("tidewire.storage")

#: Batches written by one pwritev: IOV_MAX (1,024 on Linux) counts two buffers per batch.
MAX_BATCHES_PER_WRITE = 500
#: Bytes gathered before a write is issued without waiting for the end of the loop turn:
#: large enough for sequential-write speed, small enough to bound what waits in memory.
MAX_BYTES_PER_WRITE = 4 * 1024 * 1024
#: Under ``never`` and ``interval``: written bytes of the active segment after which the log
#: asks the OS to start writing them back (``FileHandle.start_writeback``), off the loop.
WRITEBACK_BYTES = 8 * 1024 * 1024
#: Zeros written ahead (``PartitionLog.preallocate_bytes``): an fsync of the active segment
#: covering at most this many bytes is a small one, and zeros are written ahead only for a
#: segment that has had :data:`PREALLOCATE_AFTER_SYNCS` of them within
#: :data:`PREALLOCATE_WINDOW_MS` (a busy partition: 10,000 partitions each written now and
#: then never get any), when fewer than a quarter of them are left.
PREALLOCATE_SMALL_SYNC = 64 * 1024
#: ``PartitionLog.preallocate_bytes`` unless set (``LogManager(preallocate_bytes=...)``,
#: ``[broker] preallocate_bytes``); the range allowed.
DEFAULT_PREALLOCATE_BYTES = 256 * 1024
MIN_PREALLOCATE_BYTES = 4096
MAX_PREALLOCATE_BYTES = 16 * 1024 * 1024
PREALLOCATE_AFTER_SYNCS = 8
PREALLOCATE_WINDOW_MS = 1000
#: A lone append's group commit on the loop's own thread: under ``always``, once this many
#: group commits in a row each covered one batch, took at most :data:`INLINE_FSYNC_MAX_S`
#: and saw nothing appended while they ran (one message at a time), the next one runs its
#: fsync on the loop itself, skipping the hand-off to a flusher thread and the wake-up back
#: (two context switches and the GIL taken twice). Only a plain commit: one batch of at most
#: :data:`PREALLOCATE_SMALL_SYNC` bytes, one file to sync, no roll's directory sync or
#: indexes, no zeros written ahead or cut; only while no flusher thread is busy, no other log
#: of the process started an ``always`` commit within :data:`INLINE_ALONE_S` (partitions
#: committing side by side keep their fsyncs parallel in the threads) and no log of the
#: process was read within :data:`INLINE_ALONE_S` either (a reader waits on the loop too,
#: and one that reads as the data comes reads between some commits, not all), a read of the
#: committing log that reached its durable offset aside (a consumer under ``always``, caught
#: up, which waits for the commit wherever its fsync runs: :meth:`PartitionLog._count_read`).
#: Anything else goes to the threads, and the count starts again. A slow fsync (on the loop
#: or not) doubles the count needed, up to :data:`INLINE_FSYNC_AFTER_MAX` (a disk that
#: stalls now and then does not stall the loop each time); it halves again after twice as
#: many quick lone commits in a row.
INLINE_FSYNC_AFTER = 4
INLINE_FSYNC_AFTER_MAX = 1024
INLINE_FSYNC_MAX_S = 0.002
INLINE_ALONE_S = 0.05


@dataclass(slots=True)
class _Commits:
    """What the process's logs did lately, for :meth:`PartitionLog._inline`: the last log (its
    ``id``) to start an ``always`` commit and when, when a log other than that one last did,
    and when any log was last read (``time.perf_counter``). Read and written on the loops'
    threads without a lock: a mixed-up entry only misjudges one commit."""

    last: int = 0
    last_at: float = -1.0
    other_at: float = -1.0
    read_at: float = -1.0


_COMMITS = _Commits()
#: Default byte budget of one read.
DEFAULT_READ_BYTES = 1024 * 1024
#: The file holding a replicated log's leader epoch (absent while it is 0, as on a single
#: node): the largest epoch its batches may carry, written before any batch of a new epoch.
EPOCH_FILE = "leader-epoch"
_EPOCH_FILE_HEADER = "tidewire leader epoch v1\n"
#: The epoch bound used when :data:`EPOCH_FILE` cannot be read: any epoch a batch header can
#: hold (the batches are kept; only the check of their epoch field is lost).
_ANY_EPOCH = (1 << 31) - 1

Clock = Callable[[], int]

_ALWAYS = FsyncPolicy.ALWAYS
_INTERVAL = FsyncPolicy.INTERVAL


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an appended batch was stored."""

    base_offset: int
    last_offset: int
    size: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches read from the log, as stored (bytes, not records).

    Attributes:
        data: concatenated batches; empty when there was nothing to read.
        next_offset: the offset to read from next.
        log_start_offset: first offset still in the log.
        log_end_offset: the offset the next append gets.
    """

    data: bytes
    next_offset: int
    log_start_offset: int
    log_end_offset: int


@dataclass(slots=True)
class RecoveryReport:
    """What :meth:`PartitionLog.open` found and did."""

    clean: bool = False
    segments: int = 0
    scanned_segments: int = 0
    rebuilt_indexes: list[str] = field(default_factory=list)
    truncated_bytes: int = 0
    truncated_from_offset: int | None = None
    truncated_batches_seen: int = 0
    #: Of ``truncated_bytes``, those of a cut that held nothing but zeros (written ahead of
    #: the appends, or a write that never reached the disk): no batch was in them.
    truncated_zero_bytes: int = 0
    removed_files: list[str] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)  # damaged ranges found by the scan
    below_recovery_point: int | None = None  # the recovery point, if the log ends below it

    @property
    def corruption(self) -> Damage | None:
        """The first damaged range found, or ``None``."""
        return self.damage[0] if self.damage else None


@dataclass(slots=True)
class _Write:
    """A batch accounted for in the log, to be written at ``position`` of ``seg``.

    ``mark`` (the segment count and the active segment's state before the batch) is taken only
    for a batch that starts a ``pwritev`` of its own — the first one queued after a drain, the
    first one of a new segment, every :data:`MAX_BATCHES_PER_WRITE`-th one — because a failed
    write is undone from the first batch of that ``pwritev`` on; ``None`` for the others, which
    join the ``pwritev`` of the batch queued before them.
    """

    seg: Segment
    position: int
    buffers: tuple[bytes, memoryview]
    info: AppendInfo
    mark: tuple[int, SegmentMark] | None
    future: _Waiter | None = None


class _Waiter(Protocol):
    """What waits for a write or a group commit: an ``asyncio.Future``, or an
    :class:`_Completion` (a callback run in the very step that settles it)."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def set_exception(self, exception: BaseException | type[BaseException], /) -> None: ...


#: What :meth:`PartitionLog.append_many_soon` calls once the append is settled: the batches'
#: infos, or the error that refused them (then None).
AppendCallback = Callable[[list["AppendInfo"] | None, BaseException | None], None]


class _Completion:
    """The waiter of every write and of the group commit of one append made with
    :meth:`PartitionLog.append_many_soon`: counts them down and calls its callback directly
    in the step that settles the last one (a future would resume its awaiting task one loop
    turn later), or at the first failure (what settles after that is ignored)."""

    __slots__ = ("_callback", "_left", "infos")

    def __init__(self, parts: int, callback: AppendCallback) -> None:
        self._left = parts
        self._callback: AppendCallback | None = callback
        self.infos: list[AppendInfo] = []

    def done(self) -> bool:
        return self._callback is None

    def set_result(self, result: None, /) -> None:
        self._left -= 1
        if self._left == 0 and self._callback is not None:
            self._call(self.infos, None)

    def set_exception(self, exception: BaseException | type[BaseException], /) -> None:
        if self._callback is not None:
            exc = exception if isinstance(exception, BaseException) else exception()
            self._call(None, exc)

    def _call(self, infos: list[AppendInfo] | None, exc: BaseException | None) -> None:
        callback, self._callback = self._callback, None
        assert callback is not None
        try:
            callback(infos, exc)
        except Exception as bug:  # the log's own step (its writes, its waiters) goes on
            log.error("an append's callback failed", exc_info=bug)


#: Upper bounds of the fsync latency buckets of :class:`FlushStats`, seconds (from a local
#: SSD's fraction of a millisecond to a stalled network disk's seconds).
FLUSH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class FlushStats:
    """Group commits of a data directory's logs, for metrics: one :meth:`observe` per flush
    (never per batch). ``buckets[i]`` counts flushes that took at most ``FLUSH_BUCKETS[i]``
    seconds (not cumulative; the last entry counts the slower ones)."""

    __slots__ = ("batches", "buckets", "bytes", "count", "failures", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.failures = 0
        self.seconds = 0.0
        self.batches = 0
        self.bytes = 0
        self.buckets = [0] * (len(FLUSH_BUCKETS) + 1)

    def observe(self, seconds: float, batches: int, nbytes: int, *, failed: bool) -> None:
        self.count += 1
        self.failures += failed
        self.seconds += seconds
        self.batches += batches
        self.bytes += nbytes
        self.buckets[bisect_right(FLUSH_BUCKETS, seconds - 1e-12)] += 1


@dataclass(slots=True)
class _FlushPlan:
    target: int
    syncs: list[tuple[Segment, int]]
    sync_dir: bool
    seals: list[tuple[Segment, bytes, bytes]]
    truncations: int  # the log's truncation count when the plan was made
    #: A step that already failed on the owner thread (cutting a sealed segment's zeros): the
    #: flush fails with it, as if its own I/O had.
    failed: FlushIOError | None = None
    #: Segments whose file was cut (:meth:`Segment.trim`) before the plan was made: its syncs
    #: make their new size durable.
    cuts: list[Segment] = field(default_factory=list)
    #: Zeros were written ahead of the active segment's appends for this flush: its fsync
    #: writes them too.
    grew: bool = False
    #: A plain commit of one batch of a partition alone (:meth:`PartitionLog._inline`): if
    #: nothing was appended while it ran and it was quick, it counts towards running the
    #: next ones on the loop.
    lone: bool = False


class PartitionLog:
    """One partition's log. Create with :meth:`open`.

    Attributes:
        directory: the partition's directory.
        config: its settings.
        report: what the last :meth:`open` found.
    """

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        config: LogConfig,
        *,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self.fs = fs
        self.directory = directory
        self.config = config
        self.clock = clock
        self.report = RecoveryReport()
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._flushed = 0
        self._damage: list[Damage] = []  # sorted by start offset, disjoint
        #: Damaged ranges found since the log was opened (for metrics; never decreases).
        self.damage_found = 0
        self._failed: TidewireError | None = None
        self._closed = False
        #: Called on the first append under ``interval`` after :attr:`unflushed_marked` was
        #: cleared: how the log manager learns which logs have something to flush without
        #: walking them all.
        self.on_unflushed: Callable[[], None] | None = None
        self.unflushed_marked = False
        self._dir_dirty = False
        self._flushing = False
        self._truncations = 0  # bumped by truncate_to: flush plans made before are stale
        self._deferred_close: list[Segment] = []
        self._waiters: deque[tuple[int, _Waiter]] = deque()
        #: The event loop the log's writes and commits last ran on (see :meth:`_loop`).
        self._owner_loop: asyncio.AbstractEventLoop | None = None
        #: Set while a group commit runs in a worker thread (resolved when it is taken back).
        self._flush_running: asyncio.Future[None] | None = None
        #: Called on the owner thread when what readers may see grows: after a write under
        #: ``interval`` and ``never``, after an fsync under ``always`` (the broker wakes the
        #: long-polls and push subscriptions of this partition from here, in the same step
        #: that settles the appends' own waiters, not one loop turn after their producers).
        self.on_visible: Callable[[], None] | None = None
        #: Called after :meth:`truncate_to` (the log manager rewrites the recovery checkpoint).
        self.on_truncate: Callable[[PartitionLog], None] | None = None
        #: Zeros written ahead of the active segment's appends under ``always`` when its
        #: fsyncs are small ones (bytes; 0: never): see :meth:`_trim_and_preallocate`. A
        #: setting of the process (the log manager sets it on every log), not of the log.
        self.preallocate_bytes = DEFAULT_PREALLOCATE_BYTES
        self._pending: list[_Write] = []
        self._pending_bytes = 0
        self._drain_scheduled = False
        #: The segment and position up to which writeback was requested.
        self._writeback_seg: Segment | None = None
        self._writeback_end = 0
        self._writeback: concurrent.futures.Future[None] | None = None  # the request running
        #: Counters for metrics, bumped once per batch or per request, never per record:
        #: batches reserved at the end of the log (appended, rolled-back writes included),
        #: and messages/bytes appended by producers and handed to readers (the broker counts
        #: those, per produce and per fetch or push).
        self.batches_appended = 0
        self._batches_flushed = 0
        #: Group commits in a row of one batch each, with nothing appended while they ran,
        #: and how many it takes to run the next one on the loop (see
        #: :data:`INLINE_FSYNC_AFTER`).
        self._lone_flushes = 0
        self._inline_after = INLINE_FSYNC_AFTER
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0
        #: Where flushes are accounted (the log manager's), or None.
        self.flush_stats: FlushStats | None = None
        #: As the last open found the log (for rebuilding producer state right after it): from
        #: this offset on its recovery scan read every batch and none had a producer id;
        #: None if it did not scan the log's end.
        self.scanned_without_producers_from: int | None = None
        #: The epoch stamped on appended batches and the largest one a batch may carry (every
        #: segment's bound; the active one's stamp); persisted in :data:`EPOCH_FILE` when > 0.
        self._leader_epoch = 0
        #: The leader-epoch history, built on the first :meth:`epoch_history` (cluster code
        #: only: a single node never reads the headers for it). Local appends are not recorded
        #: one by one: every batch appended from offset :attr:`_epoch_mark` on was stamped
        #: :attr:`_leader_epoch`, which :meth:`_history_current` records when the history is
        #: read or before anything else changes it (set_leader_epoch, a replica append, a
        #: truncation): the append path does no epoch work.
        self._history: EpochHistory | None = None
        self._epoch_mark = 0

    # --- opening and recovery -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        fs: FileSystem,
        directory: str,
        config: LogConfig,
        *,
        clean: bool = False,
        recovery_point: int = 0,
        clock: Clock = wall_clock_ms,
        sync_new: bool = True,
    ) -> PartitionLog:
        """Open (creating if needed) the log in ``directory`` and recover it.

        Args:
            fs: the file system.
            directory: the partition's directory.
            config: its settings.
            clean: the previous run shut down cleanly (a segment with intact indexes is then
                trusted even if it is the active one).
            recovery_point: an offset below which everything was known synced.
            clock: milliseconds since the epoch, for rolling by age and retention.
            sync_new: sync the directory of a new log (its first segment's entry). ``False``
                when the caller makes it durable itself (one sync of the whole file system
                for many new logs) and then calls :meth:`directory_synced`.

        Raises:
            StorageError: the directory cannot be read or a file cannot be opened.
        """
        self = cls(fs, directory, config, clock=clock)
        try:
            self._recover(clean, recovery_point, sync_new)
        except OSError as exc:
            self._close_files()
            raise StorageError(f"cannot open log {directory}: {exc}") from exc
        return self

    def directory_synced(self) -> None:
        """The caller made this log's directory durable (see :meth:`open`'s ``sync_new``)."""
        self._dir_dirty = False

    def _recover(self, clean: bool, recovery_point: int, sync_new: bool = True) -> None:
        fs, d = self.fs, self.directory
        fs.makedirs(d)
        report = self.report = RecoveryReport(clean=clean)
        names = fs.listdir(d)
        bases = sorted(int(n[:20]) for n in names if _is_segment_file(n, ".log"))
        base_set = {f"{b:020d}" for b in bases}
        for n in names:
            stem = n.split(".", 1)[0]
            orphan = (n.endswith((".index", ".timeindex")) and stem not in base_set) or n.endswith(
                ".tmp"
            )
            if orphan:
                fs.remove(f"{d}/{n}")
                report.removed_files.append(n)
        if EPOCH_FILE in names:  # a replicated log: the epochs its batches may carry
            self._leader_epoch = self._read_epoch_file()
        if not bases:
            self._new_segment(0)
            if sync_new:
                self._sync_dir_now()
            return
        for base in bases:
            seg = Segment(
                fs,
                d,
                base,
                fs.open(f"{d}/{segment_name(base)}.log", create=False),
                index_interval_bytes=self.config.index_interval_bytes,
                leader_epoch=self._leader_epoch,
            )
            self._segments.append(seg)
            self._bases.append(base)
        report.segments = len(self._segments)
        i = 0
        while i < len(self._segments):
            seg = self._segments[i]
            if i > 0:
                prev = self._segments[i - 1]
                if prev.next_offset != seg.base_offset:
                    reason = (
                        f"segment starts at offset {seg.base_offset} but the previous one "
                        f"ends at {prev.next_offset}"
                    )
                    if seg.base_offset > prev.next_offset >= recovery_point:
                        # A torn tail across segments: a directory sync (of a sealed index, or
                        # by retention) made this segment's entry durable before the previous
                        # segment's unsynced tail was synced, and power was cut.
                        lost = BadBatch(prev.log_path, prev.size, prev.next_offset, reason)
                        self._cut_torn_tail(i - 1, lost, prev.file.size())
                        break
                    lo, hi = sorted((prev.next_offset, seg.base_offset))
                    self._add_damage(Damage(lo, hi, seg.log_path, 0, 0, reason))
            last = i == len(self._segments) - 1
            file_size = seg.file.size()
            has_seal = seg.load_seal(file_size)
            if has_seal and (not last or clean):
                seg.sealed = not last
            else:
                if fs.exists(seg.path(".index")):
                    report.rebuilt_indexes.append(seg.path(".index"))
                report.scanned_segments += 1
                damages, torn = seg.scan(recovery_point)
                seg.sealed = not last
                for bad, end_position, found_end in damages:
                    end_offset = found_end
                    if end_offset is None:
                        # No valid batch follows: the damage runs to the end of the file. Its
                        # offsets end where the next segment starts; in the last segment, at
                        # the recovery point at least (offsets below it were on disk).
                        end_offset = (
                            self._segments[i + 1].base_offset
                            if not last
                            else max(bad.offset + 1, recovery_point)
                        )
                        seg.next_offset = max(seg.next_offset, end_offset)
                    self._add_damage(
                        Damage(
                            bad.offset, end_offset, bad.path, bad.position, end_position, bad.reason
                        )
                    )
                if torn is not None:
                    self._cut_torn_tail(i, torn, file_size)
                    break
            i += 1
        self._load_damage_file()
        if report.damage:
            self._save_damage_file()  # what this scan found, before anything trusts a seal
        # Everything below the recovery point was synced, files and directory, by a flush
        # before the checkpoint recorded it: a log found ending there needs no sync at all
        # (at a restart of 10,000 logs, 20,000 fsyncs fewer). A tail past it does.
        covered = (
            0 < self.log_end_offset <= recovery_point
            and not report.damage
            and not report.removed_files
            and report.truncated_from_offset is None
        )
        for seg in self._segments:
            if seg.synced_size < seg.size:
                # What a crashed process left in the page cache is on disk only once synced:
                # sync it before anything recovered is counted as flushed.
                if not covered:
                    seg.file.sync()
                seg.synced_size = seg.size
        # A segment file created just before a crash may be adopted with its directory entry
        # not yet durable: one directory sync makes everything recovered count. (After a
        # clean shutdown every entry was synced by the last flush.) A covered log's entries
        # are durable but for an empty segment rolled after that flush: its next flush syncs
        # the directory.
        if covered:
            self._dir_dirty = True
        elif not clean or report.scanned_segments or report.removed_files:
            self._sync_dir_now()
        self._flushed = self.log_end_offset
        if self._flushed < recovery_point:
            report.below_recovery_point = recovery_point
            log.warning(
                "%s ends at offset %d, below its recovery point %d: data known synced is gone",
                self.directory,
                self._flushed,
                recovery_point,
            )
        # The first offset from which the scan read every batch to the end and found none of
        # an idempotent producer: rebuilding producer state need not read them again.
        self.scanned_without_producers_from = None
        for seg in reversed(self._segments):
            if seg.scan_saw_producers is not False:
                break
            self.scanned_without_producers_from = seg.base_offset
        active = self._segments[-1]
        active.sealed = False
        if active.size > 0:
            # Its age for rolling counts from this open: the creation time is not persisted.
            active.created_ms = self.clock()
        if self._leader_epoch == _ANY_EPOCH:
            self._recover_epoch()

    def _cut_torn_tail(self, i: int, bad: BadBatch, file_size: int) -> None:
        """Truncate segment ``i`` at the bad batch and drop every later segment."""
        seg = self._segments[i]
        dropped = len(self._segments) - i - 1
        cut = file_size - bad.position
        tail = seg.file.pread(min(cut, 64 * 1024 * 1024), bad.position)
        seen = sum(1 for _ in _headers_in(tail))
        seg.file.truncate(bad.position)
        seg.file.sync()
        for later in self._segments[i + 1 :]:
            cut += later.file.size()
            later.file.close()
            self._remove_segment_files(later)
        del self._segments[i + 1 :]
        del self._bases[i + 1 :]
        self._remove_seal_files(seg)
        self._sync_dir_now()
        r = self.report
        r.truncated_bytes = cut
        r.truncated_from_offset = bad.offset
        r.truncated_batches_seen = seen
        if bad.reason.startswith(ZERO_TAIL) and not dropped:
            # Zeros, no batch: what a crash leaves after zeros written ahead. Not a warning.
            r.truncated_zero_bytes = cut
            log.info(
                "recovery of %s cut %d bytes of zeros after its last batch (offset %d) in %s",
                self.directory,
                cut,
                bad.offset,
                bad.path,
            )
            return
        log.warning(
            "recovery of %s cut a torn tail: %d bytes from offset %d at byte %d of %s (%s)",
            self.directory,
            cut,
            bad.offset,
            bad.position,
            bad.path,
            bad.reason,
        )

    def _add_damage(self, d: Damage, *, persist: bool = False) -> bool:
        """Record the damaged range ``d`` (unless one starting there is known); log it.
        Returns whether it was new."""
        if any(x.start <= d.start < max(x.end, x.start + 1) for x in self._damage):
            return False
        self._damage.append(d)
        self._damage.sort(key=lambda x: x.start)
        self.report.damage.append(d)
        self.damage_found += 1
        log.error(
            "partition log %s is damaged: offsets %d..%d (bytes %d..%d of %s, %d bytes): %s; "
            "they are never served, every other offset is, and writes go on; "
            "`tidewire topic repair` quarantines or truncates the range",
            self.directory,
            d.start,
            d.end - 1,
            d.position,
            d.end_position,
            d.path,
            d.size,
            d.reason,
        )
        if persist:
            self._save_damage_file()
        return True

    def _found_while_reading(self, seg: Segment, bad: BadBatch) -> bool:
        """A batch of ``seg`` failed its checks while being read: find where valid batches
        start again and record the damaged range. Returns whether it was new."""
        try:
            found = seg.find_valid_batch(bad.position + 1, seg.size, bad.offset, seg.next_offset)
        except OSError as exc:
            raise StorageError(f"read of {seg.log_path} failed: {exc}") from exc
        if found is None:
            end_position, end = seg.size, max(seg.next_offset, bad.offset + 1)
        else:
            end_position, end = found
        d = Damage(bad.offset, end, bad.path, bad.position, end_position, bad.reason)
        return self._add_damage(d, persist=True)

    def _save_damage_file(self) -> None:
        """Rewrite :data:`DAMAGE_FILE` (a failure is logged: the damage is found again when
        read)."""
        try:
            write_damage_file(self.fs, self.directory, self._damage)
        except OSError as exc:
            log.error("cannot record the damage of %s in %s: %s", self.directory, DAMAGE_FILE, exc)

    def _load_damage_file(self) -> None:
        """Add the ranges recorded in :data:`DAMAGE_FILE` that still lie in the log."""
        try:
            recorded = read_damage_file(self.fs, self.directory)
        except (ValueError, OSError) as exc:
            log.warning("ignoring unreadable %s of %s: %s", DAMAGE_FILE, self.directory, exc)
            return
        paths = {seg.log_path for seg in self._segments}
        start, end = self.log_start_offset, self.log_end_offset
        for rec in recorded:
            if rec.path not in paths or rec.end <= start or rec.start >= end:
                continue
            found = next((x for x in self._damage if x.start == rec.start), None)
            if found is not None:
                # Found again by this open's scan: its bounds are the scan's; the record says
                # whether an operator quarantined it.
                self._damage[self._damage.index(found)] = replace(
                    found, quarantined=rec.quarantined
                )
                continue
            d = rec
            if any(x.start <= d.start < x.end for x in self._damage):
                continue
            self._damage.append(d)
            self._damage.sort(key=lambda x: x.start)
            if d.quarantined is None:
                log.error(
                    "partition log %s has a damaged range recorded: offsets %d..%d "
                    "(bytes %d..%d of %s): %s",
                    self.directory,
                    d.start,
                    d.end - 1,
                    d.position,
                    d.end_position,
                    d.path,
                    d.reason,
                )

    # --- state ----------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset in the log."""
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._segments[-1].next_offset

    @property
    def flushed_offset(self) -> int:
        """Every offset below this is on stable storage."""
        return self._flushed

    @property
    def size_bytes(self) -> int:
        """Bytes of batches in all segments."""
        return sum(s.size for s in self._segments)

    def bytes_after(self, offset: int) -> int:
        """Bytes of batches from the one holding ``offset`` to the end of the log, estimated
        from the sparse offset index without reading the log: an overestimate by at most
        one index interval (0 at or past the end; the whole log below its start)."""
        self._check_open()
        if offset >= self.log_end_offset:
            return 0
        if offset < self.log_start_offset:
            return self.size_bytes
        i = bisect_right(self._bases, offset) - 1
        seg = self._segments[i]
        _, pos = seg.index.lookup(offset)
        return max(seg.size - pos, 0) + sum(s.size for s in self._segments[i + 1 :])

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segment_bases(self) -> list[int]:
        """Base offsets of the segments, oldest first."""
        return list(self._bases)

    @property
    def active_segment_base(self) -> int:
        """The base offset of the active (last) segment: every offset below it is in a
        sealed segment (what a scrub reads)."""
        return self._bases[-1] if self._bases else self.log_end_offset

    @property
    def corruption(self) -> Damage | None:
        """The first damaged range that is not quarantined, or ``None``."""
        return next((d for d in self._damage if d.quarantined is None), None)

    @property
    def damage(self) -> tuple[Damage, ...]:
        """Every damaged range known, quarantined ones included, by offset."""
        return tuple(self._damage)

    @property
    def failed(self) -> TidewireError | None:
        """The storage failure that stopped writes, or ``None``."""
        return self._failed

    # --- appending ------------------------------------------------------------------------------

    def append(self, batch: bytes | bytearray | memoryview) -> AppendInfo:
        """Check ``batch`` (one whole batch) and append it with the next offsets, writing it
        to the OS before returning.

        The batch's bytes are written as they are but for its first 16 bytes (base offset,
        length, leader epoch; outside the CRC). It is not yet durable: see
        :meth:`append_async` and :meth:`wait_durable`.

        Raises:
            RecordBatchError: the batch is malformed (nothing is written).
            BatchTooLargeError: the batch exceeds ``max_batch_bytes``.
            PartitionCorruptError, LogFailedError, LogClosedError: the log refuses writes.
            StorageError: the write failed; the log is unchanged and stays writable.
        """
        self._drain_writes()
        write = self._reserve(batch)
        try:
            write.seg.file.pwritev(write.buffers, write.position)
        except OSError as exc:
            err = self._write_failed(write, exc)
            raise err from exc
        return write.info

    def _reserve(
        self, batch: bytes | bytearray | memoryview, checked: BatchHeader | None = None
    ) -> _Write:
        """Check ``batch`` (unless its ``checked`` header is given), roll if needed, and
        account for it at the end of the log."""
        if self._closed or self._failed is not None:
            self._check_writable()
        view = memoryview(batch)
        config = self.config
        whole = None
        if checked is None and len(view) <= config.max_batch_bytes:
            whole = check_whole_batch(view)
        if checked is not None:
            length, last_delta = checked.batch_length, checked.last_offset_delta
            max_ts = checked.max_timestamp
        elif whole is not None and whole[3] >= 1 and whole[1] == whole[3] - 1:
            length, last_delta, max_ts, _ = whole
        else:  # malformed or unusual: the full checks name the fault
            h = _check_one_batch(view, config.max_batch_bytes)
            length, last_delta, max_ts = h.batch_length, h.last_offset_delta, h.max_timestamp
        size = length + LOG_OVERHEAD
        now = self.clock()
        seg = self._segments[-1]
        created = seg.created_ms if seg.created_ms >= 0 else now
        rolls = seg.size > 0 and (
            seg.size + size > config.segment_bytes or now - created >= config.segment_ms
        )
        mark = None
        if rolls or not len(self._pending) % MAX_BATCHES_PER_WRITE or seg.created_ms < 0:
            mark = (len(self._segments), seg.mark())
        if seg.size > 0 and seg.created_ms < 0:
            seg.created_ms = now  # a segment reopened or truncated into ages from now
        if rolls:
            seg = self._roll()
        base = seg.next_offset
        position, buffers = seg.reserve(view, length, last_delta, max_ts, now)
        self.batches_appended += 1
        # Only ``interval`` logs have something for the log manager's loop to flush: marking
        # one under ``always`` or ``never`` woke that loop for every message, for nothing.
        if (
            not self.unflushed_marked
            and self.on_unflushed is not None
            and config.fsync is _INTERVAL
        ):
            self.unflushed_marked = True
            self.on_unflushed()
        return _Write(
            seg, position, buffers, AppendInfo(base, base + last_delta, size, max_ts), mark
        )

    def _write_failed(self, write: _Write, exc: OSError) -> StorageError:
        """Undo ``write`` and everything reserved after it; return the error to report."""
        err = StorageError(
            f"write of a {write.info.size:,}-byte batch to {write.seg.log_path} at byte "
            f"{write.position:,} failed: {exc}"
        )
        assert write.mark is not None, "a failed pwritev starts at a marked batch"
        nseg, mark = write.mark
        # Batches it recorded may be the ones undone: rebuilt from the files when next asked.
        self._history = None
        dropped = self._segments[nseg:]
        del self._segments[nseg:]
        del self._bases[nseg:]
        active = self._segments[-1]
        active.rollback(mark)
        active.leader_epoch = self._leader_epoch  # it may be an older segment, active again
        try:
            for seg in dropped:
                self._drop_segment(seg)
            active.file.truncate(mark.size)
        except OSError as exc2:
            self._failed = StorageError(
                f"write to {write.seg.log_path} failed ({exc}) and truncating it back "
                f"failed ({exc2})"
            )
        return err

    def _drain_writes(self) -> None:
        """Write every reserved batch, each run of batches that starts at a marked one in one
        ``pwritev``, and resolve their futures (failing the rest of them if a write fails)."""
        self._drain_scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_bytes = 0
        i, n = 0, len(pending)
        while i < n:
            first = pending[i]
            seg = first.seg
            buffers: list[bytes | memoryview] = [*first.buffers]
            j = i + 1
            # Batches without a mark follow the one before them in the same segment.
            while j < n and (w := pending[j]).mark is None and w.seg is seg:
                buffers += w.buffers
                j += 1
            try:
                seg.file.pwritev(buffers, first.position)
            except OSError as exc:
                err = self._write_failed(first, exc)
                for k in range(i, n):
                    fut = pending[k].future
                    if fut is not None and not fut.done():
                        fut.set_exception(err)
                del pending[i:]  # the runs before this one were written
                break
            i = j
        # Told only once every run is written: a waiter may be an append's callback
        # (_Completion), which may append again at once; written and acknowledged before a
        # later run of this drain, a failure of that run would roll it back.
        for w in pending:
            fut = w.future
            if fut is not None and not fut.done():
                fut.set_result(None)
        if i < n:  # a write failed
            return
        if self.config.fsync is not _ALWAYS:
            if self.on_visible is not None:
                self.on_visible()
            if self._writeback is None or self._writeback.done():
                self._maybe_start_writeback()

    def _maybe_start_writeback(self) -> None:
        """Once :data:`WRITEBACK_BYTES` of the active segment are written since the last
        request, ask the OS (in a worker thread: the call may block on a busy device) to start
        writing them back."""
        seg = self._segments[-1]
        start = self._writeback_end if self._writeback_seg is seg else 0
        start = min(start, seg.size)  # truncated or rolled back since
        if seg.size - start < WRITEBACK_BYTES:
            return
        self._writeback_seg, self._writeback_end = seg, seg.size
        self._writeback = _writeback_pool().submit(
            _start_writeback, seg.file, start, seg.size - start
        )

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        if self._failed is not None:
            raise LogFailedError(
                f"log {self.directory} accepts no writes after a storage failure "
                f"({self._failed.message}); reopen it to recover"
            )

    def _roll(self) -> Segment:
        old = self._segments[-1]
        # Cut now, not at the next flush: appends not waited durable (acks=leader) may roll
        # again and again before one, and a crash would find zeros inside the log.
        try:
            old.trim()
        except OSError as exc:
            raise StorageError(
                f"cannot roll {self.directory}: cutting the zeros past the end of "
                f"{old.log_path} failed: {exc}"
            ) from exc
        seg = self._new_segment(old.next_offset)
        old.sealed = True
        return seg

    def _new_segment(self, base: int) -> Segment:
        path = f"{self.directory}/{segment_name(base)}.log"
        f = None
        try:
            f = self.fs.open(path, create=True)
            f.truncate(0)
        except OSError as exc:
            err = StorageError(f"cannot create segment {path}: {exc}")
            try:
                if f is not None:
                    f.close()
                if self.fs.exists(path):
                    self.fs.remove(path)
            except OSError as exc2:
                # A stray file at this base offset would overlap the active segment once it
                # grows past it: stop writing rather than risk that.
                self._failed = StorageError(
                    f"cannot create segment {path} ({exc}) nor remove it ({exc2})"
                )
            raise err from exc
        seg = Segment(
            self.fs,
            self.directory,
            base,
            f,
            index_interval_bytes=self.config.index_interval_bytes,
            leader_epoch=self._leader_epoch,
        )
        self._segments.append(seg)
        self._bases.append(base)
        self._dir_dirty = True
        return seg

    async def append_async(
        self, batch: bytes | bytearray | memoryview, *, durable: bool | None = None
    ) -> AppendInfo:
        """Append ``batch`` and return once it is as durable as the fsync policy promises:
        written to the OS under ``interval`` and ``never``; under ``always``, after an fsync
        that covers it (shared with concurrent appends: group commit).

        ``durable=True`` waits for an fsync whatever the policy (a producer asking for
        durable acknowledgement); ``durable=False`` returns once written, whatever the policy.

        Batches appended in the same turn of the event loop are written with one
        ``pwritev``; ``batch`` must not change until this returns.

        Raises:
            BackpressureError: ``max_pending_appends`` appends already await their fsync
                (nothing is written).
            StorageError: the write or the fsync failed; the batch is not acknowledged.
            (and what :meth:`append` raises)
        """
        always = self.config.fsync is _ALWAYS if durable is None else durable
        if always:
            waiting = len(self._waiters) + len(self._pending)
            if waiting >= self.config.max_pending_appends:
                raise BackpressureError(
                    f"{waiting:,} appends await their write or fsync on {self.directory} "
                    f"(max_pending_appends={self.config.max_pending_appends:,})"
                )
        write = self._queue(batch)
        fut = cast("asyncio.Future[None]", write.future)  # _queue's own future
        # Registered now, so that the fsync starts right after this turn's writes.
        durable_fut = self._durable_future(write.info.last_offset + 1) if always else None
        try:
            await fut
        except BaseException:
            if durable_fut is not None:
                durable_fut.cancel()
            raise
        if durable_fut is not None:
            await durable_fut
        return write.info

    async def append_many_async(
        self,
        batches: Sequence[bytes | bytearray | memoryview],
        *,
        durable: bool | None = None,
        checked: Sequence[BatchHeader] | None = None,
    ) -> list[AppendInfo]:
        """Append ``batches`` at consecutive offsets — no other append lands between them —
        and return once all are as durable as :meth:`append_async` promises.

        Args:
            checked: the batches' headers as :func:`check_appendable` returned them, by a
                caller that checked every batch already (against this log's
                ``max_batch_bytes``) for all-or-nothing: they are not checked again.

        Raises:
            What :meth:`append_async` raises. Batches before the one that failed its checks
            are appended all the same: check them first for all-or-nothing.
        """
        always = self._admit(len(batches), durable)
        if checked is None:
            writes = [self._queue(b) for b in batches]
        else:
            writes = [self._queue(b, h) for b, h in zip(batches, checked, strict=True)]
        return await self._settle(writes, always=always)

    def _admit(self, count: int, durable: bool | None) -> bool:
        """Whether ``count`` batches appended now wait for a group commit (``durable``, or
        by default the log's ``fsync``); raise BackpressureError when so many appends await
        their write or fsync already that they exceed ``max_pending_appends``."""
        always = self.config.fsync is _ALWAYS if durable is None else durable
        waiting = len(self._waiters) + len(self._pending)
        if always and waiting + count > self.config.max_pending_appends:
            raise BackpressureError(
                f"{waiting:,} appends await their write or fsync on {self.directory}; "
                f"{count} more exceed max_pending_appends="
                f"{self.config.max_pending_appends:,}"
            )
        return always

    def append_many_soon(
        self,
        batches: Sequence[bytes | bytearray | memoryview],
        *,
        durable: bool | None = None,
        checked: Sequence[BatchHeader],
        callback: AppendCallback,
    ) -> None:
        """:meth:`append_many_async` for a caller that does not await: the batches are queued
        now, and ``callback`` is called with their infos once they are as durable as that
        method promises (or with the error that refused them), directly in the step that
        settles the append: the end of the turn that writes them, or the one that takes the
        group commit's result back. Under ``always`` the answer to a producer can then be
        written in the turn its fsync came back in, not one turn later.

        ``checked``: the batches' headers, every batch checked already (see
        :meth:`append_many_async`). ``callback`` may run before this returns (a write big
        enough to go at once, acks=leader); it must not raise.

        Raises:
            What :meth:`append_many_async` raises before anything is queued
            (``BackpressureError``, ``LogClosedError``, ``LogFailedError``, a batch that fails
            its checks); then ``callback`` is never called.
        """
        always = self._admit(len(batches), durable)
        # One part per write, one for the group commit, one for this call's own end (so
        # that a write settled while the next one is queued cannot end it early).
        done = _Completion(len(batches) + always + 1, callback)
        infos = done.infos
        for b, h in zip(batches, checked, strict=True):
            try:
                infos.append(self._queue(b, h, done).info)
            except BaseException as exc:
                if not infos:
                    raise  # nothing queued: the caller is told, the callback never called
                # Some were queued (and their writes may have failed already): the callback
                # is told, once, and this call returns as promised.
                done.set_exception(exc)
                return
        if always and batches:
            self._wait_durable_with(infos[-1].last_offset + 1, done)
        elif always:
            done.set_result(None)  # nothing to commit
        done.set_result(None)

    async def _settle(self, writes: list[_Write], *, always: bool) -> list[AppendInfo]:
        """Wait until queued ``writes`` are written (and fsynced when ``always``)."""
        # Registered now, so that the fsync starts right after this turn's writes.
        durable_fut = (
            self._durable_future(writes[-1].info.last_offset + 1) if always and writes else None
        )
        try:
            for w in writes:
                assert w.future is not None
                await cast("asyncio.Future[None]", w.future)  # _queue's own future
        except BaseException:
            if durable_fut is not None:
                durable_fut.cancel()
            raise
        if durable_fut is not None:
            await durable_fut
        return [w.info for w in writes]

    def _queue(
        self,
        batch: bytes | bytearray | memoryview,
        checked: BatchHeader | None = None,
        waiter: _Waiter | None = None,
    ) -> _Write:
        """Reserve ``batch`` and queue its write for the end of this turn of the event loop
        (at once when enough is gathered): one pwritev for many batches. ``waiter``: told
        when the write is done (by default a new future, ``write.future``)."""
        write = self._reserve(batch, checked)
        loop = self._loop()
        write.future = loop.create_future() if waiter is None else waiter
        pending = self._pending
        pending.append(write)
        self._pending_bytes += write.info.size
        if self._pending_bytes >= MAX_BYTES_PER_WRITE or len(pending) >= MAX_BATCHES_PER_WRITE:
            self._end_of_turn()
        elif not self._drain_scheduled:
            self._drain_scheduled = True
            loop.call_soon(self._end_of_turn)
        return write

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, asked once per log and loop: each ``get_running_loop`` costs a
        ``getpid`` system call (asyncio checks for a fork), several a message otherwise."""
        loop = self._owner_loop
        if loop is None or not loop.is_running():
            loop = self._owner_loop = asyncio.get_running_loop()
        return loop

    def _end_of_turn(self) -> None:
        """Write what this turn of the loop queued, then start the group commit its
        appends wait for at once (not one turn later, when their callers resume).

        One step (:mod:`tidewire._step`): what the writes' waiters put off (a connection's
        answers, sent together) runs once they are all told, before the commit starts (which
        may run its fsync here, :meth:`_inline`)."""
        outer = _step.begin()
        try:
            self._drain_writes()
        finally:
            if outer:
                _step.end()
        if self._waiters and self._flush_running is None and not self._closed:
            self._start_flush()

    # --- leader epochs and replica appends ------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        """The leader epoch stamped on batches appended with :meth:`append` and
        :meth:`append_many_async` (their ``partition_leader_epoch``, outside the CRC), and the
        largest epoch a stored batch may carry. 0 on a single node; raised by
        :meth:`set_leader_epoch` and by replica appends of batches of a later epoch."""
        return self._leader_epoch

    def set_leader_epoch(self, epoch: int) -> None:
        """Stamp batches appended from now on with ``epoch`` (this replica leads the partition
        in that epoch). The first batch appended in it enters the epoch history.

        A new epoch is written to :data:`EPOCH_FILE` (fsynced, on the calling thread: once
        per leadership change) before any batch carries it, so that recovery accepts it.

        Raises:
            ValueError: ``epoch`` is below :attr:`leader_epoch` (epochs only go up).
            StorageError: the epoch could not be persisted (nothing changed).
            LogClosedError, LogFailedError: the log refuses writes.
        """
        if epoch < self._leader_epoch:
            raise ValueError(
                f"leader epoch {epoch} is below {self.directory}'s epoch {self._leader_epoch}: "
                "epochs only go up"
            )
        self._check_writable()
        if epoch == self._leader_epoch:
            return
        self._history_current()  # what was appended so far carries the previous epoch
        self._raise_epoch(epoch)

    def _raise_epoch(self, epoch: int) -> None:
        """Persist ``epoch`` as the log's epoch, then stamp and accept it."""
        path = f"{self.directory}/{EPOCH_FILE}"
        try:
            write_atomic(self.fs, path, f"{_EPOCH_FILE_HEADER}{epoch}\n".encode())
        except OSError as exc:
            raise StorageError(
                f"cannot record leader epoch {epoch} of {self.directory} in {path}: {exc}"
            ) from exc
        self._leader_epoch = epoch
        self._segments[-1].leader_epoch = epoch  # later segments are created with it

    def _recover_epoch(self) -> None:
        """The epoch file was unreadable (every epoch was accepted by the scan): go on with
        the epoch of the last batch, and write it down again."""
        epoch = 0
        for seg in reversed(self._segments):
            if seg.size == 0:
                continue
            try:
                found = seg.locate(seg.next_offset - 1, seg.size)
                if found is not None:
                    epoch = max(PREFIX.unpack(seg.file.pread(PREFIX.size, found[0]))[2], 0)
            except (CorruptBatchFound, OSError, struct.error) as exc:
                log.error("cannot read the last batch of %s: %s", self.directory, exc)
            break
        self._leader_epoch = 0
        try:
            self._raise_epoch(epoch)
        except StorageError as exc:
            log.error("%s", exc.message)  # the next open finds the file unreadable again
            self._leader_epoch = self._segments[-1].leader_epoch = epoch
        log.warning("%s goes on with leader epoch %d, its last batch's", self.directory, epoch)

    def _read_epoch_file(self) -> int:
        path = f"{self.directory}/{EPOCH_FILE}"
        try:
            text = self.fs.read_file(path).decode("ascii")
            header, value, rest = text.split("\n", 2)
            if f"{header}\n" != _EPOCH_FILE_HEADER or rest or not 0 <= int(value) <= _ANY_EPOCH:
                raise ValueError(f"unexpected content {text[:80]!r}")
            return int(value)
        except (OSError, ValueError) as exc:
            log.error(
                "cannot read the leader epoch of %s from %s (%s): batches of any epoch are "
                "accepted",
                self.directory,
                path,
                exc,
            )
            return _ANY_EPOCH

    def epoch_history(self) -> EpochHistory:
        """The log's leader-epoch history: ``(epoch, first offset)`` of each epoch its batches
        carry (a copy: call again for the current one).

        Built on the first call from the batch headers of every segment (for a segment whose
        first and last batch share their epoch, those two headers only); then kept current by
        appends, replica appends, :meth:`truncate_to` and retention. Only cluster code calls
        it: a single node never pays the walk.

        Raises:
            StorageError: a read failed.
            LogClosedError: the log is closed.
        """
        return EpochHistory(self._history_current())

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch: ``(the largest epoch <= epoch the log holds, the
        first offset after that epoch's batches)``, the latest epoch's end being the log end;
        :data:`~tidewire.storage.epochs.UNDEFINED` ``(-1, -1)`` when ``epoch`` is older than
        every epoch held.

        Raises:
            What :meth:`epoch_history` raises.
        """
        return self._history_current().end_offset(epoch, self.log_end_offset)

    def _history_current(self) -> EpochHistory:
        """The history, built if needed, with the local appends since :attr:`_epoch_mark`
        recorded (they were all stamped :attr:`_leader_epoch`)."""
        self._check_open()
        h = self._history
        if h is None:
            h = self._history = self._build_history()
        elif self.log_end_offset > self._epoch_mark:
            h.assign(self._leader_epoch, self._epoch_mark)
        self._epoch_mark = self.log_end_offset
        return h

    def _build_history(self) -> EpochHistory:
        """The history from the segments' batch headers."""
        self._drain_writes()
        h = EpochHistory()
        for seg in self._segments:
            gaps = {
                d.position: (d.end_position, d.end)
                for d in self._damage
                if d.path == seg.log_path and d.end_position > d.position
            }
            try:
                starts, stopped = seg.epoch_starts(gaps)
            except OSError as exc:
                raise StorageError(f"read of {seg.log_path} failed: {exc}") from exc
            if stopped is not None:
                log.warning(
                    "the leader-epoch history of %s skips the rest of %s: %s",
                    self.directory,
                    seg.log_path,
                    stopped,
                )
            for base, epoch in starts:
                if epoch < 0:
                    continue
                try:
                    h.assign(epoch, base)
                except ValueError as exc:  # epochs going down: written so, or not ours
                    log.warning(
                        "%s: the batch at offset %d is left out of the epoch history: %s",
                        self.directory,
                        base,
                        exc,
                    )
        h.truncate_before(self.log_start_offset)
        return h

    def _check_replica(
        self, data: bytes | bytearray | memoryview
    ) -> tuple[list[tuple[memoryview, BatchHeader]], int]:
        """Check that ``data`` is whole batches continuing the log (offsets from its end,
        epochs not below its last batch's). Returns each batch with its header and the
        largest epoch.

        Raises:
            ReplicaAppendError, RecordBatchError: see :meth:`append_replica`.
        """
        view = memoryview(data)
        expect = self.log_end_offset
        prev = self._history_current().latest
        batches: list[tuple[memoryview, BatchHeader]] = []
        pos = 0
        while pos < len(view):
            h = check_appendable(view, pos)
            epoch = h.partition_leader_epoch
            if h.base_offset != expect:
                raise ReplicaAppendError(
                    f"copied batch {len(batches) + 1} starts at offset {h.base_offset} but "
                    f"{self.directory} continues at {expect}; nothing of the "
                    f"{len(view):,} bytes was stored"
                )
            if epoch < max(prev, 0):
                raise ReplicaAppendError(
                    f"copied batch {len(batches) + 1} at offset {h.base_offset} has leader "
                    f"epoch {epoch}, below {max(prev, 0)} of the batch before it in "
                    f"{self.directory}; nothing of the {len(view):,} bytes was stored"
                )
            batches.append((view[pos : pos + h.size], h))
            expect, prev = h.next_offset, epoch
            pos += h.size
        return batches, prev

    def _replica_writes(
        self, data: bytes | bytearray | memoryview, *, queue: bool, always: bool = False
    ) -> list[_Write]:
        """Check ``data``, raise the epoch if it carries a later one, and account for its
        batches at the end of the log with their own prefix (base offset and epoch kept);
        ``queue``: queue their writes for the end of the loop's turn; ``always``: they will
        wait for an fsync (refused when too many do, as :meth:`append_many_async` does)."""
        self._check_writable()
        batches, top = self._check_replica(data)
        waiting = len(self._waiters) + len(self._pending)
        if always and waiting + len(batches) > self.config.max_pending_appends:
            raise BackpressureError(
                f"{waiting:,} appends await their write or fsync on {self.directory}; "
                f"{len(batches)} more exceed max_pending_appends="
                f"{self.config.max_pending_appends:,}"
            )
        if top > self._leader_epoch:
            self._raise_epoch(top)
        h = self._history
        assert h is not None  # built by the check
        writes: list[_Write] = []
        loop = asyncio.get_running_loop() if queue else None
        for view, hdr in batches:
            write = self._reserve(view, hdr)
            # The batch's own prefix: the leader's base offset (equal to ours, checked) and
            # epoch, instead of this log's stamp.
            write.buffers = (
                PREFIX.pack(hdr.base_offset, hdr.batch_length, hdr.partition_leader_epoch),
                write.buffers[1],
            )
            h.assign(hdr.partition_leader_epoch, hdr.base_offset)
            if loop is not None:
                # Queued as :meth:`_queue` does, but no write is issued before every batch is
                # reserved: a failed write rolls the log back, and the batches after it would
                # be reserved at offsets other than their own.
                write.future = loop.create_future()
                self._pending.append(write)
                self._pending_bytes += write.info.size
            writes.append(write)
        self._epoch_mark = self.log_end_offset
        if loop is not None and writes:
            if (
                self._pending_bytes >= MAX_BYTES_PER_WRITE
                or len(self._pending) >= MAX_BATCHES_PER_WRITE
            ):
                self._end_of_turn()
            elif not self._drain_scheduled:
                self._drain_scheduled = True
                loop.call_soon(self._end_of_turn)
        return writes

    def append_replica(self, data: bytes | bytearray | memoryview) -> list[AppendInfo]:
        """Append batches copied from the leader's log, as its :meth:`read` returned them,
        writing them to the OS before returning (see :meth:`append_replica_async`).

        Raises:
            What :meth:`append_replica_async` raises but ``BackpressureError``.
        """
        self._drain_writes()
        writes = self._replica_writes(data, queue=False)
        for write in writes:
            try:
                write.seg.file.pwritev(write.buffers, write.position)
            except OSError as exc:
                err = self._write_failed(writes[0], exc)  # undoes every batch of ``data``
                raise err from exc
        return [w.info for w in writes]

    async def append_replica_async(
        self, data: bytes | bytearray | memoryview, *, durable: bool | None = None
    ) -> list[AppendInfo]:
        """Append whole batches copied from the leader's log (as its :meth:`read` returned
        them) at consecutive offsets, stored as they are: base offsets and leader epochs kept.
        Each batch is CRC-checked as any append; its base offset must be the log end at that
        point and its epoch at least the previous batch's. All batches are checked before
        anything is stored. A batch of an epoch above :attr:`leader_epoch` raises it
        (persisted first, as :meth:`set_leader_epoch` does).

        Returns once all are as durable as :meth:`append_many_async` promises (``durable``
        as there); :attr:`flushed_offset` tells how far the log is durable.

        Raises:
            ReplicaAppendError: a batch does not continue the log (base offset or epoch);
                nothing of ``data`` is stored.
            RecordBatchError: a batch is malformed or fails its CRC; nothing is stored.
            BackpressureError: too many appends await their fsync; nothing is stored.
            StorageError: a write, the fsync or persisting the epoch failed.
            LogClosedError, LogFailedError: the log refuses writes.
        """
        always = self.config.fsync is _ALWAYS if durable is None else durable
        writes = self._replica_writes(data, queue=True, always=always)
        return await self._settle(writes, always=always)

    # --- flushing -------------------------------------------------------------------------------

    async def wait_durable(self, offset: int) -> None:
        """Return once every offset below ``offset`` is on stable storage, starting a group
        commit if none is running.

        Raises:
            StorageError: the fsync failed (the log then refuses writes: ``LogFailedError``).
        """
        if self._flushed >= offset:
            return
        self._check_open()
        if self._failed is not None:
            raise self._failed
        await self._durable_future(offset)

    def _durable_future(self, offset: int) -> asyncio.Future[None]:
        """A future resolved once every offset below ``offset`` is on stable storage. A group
        commit starts at once when none runs and no write is queued for the end of this turn
        (else at the end of the turn, after the write), or right after the running one."""
        fut: asyncio.Future[None] = self._loop().create_future()
        self._wait_durable_with(offset, fut)
        return fut

    def _wait_durable_with(self, offset: int, waiter: _Waiter) -> None:
        """Settle ``waiter`` once every offset below ``offset`` is on stable storage (see
        :meth:`_durable_future`)."""
        if self._flushed >= offset:
            waiter.set_result(None)
            return
        self._waiters.append((offset, waiter))
        if self._flush_running is None and not self._drain_scheduled:
            self._start_flush()

    async def flush_async(self) -> None:
        """Flush everything appended so far, in a worker thread.

        Raises:
            StorageError: a write or the fsync failed: not everything appended is durable.
        """
        target = self.log_end_offset
        self._drain_writes()  # so that a failed write is known before waiting on its offsets
        if self.log_end_offset < target:
            raise StorageError(
                f"writes of offsets {self.log_end_offset}..{target - 1} of {self.directory} "
                "failed, so they cannot be flushed"
            )
        await self.wait_durable(target)

    def _start_flush(self) -> None:
        """Start a group commit of everything written so far in a flusher thread (or, for a
        partition written one message at a time, run its fsync here: :meth:`_inline`);
        :meth:`_flush_finished` takes its result back on the loop, settles the waiters and
        starts the next commit if more wait."""
        loop = self._loop()
        if self._failed is not None:
            self._fail_waiters(self._failed)
            return
        self._flush_running = loop.create_future()
        try:
            plan = self._flush_plan()
            batches = self.batches_appended - self._batches_flushed
            nbytes = sum(size - seg.synced_size for seg, size in plan.syncs)
            self._batches_flushed = self.batches_appended
            if self._inline(loop, plan, batches, nbytes):
                # One message at a time: the fsync here, its result taken back next turn.
                outcome = self._timed_flush_io(plan)
                loop.call_soon(self._flush_finished, plan, batches, nbytes, outcome)
                return
            # A flusher thread (tests install a stepped executor); the job's own
            # call_soon_threadsafe is the whole way back: one loop wake-up, no future.
            run_flush_job(loop, functools.partial(self._flush_job, loop, plan, batches, nbytes))
        except Exception as exc:  # a bug: reported, and the waiters fail instead of hanging
            log.error("starting the flush of %s failed", self.directory, exc_info=exc)
            self._flushing = False
            self._fail_waiters(StorageError(f"flush failed to start: {exc!r}"))
            self._flush_over()

    def _inline(
        self, loop: asyncio.AbstractEventLoop, plan: _FlushPlan, batches: int, nbytes: int
    ) -> bool:
        """Whether this group commit runs its fsync on the loop (see
        :data:`INLINE_FSYNC_AFTER`); a commit that may not resets the count."""
        if self.config.fsync is not _ALWAYS:
            return False
        now = time.perf_counter()
        commits = _COMMITS
        me = id(self)
        if commits.last != me:
            commits.other_at = commits.last_at
            commits.last = me
        commits.last_at = now
        if (
            batches == 1
            and now - commits.other_at > INLINE_ALONE_S
            and now - commits.read_at > INLINE_ALONE_S
            and nbytes <= PREALLOCATE_SMALL_SYNC
            and len(plan.syncs) == 1
            and not (plan.sync_dir or plan.seals or plan.cuts or plan.grew)
            and plan.failed is None
        ):
            plan.lone = True
            if self._lone_flushes < self._inline_after:
                return False
            # Not inside a step: what it put off (answers) would wait for this fsync.
            if flush_threads_idle(loop) and not _step.active():
                return True
            plan.lone = False
        self._lone_flushes = 0
        return False

    def _flush_job(
        self, loop: asyncio.AbstractEventLoop, plan: _FlushPlan, batches: int, nbytes: int
    ) -> Callable[[], None]:
        """In a flusher thread: the group commit; returns the hand-back of its result to the
        loop, which the thread calls once it counts itself idle (see :func:`run_flush_job`)."""
        outcome: tuple[OSError | None, float] | Exception
        try:
            outcome = self._timed_flush_io(plan)
        except Exception as exc:  # not an OSError: a bug, handed to the loop to report
            outcome = exc
        return functools.partial(self._hand_back, loop, plan, batches, nbytes, outcome)

    def _hand_back(
        self,
        loop: asyncio.AbstractEventLoop,
        plan: _FlushPlan,
        batches: int,
        nbytes: int,
        outcome: tuple[OSError | None, float] | Exception,
    ) -> None:
        try:
            loop.call_soon_threadsafe(self._flush_finished, plan, batches, nbytes, outcome)
        except RuntimeError:  # the loop is closed: nobody waits for this flush any more
            log.warning("flush of %s finished after its event loop closed", self.directory)

    def _timed_flush_io(self, plan: _FlushPlan) -> tuple[OSError | None, float]:
        """In a flusher thread (or on the loop, :meth:`_inline`): :meth:`_flush_io`; its error
        (if any) and how long it took."""
        started = time.perf_counter()
        try:
            self._flush_io(plan)
        except OSError as exc:
            return exc, time.perf_counter() - started
        return None, time.perf_counter() - started

    def _flush_finished(
        self,
        plan: _FlushPlan,
        batches: int,
        nbytes: int,
        outcome: tuple[OSError | None, float] | Exception,
    ) -> None:
        """On the owner thread: account for a finished group commit, settle its waiters, let
        readers see what it made durable, and start the next one if appends wait.

        One step (:mod:`tidewire._step`): what the waiters put off (a connection's answers,
        sent together) runs once they are all settled and the next commit has started (in
        a thread: no commit runs its fsync on the loop inside a step), not in a later
        callback of the loop, behind the requests read in between."""
        outer = _step.begin()
        try:
            if isinstance(outcome, Exception):  # not an OSError: a bug, reported
                log.error("flush of %s failed", self.directory, exc_info=outcome)
                self._flushing = False
                self._fail_waiters(StorageError(f"flush task failed: {outcome!r}"))
                return
            error, seconds = outcome
            self._count_lone(plan, seconds)
            if self.flush_stats is not None:
                self.flush_stats.observe(seconds, batches, nbytes, failed=error is not None)
            before = self._flushed
            self._flush_done(plan, error)
            self._settle_waiters()
            if (
                self._flushed > before
                and self.on_visible is not None
                and self.config.fsync is _ALWAYS
            ):
                self.on_visible()
        finally:
            try:
                self._flush_over()
            finally:
                if outer:
                    _step.end()

    def _count_lone(self, plan: _FlushPlan, seconds: float) -> None:
        """After a commit: count it towards running the next ones on the loop, or start the
        count again (see :data:`INLINE_FSYNC_AFTER`)."""
        if seconds > INLINE_FSYNC_MAX_S:
            self._lone_flushes = 0
            self._inline_after = min(self._inline_after * 2, INLINE_FSYNC_AFTER_MAX)
        elif plan.lone and self.batches_appended == self._batches_flushed:
            self._lone_flushes += 1
            if (
                self._lone_flushes >= 2 * self._inline_after
                and self._inline_after > INLINE_FSYNC_AFTER
            ):
                self._inline_after //= 2
                self._lone_flushes = self._inline_after
        else:
            self._lone_flushes = 0

    def _flush_over(self) -> None:
        """A flush ended: the next one starts if appends wait, else the log is idle."""
        done = self._flush_running
        self._flush_running = None
        if self._waiters and not self._closed:
            self._start_flush()
        if done is not None and not done.done():
            done.set_result(None)

    def _settle_waiters(self) -> None:
        if self._failed is not None:
            self._fail_waiters(self._failed)
            return
        w = self._waiters
        settled: list[_Waiter] = []
        while w and w[0][0] <= self._flushed:
            settled.append(w.popleft()[1])
        # Told after the queue is settled: an append's callback (_Completion) may append
        # and wait again at once.
        for fut in settled:
            if not fut.done():
                fut.set_result(None)
        end = self.log_end_offset
        if any(offset > end for offset, _ in w):  # truncated or rolled back before flushed
            keep: deque[tuple[int, _Waiter]] = deque()
            for offset, fut in w:
                if offset <= end:
                    keep.append((offset, fut))
                elif not fut.done():
                    fut.set_exception(
                        OffsetOutOfRangeError(
                            f"offsets below {offset} were removed (truncated or a failed write "
                            "rolled back) before they were flushed"
                        )
                    )
            self._waiters = keep

    def _fail_waiters(self, exc: TidewireError) -> None:
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def _flush_plan(self) -> _FlushPlan:
        """On the owner thread: what the next flush must sync, as a snapshot."""
        self._drain_writes()
        self._flushing = True
        failed = None
        grew = False
        try:
            grew = self._trim_and_preallocate()
        except FlushIOError as exc:
            failed = exc
        segs = self._segments
        cuts = [s for s in segs if s.cut_unsynced]
        syncs = [(s, s.size) for s in segs if s.synced_size < s.size or s.cut_unsynced]
        seals = [(s, *s.seal_files()) for s in segs if s.sealed and not s.seal_persisted]
        plan = _FlushPlan(
            self.log_end_offset,
            syncs,
            self._dir_dirty,
            seals,
            self._truncations,
            failed,
            cuts,
            grew,
        )
        self._dir_dirty = False
        return plan

    def _trim_and_preallocate(self) -> bool:
        """Before a flush: cut the zeros written ahead off the last segment if a close sealed
        it (a roll cuts the older ones at once), or write zeros ahead of its appends where
        its fsyncs are small ones (see :data:`PREALLOCATE_SMALL_SYNC`). Returns whether it
        wrote zeros (the flush's fsync then writes them too).

        Raises:
            FlushIOError: a cut failed (the flush fails with it: a sealed segment whose file
                holds more than its batches must not be taken as sealed).
        """
        active = self._segments[-1]
        if active.sealed:
            try:
                active.trim()
            except OSError as exc:
                step = f"cutting the zeros past the end of {os.path.basename(active.log_path)}"
                raise FlushIOError(step, exc) from exc
            return False
        nbytes = self.preallocate_bytes
        if not nbytes or self.config.fsync is not _ALWAYS:
            return False
        pending = active.size - active.synced_size
        if not 0 < pending <= PREALLOCATE_SMALL_SYNC:
            return False
        now = self.clock()
        if now - active.small_syncs_since > PREALLOCATE_WINDOW_MS and active.small_syncs >= 0:
            active.small_syncs, active.small_syncs_since = 0, now
        active.small_syncs += 1
        if (
            active.small_syncs >= PREALLOCATE_AFTER_SYNCS
            and active.zeroed_to - active.size < nbytes // 4
            and active.size < self.config.segment_bytes
        ):
            try:
                active.preallocate(nbytes)
            except OSError as exc:  # zeros past the end: nothing lost; no more for this one
                active.small_syncs = -(1 << 62)
                log.warning("writing zeros ahead in %s failed: %s", active.log_path, exc)
            else:
                return True
        return False

    def _flush_io(self, plan: _FlushPlan) -> None:
        """Blocking: fsync the files, the directory, then write the sealed indexes.

        Raises:
            FlushIOError: the step that failed, with the OS error.
        """
        if plan.failed is not None:
            raise plan.failed
        step = ""
        try:
            for seg, _ in plan.syncs:
                step = f"the fsync of {os.path.basename(seg.log_path)}"
                seg.file.sync()
            if plan.sync_dir:
                step = "the fsync of the directory"
                self.fs.sync_dir(self.directory)
            for seg, index, timeindex in plan.seals:
                for suffix, data in ((".index", index), (".timeindex", timeindex)):
                    step = f"writing the index {os.path.basename(seg.path(suffix))}"
                    write_atomic(self.fs, seg.path(suffix), data)
        except FlushIOError:
            raise
        except OSError as exc:
            raise FlushIOError(step, exc) from exc

    def _flush_done(self, plan: _FlushPlan, error: OSError | None, *, report: bool = True) -> None:
        """On the owner thread: account for a finished flush (``report``: log a failure;
        :meth:`close` leaves that to its caller, which reports every log's at once)."""
        self._flushing = False
        if error is not None:
            if plan.sync_dir:
                self._dir_dirty = True
            # Under ``always`` no batch past the flushed offset was acknowledged; under the
            # other policies they were, and the next start's recovery keeps what is intact.
            unacked = (
                "are not acknowledged"
                if self.config.fsync is FsyncPolicy.ALWAYS
                else "are not known to be on stable storage"
            )
            self._failed = StorageError(
                f"flushing {self.directory} failed at {_describe_flush_error(error)}; batches "
                f"appended since offset {self._flushed} {unacked}, and the log accepts no more "
                "writes"
            )
            if report:
                log.error("%s", self._failed.message)
        elif plan.truncations == self._truncations:
            for seg, size in plan.syncs:
                seg.synced_size = max(seg.synced_size, size)
            for seg, _, _ in plan.seals:
                seg.seal_persisted = True
            for seg in plan.cuts:
                seg.cut_unsynced = False
            self._flushed = max(self._flushed, min(plan.target, self.log_end_offset))
        # else: the log was truncated while this flush ran; what it synced may describe bytes
        # that are gone and offsets that now belong to other batches: the next flush decides.
        for seg in self._deferred_close:
            seg.file.close()
        self._deferred_close.clear()

    def flush(self) -> None:
        """Flush everything appended so far, blocking the calling thread.

        Raises:
            StorageError: the fsync failed; the log then refuses writes.
            RuntimeError: an asynchronous flush is running (use :meth:`flush_async`).
        """
        self._flush_now(report=True)

    def _flush_now(self, *, report: bool) -> None:
        if self._flushing:
            raise RuntimeError("flush() while an asynchronous flush runs: await flush_async()")
        if self._failed is not None:
            raise self._failed
        plan = self._flush_plan()
        error: OSError | None = None
        try:
            self._flush_io(plan)
        except OSError as exc:
            error = exc
        self._flush_done(plan, error, report=report)
        if self._failed is not None:
            raise self._failed

    def _sync_dir_now(self) -> None:
        self.fs.sync_dir(self.directory)
        self._dir_dirty = False

    # --- reading --------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int = DEFAULT_READ_BYTES,
        *,
        max_offset: int | None = None,
    ) -> ReadResult:
        """Read whole batches starting with the one that holds ``offset``.

        Args:
            offset: the first offset wanted; the first batch returned may start below it.
            max_bytes: byte budget; at least one whole batch is returned if one is there.
                Within a segment the read may end on a batch boundary the sparse index
                knows, returning at least 7/8 of the budget; it never returns batches from
                two segments.
            max_offset: no batch starting at or above this is returned (for example the
                flushed offset, so readers see only durable data).

        Returns:
            A :class:`ReadResult`; ``data`` is empty at the end of the log.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start or above the log end.
            PartitionCorruptError: the batch holding ``offset`` is corrupt.
            StorageError: the read failed.
        """
        self._check_open()
        self._drain_writes()
        try:
            result = self._read_through_damage(offset, max_bytes, max_offset)
        except BaseException:
            self._count_read(max_offset, -1)
            raise
        self._count_read(max_offset, result.next_offset)
        return result

    def _read_through_damage(
        self, offset: int, max_bytes: int, max_offset: int | None
    ) -> ReadResult:
        """:meth:`_read`, again past each damaged range it finds (see :meth:`read`)."""
        for _ in range(64):  # each retry follows a newly found damaged range
            try:
                return self._read(offset, max_bytes, max_offset)
            except CorruptBatchFound as exc:
                seg = next(s for s in self._segments if s.log_path == exc.bad.path)
                if not self._found_while_reading(seg, exc.bad):
                    # Within a range known already: the walk should not have met it.
                    known = self.damage_at(exc.bad.offset)
                    raise PartitionCorruptError(
                        f"offset {offset} of {self.directory}: {exc.bad.reason} "
                        f"({exc.bad.path}, byte {exc.bad.position})",
                        damage_start=-1 if known is None else known.start,
                        damage_end=-1 if known is None else known.end,
                    ) from None
        raise PartitionCorruptError(f"{self.directory}: too many damaged ranges near {offset}")

    def _count_read(self, max_offset: int | None, next_offset: int) -> None:
        """A read keeps group commits off the loop a while (see :data:`INLINE_FSYNC_AFTER`):
        a reader waits on the loop too. Not a read of the log committing now that reached
        its durable offset (a consumer under ``always``, caught up, waits for the commit
        wherever its fsync runs); a read without a bound or one past that offset (a
        follower's, to the log end), one that stopped short of its bound (a reader catching
        up, whose next fetch would wait behind each fsync on the loop) or one of another log
        does. A read bounded below the durable offset (by a leader's high watermark) that
        reached its bound is left out too."""
        if (
            _COMMITS.last != id(self)
            or max_offset is None
            or max_offset > self._flushed
            or next_offset < max_offset
        ):
            _COMMITS.read_at = time.perf_counter()

    def damage_at(self, offset: int) -> Damage | None:
        """The damaged range holding ``offset``, or ``None``."""
        for d in self._damage:
            if d.start <= offset < d.end:
                return d
            if d.start > offset:
                break
        return None

    def _read(self, offset: int, max_bytes: int, max_offset: int | None) -> ReadResult:
        start, end = self.log_start_offset, self.log_end_offset
        d = self.damage_at(offset)
        if d is not None:
            if d.quarantined is None:
                raise PartitionCorruptError(
                    f"offset {offset} of {self.directory} lies in the damaged range "
                    f"{d.start}..{d.end - 1} ({d.size:,} bytes at byte {d.position:,} of "
                    f"{d.path}: {d.reason}); read on from offset {d.end}",
                    damage_start=d.start,
                    damage_end=d.end,
                )
            offset = d.end  # quarantined: read past it, a gap in the offsets
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside {self.directory}'s range {start}..{end}"
            )
        upper = end if max_offset is None else min(end, max_offset)
        if offset >= upper:
            return ReadResult(b"", offset, start, end)
        i = bisect_right(self._bases, offset) - 1
        seg = self._segments[i]
        limit = seg.size
        floor: tuple[int, int] | None = None
        for d in self._damage:
            if d.path != seg.log_path or d.end_position <= d.position:
                continue
            if d.start > offset:
                limit = min(limit, d.position)
            elif d.end <= offset and (floor is None or d.end_position > floor[0]):
                floor = (d.end_position, d.end)
        try:
            found = seg.locate(offset, limit, floor)
            if found is None:
                return ReadResult(b"", offset, start, end)
            pos, base = found
            data, nxt = seg.read(pos, base, max_bytes, limit, upper)
        except OSError as exc:
            raise StorageError(f"read of {seg.log_path} failed: {exc}") from exc
        return ReadResult(data, nxt, start, end)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Return the first offset whose record timestamp is >= ``timestamp`` (ms), or
        ``None`` if every record is older.

        When the search reaches a damaged range before finding the answer, the answer may lie
        in it (its timestamps cannot be read): the first offset of the range the search
        reached is returned, never a later one, so a reader starting there meets the damage
        (and its :class:`PartitionCorruptError` with the range) instead of silently missing
        records.
        """
        self._check_open()
        for seg in self._segments:
            if seg.max_timestamp < timestamp:
                continue
            offset = max(seg.timestamp_scan_start(timestamp), seg.base_offset)
            while offset < seg.next_offset:
                try:
                    result = self.read(offset, 256 * 1024)
                except PartitionCorruptError:
                    return offset
                if not result.data:
                    break
                for pos, h in iter_batches(result.data):
                    if h.max_timestamp >= timestamp and h.last_offset >= offset:
                        for rec in iter_records(memoryview(result.data)[pos : pos + h.size]):
                            if rec.offset >= offset and rec.timestamp >= timestamp:
                                return rec.offset
                offset = result.next_offset
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")

    # --- truncation, retention, deletion -----------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch that holds an offset >= ``offset``. A batch holding ``offset``
        is removed whole, so the new end offset may be below ``offset``.

        Returns:
            The new log end offset.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start.
            StorageError: a file operation failed.
        """
        self._check_open()
        self._drain_writes()
        if offset < self.log_start_offset:
            raise OffsetOutOfRangeError(
                f"cannot truncate {self.directory} to {offset}: the log starts at "
                f"{self.log_start_offset}"
            )
        if offset >= self.log_end_offset:
            return self.log_end_offset
        if self._history is not None:
            self._history_current()  # record the epoch of what was appended before the cut
        cut_at = self.damage_at(offset)
        if cut_at is not None:
            offset = cut_at.start  # inside a damaged range: cut where it starts
        self._truncations += 1
        try:
            i = bisect_right(self._bases, offset) - 1
            for seg in self._segments[i + 1 :]:
                self._drop_segment(seg)
            del self._segments[i + 1 :]
            del self._bases[i + 1 :]
            seg = self._segments[i]
            found: tuple[int, int] | None
            if cut_at is not None and cut_at.path == seg.log_path and cut_at.size > 0:
                found = (cut_at.position, cut_at.start)
            else:
                limit, floor = seg.size, None
                for d in self._damage:
                    if d.path == seg.log_path and d.size > 0:
                        if d.start > offset:
                            limit = min(limit, d.position)
                        elif floor is None or d.end_position > floor[0]:
                            floor = (d.end_position, d.end)
                try:
                    found = seg.locate(offset, limit, floor)
                except CorruptBatchFound as exc:
                    found = (exc.bad.position, exc.bad.offset)
                if found is None and limit < seg.size:
                    found = (limit, offset)  # a damaged range ends the segment's valid part
            if found is not None:
                damages, _ = seg.truncate_to(found[0])
                for bad, end_position, end_offset in damages:
                    self._add_damage(
                        Damage(
                            bad.offset,
                            seg.next_offset if end_offset is None else end_offset,
                            bad.path,
                            bad.position,
                            end_position,
                            bad.reason,
                        )
                    )
                # Synced now: no later flush would (nothing is unsynced), and a power cut
                # would otherwise bring the removed batches back.
                seg.file.sync()
                seg.synced_size = seg.size
            self._remove_seal_files(seg)
            seg.sealed = False
            # Active again, it stamps and accepts the log's epoch, not the one it was rolled in.
            seg.leader_epoch = self._leader_epoch
            self._sync_dir_now()
        except OSError as exc:
            self._failed = StorageError(f"truncation of {self.directory} failed: {exc}")
            raise self._failed from exc
        end = self.log_end_offset
        self._flushed = min(self._flushed, end)
        if self._history is not None:
            self._history.truncate_to(end)
            self._epoch_mark = end
        kept = [d for d in self._damage if d.start < end]
        if len(kept) != len(self._damage):
            self._damage = kept
            self._save_damage_file()
        self._settle_waiters()
        self._tell_truncated(
            f"{self.directory} was truncated to {end} but its recovery point could not be lowered"
        )
        return end

    def _tell_truncated(self, failure: str) -> None:
        """Tell the owner (``on_truncate``) that the log was cut. A recovery point above the
        new end would make a later torn tail look like corruption: the owner lowers it now,
        before anything is appended again; if it cannot, the log fails with ``failure``."""
        if self.on_truncate is None:
            return
        try:
            self.on_truncate(self)
        except OSError as exc:
            self._failed = StorageError(f"{failure} ({exc}); reopen it before writing")
            raise self._failed from exc

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and go on as an empty log starting at ``offset`` (Kafka's
        ``truncateFullyAndStartAt``): what a follower does whose log end lies below its
        leader's log start (retention there deleted what it would copy next), so it copies
        from the leader's log start instead of asking for offsets that no longer exist.

        Raises:
            OffsetOutOfRangeError: ``offset`` is negative.
            StorageError: a file operation failed (the log is failed then: reopen it).
        """
        self._check_open()
        self._drain_writes()
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot start {self.directory} at {offset}")
        self._truncations += 1
        try:
            for seg in self._segments:
                self._drop_segment(seg)
            self._segments.clear()
            self._bases.clear()
            self._new_segment(offset)
            self._sync_dir_now()
        except (OSError, StorageError) as exc:
            self._failed = StorageError(
                f"{self.directory} could not start over at offset {offset}: {exc}"
            )
            raise self._failed from exc
        self._flushed = offset
        self._history = None  # rebuilt from the batches copied from now on
        self._epoch_mark = offset
        if self._damage:
            self._damage = []
            self._save_damage_file()
        self._settle_waiters()
        self._tell_truncated(
            f"{self.directory} started over at {offset} but its recovery point could not be set"
        )
        log.info("%s deleted its segments and starts over at offset %d", self.directory, offset)

    # --- repairing damage ----------------------------------------------------------------------

    def _damage_starting(self, start: int) -> Damage:
        for d in self._damage:
            if d.start == start:
                return d
        known = ", ".join(f"{d.start}..{d.end - 1}" for d in self._damage) or "none"
        raise OffsetOutOfRangeError(
            f"{self.directory} has no damaged range starting at offset {start} (known: {known})"
        )

    def quarantine(self, start: int) -> Damage:
        """Copy the bytes of the damaged range starting at offset ``start`` to a file beside
        the log (``<start>-<end>.quarantined``, 20 digits each) and from then on read past the
        range as a gap in the offsets (reported in :attr:`damage`) instead of refusing it.
        The bytes stay in their segment, never served, until retention deletes it.

        Returns:
            The range, quarantined.

        Raises:
            OffsetOutOfRangeError: no damaged range starts at ``start``.
            StorageError: the copy could not be written (nothing changed).
        """
        self._check_open()
        d = self._damage_starting(start)
        if d.quarantined is not None:
            return d
        path = f"{self.directory}/{quarantine_name(d)}"
        seg = next((x for x in self._segments if x.log_path == d.path), None)
        try:
            copy_to_quarantine(self.fs, None if seg is None else seg.file, d, path)
        except OSError as exc:
            raise StorageError(f"cannot quarantine {d.path} bytes to {path}: {exc}") from exc
        done = replace(d, quarantined=path)
        self._damage[self._damage.index(d)] = done
        self._save_damage_file()
        log.warning(
            "%s: quarantined offsets %d..%d (%d bytes) to %s; readers now pass the gap",
            self.directory,
            d.start,
            d.end - 1,
            d.size,
            path,
        )
        return done

    def truncate_at_damage(self, start: int) -> tuple[int, int, int]:
        """Cut the log where the damaged range starting at offset ``start`` begins: every
        batch from there on, good ones after the range included, is removed.

        Returns:
            ``(new_end, removed_offsets, removed_bytes)``.

        Raises:
            OffsetOutOfRangeError: no damaged range starts at ``start``.
            StorageError: a file operation failed.
        """
        self._check_open()
        self._damage_starting(start)
        end_before, size_before = self.log_end_offset, self.size_bytes
        end = self.truncate_to(start)
        removed_bytes = size_before - self.size_bytes
        log.warning(
            "%s: truncated at the damaged range at offset %d: offsets %d..%d (%d bytes) removed",
            self.directory,
            start,
            end,
            end_before - 1,
            removed_bytes,
        )
        return end, end_before - end, removed_bytes

    def apply_retention(self, now_ms: int | None = None) -> list[int]:
        """Delete whole segments past ``retention_ms`` (by their newest record) or beyond
        ``retention_bytes`` (oldest first). The active segment is never deleted.

        Returns:
            Base offsets of the deleted segments.
        """
        self._check_open()
        self._drain_writes()
        now = self.clock() if now_ms is None else now_ms
        cfg = self.config
        total = self.size_bytes

        def expired_or_oversize(seg: Segment) -> bool:
            nonlocal total
            expired = cfg.retention_ms >= 0 and now - seg.max_timestamp > cfg.retention_ms
            oversize = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
            if expired or oversize:
                total -= seg.size
                return True
            return False

        return self._drop_head(expired_or_oversize, "retention")

    def delete_before(self, offset: int) -> list[int]:
        """Delete the whole segments whose records all lie below ``offset`` (the active
        segment never): what a log that rewrote its live records at ``offset`` onwards no
        longer needs.

        Returns:
            Base offsets of the deleted segments.
        """
        self._check_open()
        self._drain_writes()
        bases = self._bases
        return self._drop_head(lambda seg: len(bases) > 1 and bases[1] <= offset, "compaction")

    def _drop_head(self, drop: Callable[[Segment], bool], why: str) -> list[int]:
        deleted: list[int] = []
        while len(self._segments) > 1:
            seg = self._segments[0]
            if not drop(seg):
                break
            try:
                self._drop_segment(seg)
            except OSError as exc:
                raise StorageError(f"{why} could not delete {seg.log_path}: {exc}") from exc
            del self._segments[0]
            del self._bases[0]
            deleted.append(seg.base_offset)
        if deleted:
            if self._history is not None:
                self._history.truncate_before(self.log_start_offset)
            kept = [d for d in self._damage if d.end > self.log_start_offset]
            if len(kept) != len(self._damage):
                self._damage = kept
                self._save_damage_file()
            try:
                self._sync_dir_now()
            except OSError as exc:
                raise StorageError(f"directory sync of {self.directory} failed: {exc}") from exc
            log.info(
                "%s deleted %d segment(s) of %s; log now starts at %d",
                why,
                len(deleted),
                self.directory,
                self.log_start_offset,
            )
        return deleted

    def _drop_segment(self, seg: Segment) -> None:
        self._remove_segment_files(seg)  # first: if it fails, the segment stays usable
        if self._flushing:
            self._deferred_close.append(seg)
        else:
            seg.file.close()

    def _remove_segment_files(self, seg: Segment) -> None:
        self.fs.remove(seg.log_path)  # first: without the .log the rest are orphans
        self._remove_seal_files(seg)

    def _remove_seal_files(self, seg: Segment) -> None:
        for suffix in (".index", ".timeindex"):
            if self.fs.exists(seg.path(suffix)):
                self.fs.remove(seg.path(suffix))
        seg.seal_persisted = False

    # --- closing --------------------------------------------------------------------------------

    async def close_async(self) -> None:
        """Wait for a running flush, flush everything and persist every index (in a worker
        thread, so that many logs closing at once fsync in parallel), close.

        Raises:
            StorageError: the final flush failed (files are closed all the same).
        """
        await self.wait_idle()
        if self._closed:
            return
        self._drain_writes()
        if self._failed is None:
            for seg in self._segments:
                seg.sealed = True  # so the flush writes every segment's indexes
            plan = self._flush_plan()
            error: OSError | None = None
            try:
                await asyncio.to_thread(self._flush_io, plan)
            except OSError as exc:
                error = exc
            self._flush_done(plan, error, report=False)
            if error is not None:
                self.close()
                assert self._failed is not None
                raise self._failed
        self.close()  # what is left to flush: nothing, unless appended meanwhile

    async def wait_idle(self) -> None:
        """Return once no flush is running."""
        while (running := self._flush_running) is not None:
            await asyncio.wait([running])

    def close(self) -> None:
        """Flush everything (unless the log failed or is corrupt), persist the indexes of
        every segment, active one included, and close the files.

        Raises:
            StorageError: the final flush failed (files are closed all the same); not logged
                here: the caller reports it (the log manager, once for every log).
        """
        if self._closed:
            return
        try:
            self._drain_writes()
            if self._failed is None:
                for seg in self._segments:
                    seg.sealed = True  # so the flush writes every segment's indexes
                self._flush_now(report=False)
        finally:
            self._closed = True
            self._close_files()
            self._fail_waiters(LogClosedError(f"log {self.directory} was closed"))

    @property
    def closed(self) -> bool:
        return self._closed

    def _close_files(self) -> None:
        for seg in self._segments:
            try:
                seg.file.close()
            except OSError as exc:  # closing cannot lose data that flush() has synced
                log.warning("closing %s: %s", seg.log_path, exc)

    def abandon(self, error: TidewireError | None = None) -> None:
        """Close the files without flushing: what a crash leaves behind (for tests), or a
        replica dropped on purpose. Appends still waiting fail with ``error`` (by default
        :class:`LogClosedError`): a replica moved to other nodes gives a retriable error, so
        its producers send again to the new leader."""
        for w in self._pending:
            if w.future is not None and not w.future.done():
                w.future.set_exception(
                    error or LogClosedError(f"log {self.directory} was abandoned")
                )
        self._pending.clear()
        self._fail_waiters(error or LogClosedError(f"log {self.directory} was abandoned"))
        self._closed = True
        self._close_files()


_WRITEBACK_POOLS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}  # by process id


def _writeback_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that send writeback hints, made once per process (a forked child has none
    of its parent's threads)."""
    pid = os.getpid()
    pool = _WRITEBACK_POOLS.get(pid)
    if pool is None:
        pool = _WRITEBACK_POOLS[pid] = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="tidewire-writeback"
        )
    return pool


def _start_writeback(file: FileHandle, offset: int, length: int) -> None:
    """In a worker thread: the writeback hint; a failure only costs the hint (the file may
    even have been closed since: a segment deleted by retention)."""
    try:
        file.start_writeback(offset, length)
    except OSError as exc:
        log.debug("writeback hint for %s failed: %s", file.path, exc)


def check_appendable(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Check that the batch at ``pos`` may be appended: what :func:`check_batch` checks
    (header, sizes, CRC-32C), at least one record, and ``last_offset_delta`` equal to the
    record count - 1 (offsets are assigned densely).

    Raises:
        RecordBatchError: a subclass naming the fault.
    """
    h = check_batch(buf, pos)
    if h.records_count < 1 or h.last_offset_delta != h.records_count - 1:
        raise RecordCountError(
            f"batch has {h.records_count} records and last_offset_delta "
            f"{h.last_offset_delta}; an appended batch needs >= 1 record and "
            "last_offset_delta = count - 1"
        )
    return h


def _check_one_batch(view: memoryview, max_batch_bytes: int) -> BatchHeader:
    """Check that ``view`` is exactly one appendable batch of at most ``max_batch_bytes``.

    Raises:
        BatchTooLargeError, RecordBatchError: naming the fault.
    """
    if len(view) > max_batch_bytes:
        raise BatchTooLargeError(
            f"batch of {len(view):,} bytes exceeds max_batch_bytes={max_batch_bytes:,}"
        )
    h = check_appendable(view)
    if h.size != len(view):
        raise RecordCountError(
            f"append takes exactly one batch: {len(view):,} bytes given, the batch is {h.size:,}"
        )
    return h


def _is_segment_file(name: str, suffix: str) -> bool:
    return len(name) == 20 + len(suffix) and name.endswith(suffix) and name[:20].isdigit()


def _headers_in(data: bytes) -> list[int]:
    """Base offsets of the batch headers that parse in a cut tail (for the report only)."""
    out: list[int] = []
    try:
        for _, h in iter_batches(data, verify=False):
            out.append(h.base_offset)
    except RecordBatchError:
        pass  # the first header that does not parse ends the count
    return out


class FlushIOError(OSError):
    """A flush's blocking step failed: which step (``step``, e.g. "writing the index
    00000000000000000000.index") and the OS error (``error``)."""

    def __init__(self, step: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror, error.filename)
        self.step = step
        self.error = error


def check_preallocate_bytes(value: int) -> None:
    """Raise :class:`InvalidConfigError` unless ``value`` is a valid ``preallocate_bytes``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or not (value == 0 or MIN_PREALLOCATE_BYTES <= value <= MAX_PREALLOCATE_BYTES):
        raise InvalidConfigError(
            f"preallocate_bytes={value!r} must be 0 (off) or within "
            f"{MIN_PREALLOCATE_BYTES:,}..{MAX_PREALLOCATE_BYTES:,}"
        )


def describe_os_error(error: OSError) -> str:
    """``No space left on device (ENOSPC)``: the OS's words and the errno's name."""
    name = errno.errorcode.get(error.errno or 0)
    words = error.strerror or str(error)
    return f"{words} ({name})" if name else words


def _describe_flush_error(error: OSError) -> str:
    if isinstance(error, FlushIOError):
        return f"{error.step}: {describe_os_error(error.error)}"
    return describe_os_error(error)


#: Bytes :func:`intact_records` reads at a time.
_INTACT_CHUNK = 4 * 1024 * 1024


def intact_records(plog: PartitionLog) -> Iterator[Record]:
    """Every record of ``plog`` with a value, from its start to its end, in offset order;
    damaged ranges (never served) are skipped. For the broker's internal logs, which are
    read through at start."""
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        try:
            r = plog.read(offset, _INTACT_CHUNK)
        except PartitionCorruptError as exc:  # never served: what it held is lost
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
                if rec.value is not None and rec.offset >= offset:
                    yield rec
        offset = r.next_offset
