"""Bit flips in stored batches: always detected, never served, and the rest still served.

A log of several segments is closed cleanly, so its sealed segments are trusted on the next
open and not scanned: a flipped bit in one of them can only be caught when it is read. For each
flip (every byte of a few batches, every bit of their 16-byte prefixes, random bits across the
segment) the log is reopened and read; every read must either return bytes identical to what
was stored or raise :class:`PartitionCorruptError` carrying the damaged range. Once found, the
damaged range is exactly the damaged batch (its file, byte position and offsets); every offset
outside it is served, and appends go on.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidewire.errors import PartitionCorruptError
from tidewire.records import BatchBuilder, build_batch
from tidewire.storage import FaultFS, FileSystem, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage.segment import PREFIX

T0 = 1_700_000_000_000
DIR = "/data/flip-0"
#: Sparse enough that a lookup walks over several batch headers from its index entry.
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=400)


@dataclass(frozen=True)
class Batch:
    base: int
    next: int
    data: bytes  # as stored
    path: str  # its segment's .log
    position: int  # within that file
    timestamps: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    files: dict[str, bytes]
    batches: tuple[Batch, ...]
    bases: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.batches[-1].next

    def segment(self, i: int) -> list[Batch]:
        path = f"{DIR}/{self.bases[i]:020d}.log"
        return [b for b in self.batches if b.path == path]

    def holding(self, offset: int) -> Batch:
        return next(b for b in self.batches if b.base <= offset < b.next)

    def at_byte(self, path: str, position: int) -> Batch:
        return next(
            b
            for b in self.batches
            if b.path == path and b.position <= position < b.position + len(b.data)
        )

    def records(self) -> Iterator[tuple[int, int]]:
        for b in self.batches:
            yield from zip(range(b.base, b.next), b.timestamps, strict=True)

    def fs(self, path: str | None = None, position: int = 0, bit: int = 0) -> FaultFS:
        """A file system holding the log, with one bit of ``path`` flipped."""
        fs = FaultFS()
        for p, data in self.files.items():
            if p == path:
                buf = bytearray(data)
                buf[position] ^= 1 << bit
                fs.set_contents(p, bytes(buf))
            else:
                fs.set_contents(p, data)
        return fs


def write_log(fs: FileSystem, directory: str, batches: int = 40) -> tuple[Batch, ...]:
    """Append random multi-record batches, close cleanly; return what was stored."""
    rng = random.Random(batches)
    log = PartitionLog.open(fs, directory, CONFIG)
    out = []
    positions: dict[int, int] = {}
    for i in range(batches):
        b = BatchBuilder()
        stamps = tuple(T0 + 100 * i + rng.randrange(-150, 150) for _ in range(rng.randrange(1, 6)))
        for ts in stamps:
            b.append(rng.randbytes(rng.randrange(10, 60)), key=rng.randbytes(3), timestamp_ms=ts)
        data = b.build()
        info = log.append(data)
        seg = log.segment_bases[-1]
        pos = positions.get(seg, 0)
        positions[seg] = pos + len(data)
        stored = PREFIX.pack(info.base_offset, len(data) - 12, 0) + data[PREFIX.size :]
        out.append(
            Batch(
                info.base_offset,
                info.last_offset + 1,
                stored,
                f"{directory}/{seg:020d}.log",
                pos,
                stamps,
            )
        )
    log.close()
    return tuple(out)


@pytest.fixture(scope="module")
def layout() -> Layout:
    fs = FaultFS()
    batches = write_log(fs, DIR)
    bases = tuple(sorted({int(b.path.rsplit("/", 1)[1][:20]) for b in batches}))
    lay = Layout({p: fs.contents(p) for p in fs.files()}, batches, bases)
    assert len(bases) >= 4
    assert len(lay.segment(1)) >= 5
    assert all(b.next - b.base > 1 for b in lay.segment(1)[:3])
    return lay


@pytest.fixture(autouse=True)
def quiet_storage_log() -> Iterator[None]:
    """Each detected flip logs an error; thousands of them would only slow the run."""
    logger = logging.getLogger("tidewire.storage")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def check_detected(log: PartitionLog, layout: Layout, victim: Batch) -> None:
    """Read every offset, ascending: each read outside ``victim`` returns the stored batch;
    each inside raises with the victim's range. Then the damage points at ``victim``."""
    assert log.log_end_offset == layout.end
    for b in layout.batches:
        for offset in range(b.base, b.next):
            if b is not victim:
                res = log.read(offset, 1)
                assert (res.data, res.next_offset) == (b.data, b.next), offset
            else:
                with pytest.raises(PartitionCorruptError) as info:
                    log.read(offset, 1)
                assert (info.value.damage_start, info.value.damage_end) == (b.base, b.next)
    check_marked(log, layout, victim)


