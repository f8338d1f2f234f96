"""One segment of a partition log: a ``.log`` file of batches and its two sparse indexes.

Files are named by the segment's base offset in 20 digits, as Kafka names them:
``00000000000000000000.log``, ``.index``, ``.timeindex``. Batches are appended as they arrive,
with only the first 16 bytes rewritten (base offset, length, leader epoch: all outside the
CRC). Every batch served by :meth:`Segment.read` is checked first: header, CRC-32C, offset
continuity and leader epoch, so a flipped bit anywhere in a batch is never served.

Leader epochs: :attr:`Segment.leader_epoch` is both the epoch stamped on the batches appended
through :meth:`Segment.reserve` and the largest epoch a stored batch may carry (the field is
outside the CRC: the bound is what catches a flipped bit there). A single node stamps and
accepts 0 only; a replicated log raises it with each new leader epoch
(:meth:`tidewire.storage.log.PartitionLog.set_leader_epoch`).
"""

from __future__ import annotations

import functools
import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from typing import NamedTuple

from tidewire.errors import RecordBatchError
from tidewire.records import (
    BATCH_OVERHEAD,
    LOG_OVERHEAD,
    BatchHeader,
    check_batch,
    crc32c,
    parse_header,
)
from tidewire.records.batch import MAX_BATCH_BYTES
from tidewire.storage.fs import FileHandle, FileSystem
from tidewire.storage.index import (
    OffsetIndex,
    TimeIndex,
    decode_index_file,
    encode_index_file,
)

__all__ = ["BadBatch", "Segment", "segment_name"]

#: Bytes read at a time when scanning a segment: large enough for sequential-read speed,
#: small enough that recovery of many partitions does not hold much memory.
SCAN_CHUNK_BYTES = 8 * 1024 * 1024
#: The header fields read-time verification looks at: base_offset, batch_length,
#: partition_leader_epoch, magic, crc.
_VERIFY = struct.Struct(">qiibI")
_CRC_START = _VERIFY.size  # attributes: where the CRC-covered region starts
_LAST_DELTA = struct.Struct(">i")
_LAST_DELTA_AT = _CRC_START + 2  # after the 2-byte attributes
_MAGIC_AT = 16  # base_offset (8), batch_length (4), partition_leader_epoch (4)
#: The header fields the epoch walk reads: the prefix, magic, crc, attributes, last delta.
_EPOCH_WALK = struct.Struct(">qiibIhi")
#: Bytes read at a time by the epoch walk: one read covers the headers of many small batches;
#: a batch larger than this costs one read of its header.
EPOCH_WALK_BYTES = 64 * 1024
#: How :meth:`Segment.scan` names a tail of nothing but zeros (see :meth:`Segment.preallocate`).
ZERO_TAIL = "zeros to the end of the file"
#: The 16 bytes the broker writes in front of each stored batch.
PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch


def segment_name(base_offset: int) -> str:
    """The file name stem of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


@dataclass(frozen=True, slots=True)
class BadBatch:
    """Where and why a segment stops holding valid batches."""

    path: str
    position: int
    offset: int
    reason: str


class SegmentMark(NamedTuple):
    """A segment's mutable state, to roll back a write that failed."""

    size: int
    next_offset: int
    max_timestamp: int
    index_len: int
    timeindex_len: int
    since_index: int
    since_time: int
    created_ms: int
    seal_persisted: bool
    sealed: bool


class CorruptBatchFound(Exception):
    """Internal: a stored batch failed its checks while being read."""

    def __init__(self, bad: BadBatch) -> None:
        super().__init__(bad.reason)
        self.bad = bad


