"""Recovery of a torn tail: what a crash leaves at the end of the active segment.

A log is written and abandoned (no clean close). Then its files are damaged the way a crash
damages them — random bytes after the last batch of the ``.log`` or ``.index``, or the last
batch cut at every byte position — and the log is reopened. Exactly the complete batches must
survive, the report must say what was cut, every offset must read back right, and appends must
go on at the right offset. Below the recovery point the same damage is corruption: reported,
never cut.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidewire.errors import PartitionCorruptError
from tidewire.records import BatchBuilder, build_batch
from tidewire.storage import FaultFS, FileSystem, FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage.segment import PREFIX

T0 = 1_700_000_000_000
DIR = "/data/torn-0"
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=64, fsync=FsyncPolicy.INTERVAL)


@dataclass(frozen=True)
class Batch:
    base: int
    count: int
    data: bytes  # as stored

    @property
    def next(self) -> int:
        return self.base + self.count


@dataclass(frozen=True)
class Written:
    """A log written and abandoned: its files and the batches in it, in order."""

    files: dict[str, bytes]
    batches: tuple[Batch, ...]
    bases: tuple[int, ...]  # segment base offsets

    @property
    def end(self) -> int:
        return self.batches[-1].next

    @property
    def active(self) -> str:
        return f"{DIR}/{self.bases[-1]:020d}.log"

    def position(self, i: int) -> int:
        """Byte position of batch ``i`` within its segment."""
        b = self.batches[i]
        seg = max(s for s in self.bases if s <= b.base)
        return sum(len(x.data) for x in self.batches[:i] if x.base >= seg)

    def fs(self) -> FaultFS:
        fs = FaultFS()
        for path, data in self.files.items():
            fs.set_contents(path, data)
        return fs


def write_log(
    fs: FileSystem,
    directory: str,
    *,
    batches: int = 30,
    last_values: int = 3,
    clean_first: bool = False,
) -> tuple[tuple[Batch, ...], tuple[int, ...]]:
    """Append ``batches`` random batches (the last one small: ``last_values`` 20-byte
    values), flushing now and then so sealed segments have their indexes, then abandon.
    With ``clean_first`` the log is closed cleanly and reopened before the last batch."""
    rng = random.Random(batches * 1000 + last_values)
    out: list[Batch] = []

    def append(log: PartitionLog, data: bytes) -> None:
        info = log.append(data)
        out.append(
            Batch(
                info.base_offset,
                info.last_offset - info.base_offset + 1,
                PREFIX.pack(info.base_offset, len(data) - 12, 0) + data[PREFIX.size :],
            )
        )

    log = PartitionLog.open(fs, directory, CONFIG)
    for i in range(batches - 1):
        b = BatchBuilder()
        for _ in range(rng.randrange(1, 5)):
            b.append(
                rng.randbytes(rng.randrange(5, 120)),
                key=rng.randbytes(4),
                timestamp_ms=T0 + rng.randrange(-1000, 1000),
            )
        append(log, b.build())
        if i % 7 == 6:
            log.flush()
    if clean_first:  # the active segment keeps the indexes of the clean close: stale ones
        log.close()
        log = PartitionLog.open(fs, directory, CONFIG, clean=True)
    append(log, build_batch([rng.randbytes(20) for _ in range(last_values)], timestamp_ms=T0))
    bases = tuple(log.segment_bases)
    log.abandon()
    return tuple(out), bases


@pytest.fixture(scope="module")
def written() -> Written:
    fs = FaultFS()
    batches, bases = write_log(fs, DIR, batches=37)
    assert len(bases) >= 3
    assert sum(1 for b in batches if b.base >= bases[-1]) >= 6
    assert 100 <= len(batches[-1].data) <= 200
    return Written({p: fs.contents(p) for p in fs.files()}, batches, bases)


def check_log(log: PartitionLog, batches: tuple[Batch, ...]) -> None:
    """Exactly ``batches`` are in the log, and every offset reads the batch holding it."""
    end = batches[-1].next if batches else 0
    assert log.log_end_offset == end
    assert log.corruption is None
    for b in batches:
        for offset in range(b.base, b.next):
            res = log.read(offset, 1)
            assert (res.data, res.next_offset) == (b.data, b.next), offset
    res = log.read(end)
    assert (res.data, res.next_offset) == (b"", end)


def check_appends_continue(log: PartitionLog, end: int) -> None:
    info = log.append(build_batch([b"after", b"the", b"crash"], timestamp_ms=T0))
    assert (info.base_offset, info.last_offset) == (end, end + 2)
    assert log.log_end_offset == end + 3


def test_intact_log_reopens_unchanged(written: Written) -> None:
    fs = written.fs()
    log = PartitionLog.open(fs, DIR, CONFIG)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset, r.corruption) == (0, None, None)
    assert r.scanned_segments >= 1  # the active segment is always scanned after a crash
    check_log(log, written.batches)
    check_appends_continue(log, written.end)
    log.close()


SIZES = (1, 2, 11, 12, 16, 60, 61, 62, 100, 333, 1023, 1024)


@pytest.mark.parametrize("size", SIZES)
def test_random_bytes_after_the_last_batch_are_cut(written: Written, size: int) -> None:
    rng = random.Random(size)
    fs = written.fs()
    garbage = rng.randbytes(size)
    fs.set_contents(written.active, written.files[written.active] + garbage)
    log = PartitionLog.open(fs, DIR, CONFIG)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset) == (size, written.end)
    assert r.truncated_batches_seen == 0
    assert r.corruption is None
    assert fs.contents(written.active) == written.files[written.active]
    check_log(log, written.batches)
    check_appends_continue(log, written.end)
    log.close()
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    assert log.report.truncated_bytes == 0
    assert log.report.scanned_segments == 0
    check_log(log, (*written.batches, *_after(written.end)))
    log.close()


def _after(end: int) -> tuple[Batch, ...]:
    data = build_batch([b"after", b"the", b"crash"], timestamp_ms=T0)
    return (Batch(end, 3, PREFIX.pack(end, len(data) - 12, 0) + data[PREFIX.size :]),)


@pytest.mark.parametrize("size", [1, 7, 48, 49, 512, 1024])
@pytest.mark.parametrize("fs_kind", ["faultfs", "osfs"])
def test_random_bytes_after_active_log_and_index(tmp_path: Path, fs_kind: str, size: int) -> None:
    """The active segment has a stale ``.index`` (from a clean close before more appends);
    garbage after both it and the ``.log``: the tail is cut and the indexes rebuilt."""
    fs: FileSystem = FaultFS() if fs_kind == "faultfs" else OsFileSystem()
    directory = DIR if fs_kind == "faultfs" else str(tmp_path / "torn-0")
    batches, bases = write_log(fs, directory, batches=12, clean_first=True)
    end = batches[-1].next
    active = f"{directory}/{bases[-1]:020d}"
    assert fs.exists(f"{active}.index"), "the scenario needs an index for the active segment"
    rng = random.Random(size)
    for suffix in (".log", ".index"):
        f = fs.open(active + suffix, create=False)
        f.pwritev([rng.randbytes(size)], f.size())
        f.close()
    log = PartitionLog.open(fs, directory, CONFIG)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset, r.corruption) == (size, end, None)
    assert f"{active}.index" in r.rebuilt_indexes
    check_log(log, batches)
    check_appends_continue(log, end)
    log.close()
    log = PartitionLog.open(fs, directory, CONFIG, clean=True)
    assert (log.report.scanned_segments, log.report.truncated_bytes) == (0, 0)
    check_log(log, batches + _after(end))
    log.close()


@pytest.mark.parametrize("size", [1, 48, 1024])
def test_garbage_after_an_index_alone_only_rebuilds_it(written: Written, size: int) -> None:
    fs = written.fs()
    sealed = f"{DIR}/{written.bases[1]:020d}.index"
    assert sealed in written.files
    fs.set_contents(sealed, written.files[sealed] + random.Random(size).randbytes(size))
    log = PartitionLog.open(fs, DIR, CONFIG)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset, r.corruption) == (0, None, None)
    assert sealed in r.rebuilt_indexes
    check_log(log, written.batches)
    log.close()


def test_last_batch_cut_at_every_byte(written: Written) -> None:
    last = written.batches[-1]
    pos = written.position(len(written.batches) - 1)
    full = written.files[written.active]
    assert len(full) == pos + len(last.data)
    for keep in range(len(last.data)):
        fs = written.fs()
        fs.set_contents(written.active, full[: pos + keep])
        log = PartitionLog.open(fs, DIR, CONFIG)
        r = log.report
        if keep == 0:  # a clean cut between batches: nothing to report
            assert (r.truncated_bytes, r.truncated_from_offset) == (0, None), keep
        else:
            assert (r.truncated_bytes, r.truncated_from_offset) == (keep, last.base), keep
        assert r.corruption is None
        assert fs.contents(written.active) == full[:pos], keep
        check_log(log, written.batches[:-1])
        check_appends_continue(log, last.base)
        log.close()


def test_active_segment_cut_at_every_byte(written: Written) -> None:
    """Wherever the active segment is cut, the batches wholly before the cut survive."""
    first = next(i for i, b in enumerate(written.batches) if b.base >= written.bases[-1])
    full = written.files[written.active]
    starts = [written.position(i) for i in range(first, len(written.batches))]
    for cut in range(len(full)):
        survivors = first + sum(
            1 for i, s in enumerate(starts) if s + len(written.batches[first + i].data) <= cut
        )
        keep = written.batches[:survivors]
        end = keep[-1].next
        fs = written.fs()
        fs.set_contents(written.active, full[:cut])
        log = PartitionLog.open(fs, DIR, CONFIG)
        r = log.report
        boundary = cut in starts
        assert r.truncated_bytes == (0 if boundary else cut - starts[survivors - first]), cut
        assert r.truncated_from_offset == (None if boundary else end), cut
        assert log.log_end_offset == end, cut
        for b in written.batches[first:survivors]:
            assert log.read(b.next - 1, 1).data == b.data
        assert log.read(end).data == b""
        assert log.append(build_batch([b"z"], timestamp_ms=T0)).base_offset == end
        log.abandon()


def _copy_of_last(written: Written, kind: str) -> bytes:
    last = written.batches[-1].data
    if kind == "bad-crc":
        return last[:-1] + bytes([last[-1] ^ 0x80])
    if kind == "stale-offset":  # a whole valid batch that repeats the last one's offsets
        return last
    return last[: len(last) // 2]  # "partial"


@pytest.mark.parametrize("kind", ["partial", "bad-crc", "stale-offset"])
def test_plausible_batch_after_the_last_is_cut(written: Written, kind: str) -> None:
    """A tail that parses as a batch header but is not a valid next batch is cut too."""
    tail = _copy_of_last(written, kind)
    fs = written.fs()
    fs.set_contents(written.active, written.files[written.active] + tail)
    log = PartitionLog.open(fs, DIR, CONFIG)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset) == (len(tail), written.end)
    assert r.truncated_batches_seen == (0 if kind == "partial" else 1)
    check_log(log, written.batches)
    check_appends_continue(log, written.end)
    log.close()


def test_torn_batch_in_an_earlier_unsealed_segment_drops_the_rest() -> None:
    """Under ``never`` nothing is synced: after a crash the tear may sit in any segment that
    was never sealed on disk, and everything after it goes with it."""
    fs = FaultFS()
    cfg = LogConfig(segment_bytes=1024, fsync=FsyncPolicy.NEVER, index_interval_bytes=64)
    log = PartitionLog.open(fs, DIR, cfg)
    batches = []
    for i in range(30):
        data = build_batch([bytes([i]) * 50, bytes([i]) * 60], timestamp_ms=T0 + i)
        info = log.append(data)
        batches.append(
            Batch(info.base_offset, 2, PREFIX.pack(info.base_offset, len(data) - 12, 0) + data[16:])
        )
    bases = log.segment_bases
    log.abandon()
    assert len(bases) >= 4
    assert not any(p.endswith(".index") for p in fs.files())
    seg = f"{DIR}/{bases[1]:020d}.log"
    content = fs.contents(seg)
    in_seg = [b for b in batches if bases[1] <= b.base < bases[2]]
    torn = in_seg[len(in_seg) // 2]
    at = sum(len(b.data) for b in in_seg if b.base < torn.base)
    later = sum(len(fs.contents(f"{DIR}/{b:020d}.log")) for b in bases[2:])
    fs.set_contents(seg, content[: at + 30])
    log = PartitionLog.open(fs, DIR, cfg)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset) == (30 + later, torn.base)
    assert log.segment_bases == bases[:2]
    assert not any(p.startswith(f"{DIR}/{b:020d}") for p in fs.files() for b in bases[2:])
    check_log(log, tuple(b for b in batches if b.base < torn.base))
    check_appends_continue(log, torn.base)
    log.close()


@pytest.mark.parametrize("keep", [1, 15, 16, 60, 61, 62, -1])
def test_torn_tail_below_the_recovery_point_is_corruption(written: Written, keep: int) -> None:
    last = written.batches[-1]
    pos = written.position(len(written.batches) - 1)
    full = written.files[written.active]
    keep = keep % len(last.data)
    fs = written.fs()
    fs.set_contents(written.active, full[: pos + keep])
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=last.base + 1)
    r = log.report
    assert (r.truncated_bytes, r.truncated_from_offset) == (0, None)
    bad = log.corruption
    assert bad is not None
    assert r.corruption == bad
    assert (bad.path, bad.position, bad.offset) == (written.active, pos, last.base)
    assert fs.contents(written.active) == full[: pos + keep], "corruption must never be cut"
    assert bad.end == last.base + 1  # the recovery point: offsets below it were on disk
    with pytest.raises(PartitionCorruptError) as info:
        log.read(last.base)
    assert (info.value.damage_start, info.value.damage_end) == (last.base, last.base + 1)
    for b in written.batches[:-1]:
        assert log.read(b.base, 1).data == b.data
    # writes go on past the damage, which stays in the file
    assert log.append(build_batch([b"x"], timestamp_ms=T0)).base_offset == last.base + 1
    assert log.read(last.base + 1).next_offset == last.base + 2
    log.close()
    assert fs.contents(written.active)[: pos + keep] == full[: pos + keep]


def test_recovery_point_at_the_torn_batch_still_cuts(written: Written) -> None:
    """A recovery point equal to the torn batch's base offset means it was never synced."""
    last = written.batches[-1]
    pos = written.position(len(written.batches) - 1)
    fs = written.fs()
    fs.set_contents(written.active, written.files[written.active][: pos + 40])
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=last.base)
    assert (log.report.truncated_bytes, log.report.truncated_from_offset) == (40, last.base)
    assert log.corruption is None
    check_log(log, written.batches[:-1])
    log.close()