def check_marked(log: PartitionLog, layout: Layout, victim: Batch) -> None:
    bad = log.corruption
    assert bad is not None
    assert (bad.path, bad.position, bad.start, bad.end) == (
        victim.path,
        victim.position,
        victim.base,
        victim.next,
    )
    assert bad.end_position == victim.position + len(victim.data)
    assert [d.start for d in log.damage] == [victim.base]
    # a large read from the segment's start returns exactly the batches before the victim
    in_seg = [b for b in layout.batches if b.path == victim.path]
    if in_seg[0] is not victim:
        res = log.read(in_seg[0].base, 10**6)
        before = [b for b in in_seg if b.base < victim.base]
        assert res.data == b"".join(b.data for b in before)
        assert res.next_offset == victim.base
    # and from the victim's end, the batches after it in its segment
    if in_seg[-1] is not victim:
        res = log.read(victim.next, 10**6)
        after = [b for b in in_seg if b.base > victim.base]
        assert res.data == b"".join(b.data for b in after)
    # every other offset still reads
    for b in layout.batches:
        if b is not victim:
            assert log.read(b.base, 1).data == b.data


def check_appends(log: PartitionLog, layout: Layout) -> None:
    """A damaged log still takes writes, at its end, and serves them."""
    data = build_batch([b"after the damage"], timestamp_ms=T0)
    info = log.append(data)
    assert info.base_offset == layout.end
    assert log.read(layout.end).data[PREFIX.size :] == data[PREFIX.size :]


def check_served_or_refused(log: PartitionLog, layout: Layout, offset: int, budget: int) -> None:
    """A read returns stored bytes from the batch holding ``offset`` on, or raises."""
    try:
        res = log.read(offset, budget)
    except PartitionCorruptError:
        return
    first = layout.holding(offset)
    stored = layout.files[first.path][first.position : first.position + len(res.data)]
    assert res.data, f"read({offset}) returned nothing in the middle of the log"
    assert res.data == stored  # the stored bytes are the intact ones: no damaged byte served


def flip_and_check(layout: Layout, victim: Batch, byte: int, bit: int, *, clean: bool) -> None:
    fs = layout.fs(victim.path, victim.position + byte, bit)
    log = PartitionLog.open(fs, DIR, CONFIG, clean=clean)
    check_detected(log, layout, victim)
    if byte % 7 == 0:
        check_appends(log, layout)
    log.close()