class Segment:
    """A segment's file handle, size, offsets and indexes. Owned by one :class:`PartitionLog`.

    Attributes:
        base_offset: offset of the first batch.
        size: bytes in the ``.log`` file that hold valid batches.
        next_offset: offset after the last batch (``base_offset`` when empty).
        max_timestamp: largest batch ``max_timestamp`` (-1 when empty).
        created_ms: clock time of the first append (for rolling by age; -1 when empty).
        sealed: no more appends; its indexes are persisted once it is synced.
        synced_size: bytes known to be on stable storage.
        zeroed_to: the ``.log`` file holds zeros from :attr:`size` up to here, written ahead
            of the appends (:meth:`preallocate`); 0 when none are known.
        small_syncs: fsyncs of the active segment that covered little, counted from
            ``small_syncs_since`` (clock ms; see ``tidewire.storage.log.PREALLOCATE_SMALL_SYNC``).
        leader_epoch: the epoch stamped on batches appended with :meth:`reserve`, and the
            largest epoch a stored batch may carry.
    """

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        base_offset: int,
        file: FileHandle,
        *,
        index_interval_bytes: int,
        leader_epoch: int = 0,
    ) -> None:
        self.fs = fs
        self.directory = directory
        self.base_offset = base_offset
        self.file = file
        self.index_interval = index_interval_bytes
        self.leader_epoch = leader_epoch
        self.size = 0
        self.synced_size = 0
        self.zeroed_to = 0
        #: :meth:`trim` cut the file and no flush has synced its new size yet.
        self.cut_unsynced = False
        self.small_syncs = 0
        self.small_syncs_since = -(1 << 62)
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.created_ms = -1
        self.sealed = False
        #: Whether the last :meth:`scan` read a batch of an idempotent producer (None: the
        #: segment was not scanned since it was opened).
        self.scan_saw_producers: bool | None = None
        self.seal_persisted = False
        self.index = OffsetIndex(base_offset)
        self.timeindex = TimeIndex(base_offset)
        self._since_index = 0
        self._since_time = 0
        #: Where the last :meth:`read` ended, ``(offset, position)``: the batch at that
        #: position starts at that offset. A reader at the tail asks for it next, and
        #: :meth:`locate` answers without reading the file. (-1, -1): none; forgotten
        #: whenever what the file holds is rebuilt or rolled back.
        self._read_end = (-1, -1)

    # --- paths ----------------------------------------------------------------------------------

    def path(self, suffix: str) -> str:
        return f"{self.directory}/{segment_name(self.base_offset)}{suffix}"

    @property
    def log_path(self) -> str:
        return self.path(".log")

    # --- appending ------------------------------------------------------------------------------

    def append(self, batch: memoryview, h: BatchHeader, now_ms: int) -> int:
        """Write ``batch`` (already checked) at the end with ``next_offset`` as its base offset.

        Returns the byte position it was written at.

        Raises:
            OSError: the write failed; the segment's state is rolled back (the caller
                truncates the file back to :attr:`size`).
        """
        mark = self.mark()
        position, buffers = self.reserve(
            batch, h.batch_length, h.last_offset_delta, h.max_timestamp, now_ms
        )
        try:
            self.file.pwritev(buffers, position)
        except OSError:
            self.rollback(mark)
            raise
        return position

    def reserve(
        self,
        batch: memoryview,
        batch_length: int,
        last_offset_delta: int,
        max_timestamp: int,
        now_ms: int,
    ) -> tuple[int, tuple[bytes, memoryview]]:
        """Account for ``batch`` (already checked; the header fields given are its own) at the
        end of the segment without writing it: offsets, size and indexes move as if it were
        written.

        Returns:
            ``(position, buffers)``: where to write and what (the 16-byte prefix with the
            assigned base offset, then the rest of the batch).
        """
        position = self.size
        base = self.next_offset
        size = batch_length + LOG_OVERHEAD
        self._track(position, base, base + last_offset_delta, max_timestamp, size)
        if self.created_ms < 0:
            self.created_ms = now_ms
        self.seal_persisted = False  # the persisted indexes no longer describe the file
        return position, (
            PREFIX.pack(base, batch_length, self.leader_epoch),
            batch[PREFIX.size :],
        )

    def mark(self) -> SegmentMark:
        """The segment's state now, for :meth:`rollback`."""
        return SegmentMark(
            self.size,
            self.next_offset,
            self.max_timestamp,
            len(self.index.offsets),
            len(self.timeindex.offsets),
            self._since_index,
            self._since_time,
            self.created_ms,
            self.seal_persisted,
            self.sealed,
        )

    def rollback(self, m: SegmentMark) -> None:
        """Return to the state of :meth:`mark` (the file itself is not touched)."""
        self._read_end = (-1, -1)
        self.size = m.size
        self.synced_size = min(self.synced_size, m.size)
        self.zeroed_to = 0  # the caller truncates the file back to the mark's size
        self.next_offset = m.next_offset
        self.max_timestamp = m.max_timestamp
        for arr in (self.index.offsets, self.index.positions):
            del arr[m.index_len :]
        for arr in (self.timeindex.offsets, self.timeindex.timestamps):
            del arr[m.timeindex_len :]
        self._since_index = m.since_index
        self._since_time = m.since_time
        self.created_ms = m.created_ms
        self.seal_persisted = m.seal_persisted
        self.sealed = m.sealed

    def _track(self, position: int, base: int, last: int, max_ts: int, size: int) -> None:
        if self._since_index >= self.index_interval:
            self.index.append(base, position)
            self._since_index = 0
        self._since_index += size
        self._since_time += size
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
            # An entry (t, o) promises every record up to o is no newer than t: only a new
            # running maximum may be recorded, at most once per index interval.
            if self._since_time >= self.index_interval or not len(self.timeindex):
                self.timeindex.maybe_append(max_ts, last)
                self._since_time = 0
        self.size = position + size
        self.next_offset = last + 1

    # --- checking stored batches ----------------------------------------------------------------

    def _check(self, buf: bytes | memoryview, pos: int, expect: int, file_pos: int) -> BatchHeader:
        """Check the stored batch at ``buf[pos:]`` whose base offset should be ``expect``."""
        try:
            h = check_batch(buf, pos, max_batch_bytes=MAX_BATCH_BYTES)
        except RecordBatchError as exc:
            raise CorruptBatchFound(BadBatch(self.log_path, file_pos, expect, str(exc))) from None
        if h.base_offset != expect:
            raise CorruptBatchFound(
                BadBatch(
                    self.log_path,
                    file_pos,
                    expect,
                    f"batch base offset is {h.base_offset}, expected {expect}",
                )
            )
        if not 0 <= h.partition_leader_epoch <= self.leader_epoch:
            raise CorruptBatchFound(
                BadBatch(
                    self.log_path,
                    file_pos,
                    expect,
                    f"batch leader epoch is {h.partition_leader_epoch}, "
                    f"expected 0..{self.leader_epoch}",
                )
            )
        return h

    # --- scanning (recovery, index rebuild) -----------------------------------------------------

    def scan(
        self, resync_below: int = 0
    ) -> tuple[list[tuple[BadBatch, int, int | None]], BadBatch | None]:
        """Read the whole ``.log`` file, check every batch and rebuild the indexes.

        A batch that fails its checks at an offset below ``resync_below`` is damage inside
        the log: the scan looks for the next valid batch after it and goes on from there. One
        at or above ``resync_below`` ends the scan (a torn tail, for the caller to cut).

        Sets :attr:`size`, :attr:`next_offset` and :attr:`max_timestamp` from what was read.

        Returns:
            ``(damages, torn)``: each damage as ``(bad, end_position, end_offset)``, where
            ``end_offset`` is ``None`` when no valid batch follows it (the damage runs to the
            end of the file, which :attr:`size` then is; the caller sets
            :attr:`next_offset`); and the batch that ends the scan, or ``None``.
        """
        self.index = OffsetIndex(self.base_offset)
        self.timeindex = TimeIndex(self.base_offset)
        self._since_index = 0
        self._since_time = 0
        self._read_end = (-1, -1)
        self.size = 0
        self.zeroed_to = 0
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.scan_saw_producers = False
        file_size = self.file.size()
        damages: list[tuple[BadBatch, int, int | None]] = []
        chunk = b""
        chunk_start = 0
        pos = 0
        while pos < file_size:
            rel = pos - chunk_start
            if len(chunk) - rel < BATCH_OVERHEAD:
                # No more than the file holds: a pread of 8 MiB allocates 8 MiB first, which
                # for a small active segment (a restart of 10,000 of them) costs more than
                # the read.
                chunk = self.file.pread(min(SCAN_CHUNK_BYTES, file_size - pos), pos)
                chunk_start, rel = pos, 0
            bad: BadBatch | None = None
            try:
                h = parse_header(chunk, rel)
            except RecordBatchError as exc:
                bad = BadBatch(self.log_path, pos, self.next_offset, str(exc))
            else:
                if pos + h.size > file_size:
                    bad = BadBatch(
                        self.log_path,
                        pos,
                        self.next_offset,
                        f"batch of {h.size:,} bytes is cut off at the end of the file "
                        f"({file_size - pos:,} bytes present)",
                    )
                else:
                    if rel + h.size > len(chunk):
                        chunk = self.file.pread(max(SCAN_CHUNK_BYTES, h.size), pos)
                        chunk_start, rel = pos, 0
                    try:
                        h = self._check(chunk, rel, self.next_offset, pos)
                    except CorruptBatchFound as exc:
                        bad = exc.bad
            if bad is None:
                self._track(pos, h.base_offset, h.last_offset, h.max_timestamp, h.size)
                if h.producer_id >= 0:
                    self.scan_saw_producers = True
                pos += h.size
                continue
            if bad.offset >= resync_below:
                if self._zeros_from(pos, file_size):
                    # Zeros written ahead of the appends (preallocate), or never written:
                    # cut as a torn tail is, under a name that says so.
                    bad = replace(bad, reason=f"{ZERO_TAIL} ({bad.reason})")
                return damages, bad
            found = self.find_valid_batch(pos + 1, file_size, bad.offset, None)
            if found is None:
                damages.append((bad, file_size, None))
                self.size = file_size
                return damages, None
            pos, self.next_offset = found
            damages.append((bad, pos, self.next_offset))
            self.size = pos
            chunk, chunk_start = b"", pos
        return damages, None

    def _zeros_from(self, start: int, stop: int) -> bool:
        """Whether the file holds only zero bytes in ``[start, stop)``."""
        pos = start
        while pos < stop:
            chunk = self.file.pread(min(SCAN_CHUNK_BYTES, stop - pos), pos)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True

    def find_valid_batch(
        self, start: int, stop: int, after_offset: int, before_offset: int | None
    ) -> tuple[int, int] | None:
        """The first position in ``[start, stop)`` where a whole valid batch starts whose base
        offset lies in ``(after_offset, before_offset)`` (no upper bound if ``None``): where
        reading can go on after damage. Returns ``(position, base_offset)`` or ``None``.

        Index entries past ``start`` (they point at batch starts as written) are tried first,
        so the byte-by-byte search covers at most one index interval in the usual case.
        """
        hi = (1 << 63) - 1 if before_offset is None else before_offset
        bound = stop
        positions = self.index.positions
        for i in range(bisect_left(positions, start), len(positions)):
            pos = positions[i]
            if pos >= stop:
                break
            if self._valid_batch_at(pos, after_offset, hi, stop):
                bound = pos
                break
        at = start
        while at < bound:
            # Overlap by a header so a batch starting near a chunk's end is seen whole.
            chunk = self.file.pread(min(SCAN_CHUNK_BYTES, bound - at) + BATCH_OVERHEAD, at)
            i = chunk.find(b"\x02", _MAGIC_AT)
            while i >= 0 and at + i - _MAGIC_AT < bound:
                q = at + i - _MAGIC_AT
                base = self._valid_batch_at(q, after_offset, hi, stop, chunk, i - _MAGIC_AT)
                if base is not None:
                    return q, base
                i = chunk.find(b"\x02", i + 1)
            at += SCAN_CHUNK_BYTES
        if bound < stop:
            base = self._valid_batch_at(bound, after_offset, hi, stop)
            assert base is not None
            return bound, base
        return None

    def _valid_batch_at(  # noqa: PLR0917 (a hot helper of the search: positional on purpose)
        self,
        pos: int,
        lo: int,
        hi: int,
        stop: int,
        buf: bytes | None = None,
        rel: int = 0,
    ) -> int | None:
        """The base offset of the valid batch at ``pos`` if one is there with a base offset
        in ``(lo, hi)`` that ends by ``stop``, else ``None``."""
        if buf is None or len(buf) - rel < _VERIFY.size:
            buf, rel = self.file.pread(_VERIFY.size, pos), 0
            if len(buf) < _VERIFY.size:
                return None
        base, length, lepoch, magic, _ = _VERIFY.unpack_from(buf, rel)
        size = length + LOG_OVERHEAD
        if (
            magic != 2
            or not lo < base < hi
            or not BATCH_OVERHEAD <= size <= MAX_BATCH_BYTES
            or pos + size > stop
            or not 0 <= lepoch <= self.leader_epoch
        ):
            return None
        if len(buf) - rel < size:
            buf, rel = self.file.pread(size, pos), 0
        try:
            self._check(buf, rel, base, pos)
        except CorruptBatchFound:
            return None
        return int(base)

    def epoch_starts(
        self, gaps: dict[int, tuple[int, int]] | None = None
    ) -> tuple[list[tuple[int, int]], str | None]:
        """The first batch of each leader epoch in the segment, from the batch headers only
        (no CRC check, no record read): ``(base offset, epoch)`` pairs in offset order.

        When the first and the last batch carry the same epoch (the usual case: epochs change
        rarely) only those two headers are read. Else every header is read, many per
        :data:`EPOCH_WALK_BYTES` read.

        Args:
            gaps: damaged ranges of this segment as ``{position: (end_position,
                end_offset)}``: the walk jumps over them.

        Returns:
            ``(starts, stopped)``: ``stopped`` says why the walk ended before the end of the
            segment (a header inconsistent with the one before it and no known damage there),
            else ``None``; ``starts`` then covers the batches before that point.
        """
        if self.size == 0:
            return [], None
        if not gaps:
            try:
                found = self.locate(self.next_offset - 1, self.size)
            except CorruptBatchFound:
                found = None
            if found is not None:
                first = self.file.pread(_EPOCH_WALK.size, 0)
                last = self.file.pread(_EPOCH_WALK.size, found[0])
                if len(first) == len(last) == _EPOCH_WALK.size:
                    base, _, epoch, *_ = _EPOCH_WALK.unpack(first)
                    if epoch == _EPOCH_WALK.unpack(last)[2] and base == self.base_offset:
                        return [(base, epoch)], None
        return self._walk_epochs(gaps or {})

    def _walk_epochs(
        self, gaps: dict[int, tuple[int, int]]
    ) -> tuple[list[tuple[int, int]], str | None]:
        starts: list[tuple[int, int]] = []
        last_epoch: int | None = None
        pos, expect = 0, self.base_offset
        window, window_at = b"", 0
        while pos < self.size:
            gap = gaps.get(pos)
            if gap is not None:
                pos, expect = gap
                continue
            rel = pos - window_at
            if rel + _EPOCH_WALK.size > len(window):
                window_at, rel = pos, 0
                window = self.file.pread(min(EPOCH_WALK_BYTES, self.size - pos), pos)
                if len(window) < _EPOCH_WALK.size:
                    return starts, f"a batch header at byte {pos:,} is cut off"
            base, length, epoch, magic, _, _, last_delta = _EPOCH_WALK.unpack_from(window, rel)
            size = length + LOG_OVERHEAD
            if base != expect or magic != 2 or size < BATCH_OVERHEAD or last_delta < 0:
                return starts, (
                    f"the batch header at byte {pos:,} does not follow the one before it "
                    f"(base offset {base}, expected {expect})"
                )
            if epoch != last_epoch:
                starts.append((base, epoch))
                last_epoch = epoch
            expect = base + last_delta + 1
            pos += size
        return starts, None

    def load_seal(self, file_size: int) -> bool:
        """Load the persisted indexes; return ``True`` if both are intact and describe a
        ``.log`` of ``file_size`` bytes (then size, next offset and max timestamp are set)."""
        try:
            raw = self.fs.read_file(self.path(".index"))
            raw_t = self.fs.read_file(self.path(".timeindex"))
        except FileNotFoundError:
            return False
        oi = decode_index_file(raw, time=False, base_offset=self.base_offset)
        ti = decode_index_file(raw_t, time=True, base_offset=self.base_offset)
        if oi is None or ti is None or oi[:3] != ti[:3] or oi.log_size != file_size:
            return False
        if not isinstance(oi.entries, OffsetIndex) or not isinstance(ti.entries, TimeIndex):
            return False
        self.index, self.timeindex = oi.entries, ti.entries
        self.size = self.synced_size = oi.log_size
        self.next_offset = oi.next_offset
        self.max_timestamp = oi.max_timestamp
        self._since_index = self._since_time = self.index_interval  # next append: entries
        self.seal_persisted = True
        return True

    def seal_files(self) -> tuple[bytes, bytes]:
        """The ``.index`` and ``.timeindex`` file contents describing the segment now."""
        meta = {
            "log_size": self.size,
            "next_offset": self.next_offset,
            "max_timestamp": self.max_timestamp,
        }
        return (
            encode_index_file(self.index, **meta),
            encode_index_file(self.timeindex, **meta),
        )

    # --- reading --------------------------------------------------------------------------------

    def locate(
        self, offset: int, limit: int, floor: tuple[int, int] | None = None
    ) -> tuple[int, int] | None:
        """Return ``(position, base_offset)`` of the batch holding ``offset``, or ``None`` if
        ``offset`` is at or past the segment's end. Only the first ``limit`` bytes of the
        file are considered; ``floor`` (a position and the base offset of the valid batch
        there, at or below ``offset``) is where the walk starts if the index knows no later
        start: the end of a damaged range the walk must not cross.

        Raises:
            CorruptBatchFound: a batch header on the way is damaged, or the batches end
                before ``offset`` (a damaged length led past it).
        """
        if offset >= self.next_offset:
            return None
        read_end = self._read_end
        if offset == read_end[0] and floor is None and limit == self.size and read_end[1] < limit:
            return read_end[1], offset  # where the last read ended (no damage in the way)
        expect, pos = self.index.lookup(offset)
        if floor is not None and floor[0] > pos:
            pos, expect = floor
        passed: tuple[int, int, int] | None = None  # position, base offset, size
        # The walk from the index entry spans about one index interval: read that window
        # once and parse the headers from memory (one pread, not one per batch).
        window = b""
        window_at = pos
        while True:
            if pos >= limit:
                self._check_passed(passed)
                raise CorruptBatchFound(
                    BadBatch(
                        self.log_path,
                        limit,
                        expect,
                        f"no batch holds offset {offset} before byte {limit:,}",
                    )
                )
            rel = pos - window_at
            if rel + BATCH_OVERHEAD > len(window):
                window_at, rel = pos, 0
                want = min(self.index_interval + BATCH_OVERHEAD, limit - pos)
                window = self.file.pread(max(want, BATCH_OVERHEAD), pos)
            try:
                h = parse_header(window, rel)
            except RecordBatchError as exc:
                self._check_passed(passed)
                raise CorruptBatchFound(BadBatch(self.log_path, pos, expect, str(exc))) from None
            if h.base_offset != expect:
                self._check_passed(passed)
                raise CorruptBatchFound(
                    BadBatch(
                        self.log_path,
                        pos,
                        expect,
                        f"batch base offset is {h.base_offset}, expected {expect}",
                    )
                )
            if h.last_offset >= offset:
                return pos, expect
            passed = (pos, expect, h.size)
            expect = h.next_offset
            pos += h.size

    def _check_passed(self, passed: tuple[int, int, int] | None) -> None:
        """A lookup met an inconsistent header: the batch it walked past last may be the
        damaged one (its length, or its last_offset_delta under its CRC, led there). Raise
        :class:`CorruptBatchFound` for that batch if it fails its full check."""
        if passed is not None:
            position, base, size = passed
            self._check(self.file.pread(size, position), 0, base, position)

    def read(
        self, position: int, expect: int, max_bytes: int, limit: int, stop_offset: int
    ) -> tuple[bytes, int]:
        """Read whole, checked batches from ``position`` (whose batch starts at ``expect``).

        At least one whole batch is returned even if it is larger than ``max_bytes``; no byte
        at or past ``limit`` is read, and no batch starting at or after ``stop_offset``.

        Returns:
            ``(data, next_offset)``.

        Raises:
            CorruptBatchFound: the first batch fails its checks. (A later failing batch ends
                the result before it; the caller's next read raises.)
        """
        end = limit
        if limit - position > max_bytes:
            # End on a batch boundary the index knows, so no partial batch is read and cut off
            # (which would cost a copy of the whole result).
            # Taken only when it uses at least 7/8 of the budget; else read the budget and cut.
            positions = self.index.positions
            i = bisect_right(positions, position + max_bytes) - 1
            end = position + max_bytes
            if i >= 0 and positions[i] - position >= max_bytes - (max_bytes >> 3):
                end = positions[i]
        data = self.file.pread(max(end - position, BATCH_OVERHEAD), position)
        size = _batch_size(data)
        if size is not None and size > len(data) and position + size <= limit:
            data = self.file.pread(size, position)  # one batch larger than max_bytes
        view = memoryview(data)
        n = len(data)
        pos = 0
        nxt = expect
        epoch = self.leader_epoch
        while n - pos >= BATCH_OVERHEAD and nxt < stop_offset:
            # The fast path checks what read-time verification needs (offset continuity,
            # epoch, magic, length, CRC-32C); anything off goes through the full check, which
            # names the fault.
            base, length, lepoch, magic, crc = _VERIFY.unpack_from(data, pos)
            size = length + LOG_OVERHEAD
            if (
                base == nxt
                and magic == 2
                and 0 <= lepoch <= epoch
                and BATCH_OVERHEAD <= size <= n - pos
                and crc32c(view[pos + _CRC_START : pos + size]) == crc
            ):
                nxt = base + _LAST_DELTA.unpack_from(data, pos + _LAST_DELTA_AT)[0] + 1
                pos += size
                continue
            if size < BATCH_OVERHEAD or size > n - pos:
                if pos == 0:
                    self._check(data, 0, nxt, position)  # raises: the batch is cut short
                break
            try:
                h = self._check(view, pos, nxt, position + pos)
            except CorruptBatchFound:
                if pos == 0:
                    raise
                break
            nxt = h.next_offset
            pos += size
        else:
            # Ended on a batch boundary with no batch found failing there: the next read
            # from ``nxt`` starts at it.
            self._read_end = (nxt, position + pos)
        view.release()
        return (data if pos == n else data[:pos]), nxt

    def timestamp_scan_start(self, timestamp: int) -> int:
        """An offset from which scanning finds the first record with timestamp >= the given."""
        return self.timeindex.start_offset_for(timestamp)

    # --- changing the file ----------------------------------------------------------------------

    def preallocate(self, nbytes: int) -> None:
        """Write ``nbytes`` of zeros past the end of what the file holds (appends and zeros
        written before), so that the appends that fill them leave the file's size alone: an
        fsync that covers them writes their data and not the inode's size (on ext4 here, a
        third less time than one that grows the file, at the median). After a crash,
        recovery cuts a tail of zeros as it cuts a torn tail (:meth:`scan` names it);
        :meth:`trim` cuts it off before the segment is sealed.

        Raises:
            OSError: the write failed (what it wrote is zeros past :attr:`size`: harmless).
        """
        start = max(self.size, self.zeroed_to)
        self.file.pwritev((_zeros(nbytes),), start)
        self.zeroed_to = start + nbytes

    def trim(self) -> bool:
        """Cut the zeros :meth:`preallocate` wrote past :attr:`size` (which may count batches
        reserved and not yet written: they land inside the file); return whether the file
        changed. Its new size is durable only once the file is synced: until then
        :attr:`cut_unsynced` is set."""
        if self.zeroed_to <= self.size:
            return False
        self.file.truncate(self.size)
        self.zeroed_to = 0
        self.cut_unsynced = True
        return True

    def truncate_to(
        self, position: int
    ) -> tuple[list[tuple[BadBatch, int, int | None]], BadBatch | None]:
        """Cut the ``.log`` file at ``position`` (a batch boundary) and rebuild the state of
        what is left by scanning it (damage in it skipped over). Returns what :meth:`scan`
        returns."""
        self.file.truncate(position)
        self.zeroed_to = 0
        self.synced_size = min(self.synced_size, position)
        self.sealed = False
        self.seal_persisted = False
        return self.scan(1 << 62)


@functools.lru_cache(maxsize=2)
def _zeros(nbytes: int) -> bytes:
    """``nbytes`` zero bytes, made once per size (the setting is one size a process)."""
    return bytes(nbytes)


def _batch_size(buf: bytes, pos: int = 0) -> int | None:
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    return int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True) + LOG_OVERHEAD
