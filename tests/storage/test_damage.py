"""Damaged ranges of a partition log: found, bounded, persisted, read past, repaired.

Complements test_corruption.py (every bit of a batch): here the shapes of damage (two ranges in
one segment, a range running to a segment's end, a missing segment, damage in the active
segment with appends after it), the record in ``damage.json`` across reopens, retention, and
the two repairs (quarantine, truncation at the damage).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tidewire.errors import OffsetOutOfRangeError, PartitionCorruptError
from tidewire.records import build_batch
from tidewire.storage import FaultFS, LogConfig, PartitionLog
from tidewire.storage.damage import DAMAGE_FILE
from tidewire.storage.segment import PREFIX

T0 = 1_700_000_000_000
DIR = "/data/dmg-0"
CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=300)


@dataclass(frozen=True)
class Stored:
    offset: int
    path: str
    position: int
    data: bytes  # as stored


def write(fs: FaultFS, n: int = 30, *, config: LogConfig = CONFIG) -> list[Stored]:
    """``n`` one-record batches, closed cleanly."""
    log = PartitionLog.open(fs, DIR, config)
    out: list[Stored] = []
    positions: dict[int, int] = {}
    for i in range(n):
        data = build_batch([f"value {i:03d} ".encode() + b"v" * 60], timestamp_ms=T0 + i)
        info = log.append(data)
        seg = log.segment_bases[-1]
        position = positions.get(seg, 0)
        positions[seg] = position + len(data)
        stored = PREFIX.pack(info.base_offset, len(data) - 12, 0) + data[PREFIX.size :]
        out.append(Stored(info.base_offset, f"{DIR}/{seg:020d}.log", position, stored))
    log.close()
    return out


def flip(fs: FaultFS, s: Stored, at: int = -10) -> None:
    buf = bytearray(fs.contents(s.path))
    buf[s.position + (at % len(s.data))] ^= 0x08
    fs.set_contents(s.path, bytes(buf))


def segment_of(batches: list[Stored], i: int) -> list[Stored]:
    paths = sorted({b.path for b in batches})
    return [b for b in batches if b.path == paths[i]]


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    logger = logging.getLogger("tidewire.storage")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def check_reads(log: PartitionLog, batches: list[Stored], damaged: set[int]) -> None:
    for b in batches:
        if b.offset in damaged:
            with pytest.raises(PartitionCorruptError) as info:
                log.read(b.offset)
            assert info.value.damage_start <= b.offset < info.value.damage_end
        else:
            assert log.read(b.offset, 1).data == b.data, b.offset


def test_two_ranges_in_one_segment() -> None:
    fs = FaultFS()
    batches = write(fs)
    seg = segment_of(batches, 1)
    assert len(seg) >= 5
    flip(fs, seg[1])
    flip(fs, seg[3], at=20)
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    check_reads(log, batches, {seg[1].offset, seg[3].offset})
    assert [(d.start, d.end) for d in log.damage] == [
        (seg[1].offset, seg[1].offset + 1),
        (seg[3].offset, seg[3].offset + 1),
    ]
    assert log.damage_found == 2
    # a large read between them returns exactly the batch between
    assert log.read(seg[2].offset, 10**6).data == seg[2].data
    # reopened: known from damage.json before anything reads
    log.close()
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    assert [(d.start, d.end) for d in log.damage] == [
        (seg[1].offset, seg[1].offset + 1),
        (seg[3].offset, seg[3].offset + 1),
    ]
    assert log.damage_found == 0  # found by nothing in this run yet
    check_reads(log, batches, {seg[1].offset, seg[3].offset})
    log.close()


def test_a_bad_length_in_the_last_batch_runs_to_the_segment_end() -> None:
    fs = FaultFS()
    batches = write(fs)
    seg = segment_of(batches, 1)
    last = seg[-1]
    flip(fs, last, at=10)  # the length field: the batch's extent is unknown
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    check_reads(log, batches, {last.offset})
    (d,) = log.damage
    assert (d.start, d.end, d.position) == (last.offset, last.offset + 1, last.position)
    assert d.end_position == last.position + len(last.data)
    log.close()


def test_damage_in_the_active_segment_then_appends_then_a_crash() -> None:
    fs = FaultFS()
    batches = write(fs)
    active = segment_of(batches, len({b.path for b in batches}) - 1)
    victim = active[0]
    flip(fs, victim)
    end = batches[-1].offset + 1
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=end)  # unclean: scanned
    assert [(d.start, d.end) for d in log.damage] == [(victim.offset, victim.offset + 1)]
    assert log.report.damage == list(log.damage)
    info = log.append(build_batch([b"after"], timestamp_ms=T0))
    assert info.base_offset == end
    log.flush()
    log.abandon()  # a crash: the next open scans the active segment again
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=end + 1)
    assert [(d.start, d.end) for d in log.damage] == [(victim.offset, victim.offset + 1)]
    check_reads(log, batches, {victim.offset})
    assert log.read(end).next_offset == end + 1
    log.close()


def test_damage_to_the_end_of_the_active_segment_ends_at_the_recovery_point() -> None:
    fs = FaultFS()
    batches = write(fs)
    active = segment_of(batches, len({b.path for b in batches}) - 1)
    victim = active[-1]
    flip(fs, victim, at=9)  # the length: nothing valid after it
    end = victim.offset + 1
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=end)
    (d,) = log.damage
    assert (d.start, d.end) == (victim.offset, end)
    assert log.log_end_offset == end
    assert log.append(build_batch([b"x"], timestamp_ms=T0)).base_offset == end
    log.close()


def test_a_missing_segment_below_the_recovery_point_is_a_range_without_bytes() -> None:
    fs = FaultFS()
    batches = write(fs)
    gone = segment_of(batches, 1)
    fs.remove(gone[0].path)
    for suffix in (".index", ".timeindex"):
        fs.remove(gone[0].path.removesuffix(".log") + suffix)
    end = batches[-1].offset + 1
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=end)
    (d,) = log.damage
    assert (d.start, d.end, d.size) == (gone[0].offset, gone[-1].offset + 1, 0)
    lost = {b.offset for b in gone}
    check_reads(log, [b for b in batches if b.path != gone[0].path], set())
    for o in lost:
        with pytest.raises(PartitionCorruptError) as info:
            log.read(o)
        assert (info.value.damage_start, info.value.damage_end) == (d.start, d.end)
    log.close()


def test_quarantine() -> None:
    fs = FaultFS()
    batches = write(fs)
    seg = segment_of(batches, 1)
    victim = seg[2]
    flip(fs, victim)
    damaged_bytes = fs.contents(victim.path)[victim.position : victim.position + len(victim.data)]
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    with pytest.raises(PartitionCorruptError):
        log.read(victim.offset)
    with pytest.raises(OffsetOutOfRangeError, match="no damaged range starting at offset 3"):
        log.quarantine(3)
    d = log.quarantine(victim.offset)
    assert d.quarantined == f"{DIR}/{victim.offset:020d}-{victim.offset + 1:020d}.quarantined"
    assert fs.contents(d.quarantined) == damaged_bytes
    assert log.corruption is None  # nothing refused any more
    assert log.damage == (d,)
    # read past as a gap: the read at the range answers from its end
    r = log.read(victim.offset, 1)
    assert (r.data, r.next_offset) == (seg[3].data, seg[3].offset + 1)
    r = log.read(seg[0].offset, 10**6)
    assert r.next_offset == victim.offset  # a read from below still ends before it
    check_reads(log, [b for b in batches if b is not victim], set())
    assert log.quarantine(victim.offset) == d  # again: nothing more to do
    log.close()
    for clean in (True, False):
        log = PartitionLog.open(fs, DIR, CONFIG, clean=clean, recovery_point=batches[-1].offset)
        assert [x.quarantined for x in log.damage] == [d.quarantined]
        assert log.read(victim.offset, 1).data == seg[3].data
        log.close()
    recorded = json.loads(fs.contents(f"{DIR}/{DAMAGE_FILE}"))
    assert recorded["ranges"][0]["quarantined"] == d.quarantined


def test_truncate_at_damage() -> None:
    fs = FaultFS()
    batches = write(fs)
    seg = segment_of(batches, 1)
    victim = seg[2]
    flip(fs, victim)
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    with pytest.raises(PartitionCorruptError):
        log.read(victim.offset)
    size = log.size_bytes
    end, removed, removed_bytes = log.truncate_at_damage(victim.offset)
    assert end == victim.offset
    assert removed == batches[-1].offset + 1 - victim.offset
    assert removed_bytes == size - log.size_bytes
    assert removed_bytes == sum(len(b.data) for b in batches if b.offset >= victim.offset)
    assert log.damage == ()
    assert not fs.exists(f"{DIR}/{DAMAGE_FILE}")
    assert log.append(build_batch([b"new"], timestamp_ms=T0)).base_offset == victim.offset
    check_reads(log, [b for b in batches if b.offset < victim.offset], set())
    log.close()
    log = PartitionLog.open(fs, DIR, CONFIG)
    assert log.damage == ()
    assert log.log_end_offset == victim.offset + 1
    log.close()


def test_retention_of_the_damaged_segment_forgets_the_damage() -> None:
    fs = FaultFS()
    batches = write(fs)
    victim = segment_of(batches, 0)[1]
    flip(fs, victim)
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    with pytest.raises(PartitionCorruptError):
        log.read(victim.offset)
    assert fs.exists(f"{DIR}/{DAMAGE_FILE}")
    log.config = LogConfig(segment_bytes=1500, index_interval_bytes=300, retention_ms=1)
    deleted = log.apply_retention(now_ms=T0 + 10**9)
    assert 0 in deleted
    assert log.damage == ()
    assert not fs.exists(f"{DIR}/{DAMAGE_FILE}")
    log.close()


def test_an_unreadable_damage_file_is_ignored_and_damage_found_again() -> None:
    fs = FaultFS()
    batches = write(fs)
    victim = segment_of(batches, 1)[1]
    flip(fs, victim)
    fs.set_contents(f"{DIR}/{DAMAGE_FILE}", b"{garbage")
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    assert log.damage == ()
    check_reads(log, batches, {victim.offset})
    assert [d.start for d in log.damage] == [victim.offset]
    log.close()
    assert json.loads(fs.contents(f"{DIR}/{DAMAGE_FILE}"))["ranges"][0]["start"] == victim.offset


def test_damage_a_scan_finds_is_recorded_at_once() -> None:
    """Found by the scan after a crash, it is in damage.json before the log is even read, so
    a later clean start (which trusts the segment and does not scan it) still reports it."""
    fs = FaultFS()
    batches = write(fs)
    active = segment_of(batches, len({b.path for b in batches}) - 1)
    flip(fs, active[0])
    end = batches[-1].offset + 1
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=end)
    assert json.loads(fs.contents(f"{DIR}/{DAMAGE_FILE}"))["ranges"][0]["start"] == active[0].offset
    log.abandon()
    fs.remove(f"{DIR}/{DAMAGE_FILE}")
    log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=end)
    log.close()
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)  # trusted: not scanned
    assert log.report.scanned_segments == 0
    assert [d.start for d in log.damage] == [active[0].offset]
    log.close()