def victims(layout: Layout) -> list[Batch]:
    """The first, a middle and the last batch of a sealed segment."""
    seg = layout.segment(1)
    return [seg[0], seg[len(seg) // 2], seg[-1]]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["first", "middle", "last"])
def test_every_bit_of_the_prefix(layout: Layout, which: int) -> None:
    """Base offset, length and leader epoch sit outside the CRC: other checks catch them."""
    victim = victims(layout)[which]
    for byte in range(PREFIX.size):
        for bit in range(8):
            flip_and_check(layout, victim, byte, bit, clean=True)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["first", "middle", "last"])
def test_every_byte_of_a_batch(layout: Layout, which: int) -> None:
    victim = victims(layout)[which]
    for byte in range(len(victim.data)):
        flip_and_check(layout, victim, byte, (byte * 5 + which) % 8, clean=byte % 2 == 0)


def test_random_bits_across_a_sealed_segment(layout: Layout) -> None:
    rng = random.Random(7)
    path = layout.segment(2)[0].path
    size = len(layout.files[path])
    for _ in range(800):
        position, bit = rng.randrange(size), rng.randrange(8)
        victim = layout.at_byte(path, position)
        flip_and_check(layout, victim, position - victim.position, bit, clean=rng.random() < 0.5)


# header fields whose damage misleads a lookup walking over the batch: the length (prefix bytes
# 8..11) and last_offset_delta (bytes 23..26, under the CRC)
MISLEADING = [(byte, bit) for byte in (9, 10, 11, 25, 26) for bit in range(8)]


def test_flip_is_found_at_its_batch_whatever_is_read_first(layout: Layout) -> None:
    """Reads that start after the damaged batch, in its segment, must not be misled by its
    header into serving nothing, or into blaming another batch."""
    seg = layout.segment(1)
    for vi in range(len(seg) - 2):
        victim = seg[vi]
        later = [b for b in seg if b.base > victim.base]
        for byte, bit in MISLEADING:
            for first in (victim.next - 1, later[0].base, later[-1].next - 1):
                log = PartitionLog.open(
                    layout.fs(victim.path, victim.position + byte, bit), DIR, CONFIG, clean=True
                )
                for budget in (1, 10**6):
                    check_served_or_refused(log, layout, first, budget)
                    if log.corruption is not None:
                        assert (log.corruption.position, log.corruption.start) == (
                            victim.position,
                            victim.base,
                        ), (vi, byte, bit, first)
                check_detected(log, layout, victim)
                log.close()


def test_offset_for_timestamp_never_answers_from_around_a_flip(layout: Layout) -> None:
    """``offset_for_timestamp`` returns the true answer, or an offset of the damaged batch
    when the answer may lie in it (at or below the true answer); it never skips over a
    damaged batch to give a later offset."""
    seg = layout.segment(1)
    records = list(layout.records())
    stamps = sorted({ts for b in seg for ts in b.timestamps})
    for victim in seg[:-1]:
        for byte, bit in MISLEADING:
            fs = layout.fs(victim.path, victim.position + byte, bit)
            for ts in stamps[:: max(1, len(stamps) // 12)]:
                log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
                want = next(o for o, t in records if t >= ts)
                got = log.offset_for_timestamp(ts)
                if got != want:
                    d = log.corruption
                    assert d is not None, (victim.base, byte, bit, ts)
                    assert got is not None, (victim.base, byte, bit, ts)
                    assert d.start <= got < d.end, (victim.base, byte, bit, ts)
                    assert got <= want, (victim.base, byte, bit, ts)
                    assert (d.start, d.end) == (victim.base, victim.next)
                log.abandon()


def test_flip_in_the_active_segment_after_a_clean_close(layout: Layout) -> None:
    seg = layout.segment(len(layout.bases) - 1)
    rng = random.Random(3)
    for victim in seg:
        for _ in range(12):
            byte, bit = rng.randrange(len(victim.data)), rng.randrange(8)
            flip_and_check(layout, victim, byte, bit, clean=True)


def test_flip_in_the_active_segment_below_the_recovery_point(layout: Layout) -> None:
    """Unclean open: the active segment is scanned; a flip below the recovery point is found
    at once and reported as corruption, and nothing is cut."""
    seg = layout.segment(len(layout.bases) - 1)
    rng = random.Random(4)
    for victim in seg:
        for _ in range(12):
            byte, bit = rng.randrange(len(victim.data)), rng.randrange(8)
            fs = layout.fs(victim.path, victim.position + byte, bit)
            log = PartitionLog.open(fs, DIR, CONFIG, recovery_point=layout.end)
            r = log.report
            assert r.damage == [log.corruption]
            assert (r.truncated_bytes, r.truncated_from_offset) == (0, None)
            assert len(fs.contents(victim.path)) == len(layout.files[victim.path])
            bad = log.corruption
            assert bad is not None
            assert (bad.path, bad.position, bad.start) == (
                victim.path,
                victim.position,
                victim.base,
            )
            check_marked(log, layout, victim)
            for offset in range(victim.base, victim.next):
                with pytest.raises(PartitionCorruptError):
                    log.read(offset)
            check_appends(log, layout)
            log.close()


def test_corruption_survives_a_reopen_and_truncation_below_it_clears_it(layout: Layout) -> None:
    victim = layout.segment(1)[2]
    fs = layout.fs(victim.path, victim.position + 40, 3)
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    check_detected(log, layout, victim)
    log.close()
    # the damage is recorded beside the log: known at once, before anything reads it
    log = PartitionLog.open(fs, DIR, CONFIG, clean=True)
    assert log.corruption is not None
    assert log.corruption.start == victim.base
    check_detected(log, layout, victim)
    assert log.truncate_to(victim.base) == victim.base
    assert log.corruption is None
    info = log.append(build_batch([b"fresh"], timestamp_ms=T0))
    assert info.base_offset == victim.base
    for b in layout.batches:
        if b.base >= victim.base:
            break
        assert log.read(b.base, 1).data == b.data
    log.close()
    log = PartitionLog.open(fs, DIR, CONFIG)
    assert log.corruption is None
    assert log.log_end_offset == victim.base + 1
    log.close()


def test_flips_on_the_real_file_system(tmp_path: Path) -> None:
    directory = str(tmp_path / "flip-0")
    fs = OsFileSystem()
    batches = write_log(fs, directory, batches=30)
    bases = sorted({b.path for b in batches})
    path = bases[1]
    original = Path(path).read_bytes()
    rng = random.Random(5)
    for _ in range(25):
        position, bit = rng.randrange(len(original)), rng.randrange(8)
        buf = bytearray(original)
        buf[position] ^= 1 << bit
        Path(path).write_bytes(buf)
        victim = next(
            b
            for b in batches
            if b.path == path and b.position <= position < b.position + len(b.data)
        )
        log = PartitionLog.open(fs, directory, CONFIG, clean=True)
        for b in batches:
            if b is not victim:
                assert log.read(b.base, 1).data == b.data
            else:
                with pytest.raises(PartitionCorruptError):
                    log.read(b.base, 1)
        bad = log.corruption
        assert bad is not None
        assert (bad.path, bad.position, bad.start) == (path, victim.position, victim.base)
        log.abandon()
        Path(directory, "damage.json").unlink()
    Path(path).write_bytes(original)
    log = PartitionLog.open(fs, directory, CONFIG, clean=True)
    assert log.corruption is None
    for b in batches:
        assert log.read(b.base, 1).data == b.data
    log.close()
