"""The partition-log conformance suite: every test runs under every fsync policy (always,
interval, never) and on both file systems (the real one under ``tmp_path`` and the in-memory
:class:`FaultFS`), six ways in all.

Each test keeps a model of what it appended (the stored bytes of every batch and its records)
and checks the log against it: offsets, reads, records, timestamps, rolling, truncation,
retention, reopening after a clean close and after a crash, durability of ``append_async``,
and the refusal of malformed batches.
"""

from __future__ import annotations

import asyncio
import random
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.records._batches import patch_header, reseal
from tidewire.errors import (
    BatchLengthError,
    BatchTooLargeError,
    CorruptBatchError,
    InvalidMagicError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordBatchError,
    RecordCountError,
    TidewireError,
)
from tidewire.records import BatchBuilder, Codec, iter_batches, iter_records
from tidewire.storage import FaultFS, FileSystem, FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage.filecache import CachedFileSystem
from tidewire.storage.segment import PREFIX

#: The clock every test starts at (ms since the epoch); record timestamps sit around it.
T0 = 1_700_000_000_000
CODECS = (Codec.NONE, Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD)


# --- the model ------------------------------------------------------------------------------------


class Rec(NamedTuple):
    """One record as appended."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass
class Stored:
    """One appended batch: its base offset, its bytes as the log stores them, its records."""

    base: int
    data: bytes
    records: list[Rec]

    @property
    def next(self) -> int:
        return self.base + len(self.records)


@dataclass
class Model:
    """What the log must hold."""

    batches: list[Stored] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.batches[-1].next if self.batches else 0

    @property
    def start(self) -> int:
        return self.batches[0].base if self.batches else 0

    def holding(self, offset: int) -> int:
        """Index of the batch holding ``offset``."""
        i = bisect_right([b.base for b in self.batches], offset) - 1
        assert i >= 0
        assert self.batches[i].base <= offset < self.batches[i].next
        return i

    def records(self) -> Iterator[tuple[int, Rec]]:
        for b in self.batches:
            for i, r in enumerate(b.records):
                yield b.base + i, r

    def truncate(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.next <= offset]

    def drop_below(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.base >= offset]


class FakeClock:
    """Milliseconds that move only when the test says so."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def random_records(rng: random.Random, n: int, ts_base: int) -> list[Rec]:
    """``n`` records with random keys, values, headers and non-monotonic timestamps."""
    out = []
    for _ in range(n):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 12))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 90))
        headers = tuple(
            (f"h{j}-ключ", None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 8)))
            for j in range(rng.randrange(0, 3))
        )
        out.append(Rec(ts_base + rng.randrange(-3000, 3000), key, value, headers))
    return out


def build(records: list[Rec], codec: Codec = Codec.NONE) -> bytes:
    b = BatchBuilder(codec=codec)
    for r in records:
        b.append(r.value, timestamp_ms=r.timestamp, key=r.key, headers=r.headers)
    return b.build()


def as_stored(batch: bytes, base: int) -> bytes:
    """``batch`` as the log stores it: base offset assigned, leader epoch 0."""
    return PREFIX.pack(base, len(batch) - 12, 0) + batch[PREFIX.size :]


# --- the harness ----------------------------------------------------------------------------------


@dataclass
class Harness:
    """A partition directory on one file system, under one fsync policy."""

    fs: FileSystem
    directory: str
    policy: FsyncPolicy
    clock: FakeClock = field(default_factory=FakeClock)
    rng: random.Random = field(default_factory=lambda: random.Random(20240601))
    model: Model = field(default_factory=Model)

    def config(self, **overrides: Any) -> LogConfig:
        return LogConfig(fsync=self.policy, index_interval_bytes=256, **overrides)

    def open(self, config: LogConfig, **kwargs: Any) -> PartitionLog:
        return PartitionLog.open(self.fs, self.directory, config, clock=self.clock, **kwargs)

    def append(
        self,
        log: PartitionLog,
        n: int | None = None,
        ts_base: int | None = None,
        records: list[Rec] | None = None,
    ) -> Stored:
        """Append one batch of ``records`` (default: ``n`` random ones, 1..6 if not given)
        and check the answer."""
        rng = self.rng
        if records is None:
            records = random_records(
                rng, n or rng.randrange(1, 7), self.clock.now if ts_base is None else ts_base
            )
        batch = build(records, rng.choice(CODECS))
        info = log.append(batch)
        base = self.model.end
        assert (info.base_offset, info.last_offset) == (base, base + len(records) - 1)
        assert info.size == len(batch)
        assert info.max_timestamp == max(r.timestamp for r in records)
        assert log.log_end_offset == base + len(records)
        stored = Stored(base, as_stored(batch, base), records)
        self.model.batches.append(stored)
        return stored

    def fill(self, log: PartitionLog, batches: int) -> None:
        for _ in range(batches):
            self.append(log)

    def files(self) -> dict[str, bytes]:
        return {
            n: self.fs.read_file(f"{self.directory}/{n}") for n in self.fs.listdir(self.directory)
        }


@pytest.fixture(params=list(FsyncPolicy), ids=str)
def policy(request: pytest.FixtureRequest) -> FsyncPolicy:
    p: FsyncPolicy = request.param
    return p


@pytest.fixture(params=["osfs", "faultfs", "osfs-2-open"])
def h(request: pytest.FixtureRequest, tmp_path: Path, policy: FsyncPolicy) -> Harness:
    if request.param == "osfs":
        return Harness(OsFileSystem(), str(tmp_path / "topic-0"), policy)
    if request.param == "osfs-2-open":  # two descriptors at most: closed and reopened always
        return Harness(CachedFileSystem(OsFileSystem(), 2), str(tmp_path / "topic-0"), policy)
    return Harness(FaultFS(), "/data/topic-0", policy)


# --- checks ---------------------------------------------------------------------------------------


def segment_of(log: PartitionLog, offset: int) -> int:
    return bisect_right(log.segment_bases, offset) - 1


def check_read(log: PartitionLog, model: Model, offset: int, max_bytes: int) -> None:
    """``read(offset, max_bytes)`` returns whole stored batches, starting with the one holding
    ``offset``, within the budget (or exactly one batch), and as many as fit in its segment."""
    res = log.read(offset, max_bytes)
    assert (res.log_start_offset, res.log_end_offset) == (log.log_start_offset, model.end)
    first = j = model.holding(offset)
    pos = 0
    while pos < len(res.data):
        b = model.batches[j]
        assert res.data[pos : pos + len(b.data)] == b.data, f"batch {j} read from {offset}"
        pos += len(b.data)
        j += 1
    assert j > first, f"read({offset}, {max_bytes}) returned no batch"
    assert len(res.data) <= max_bytes or j == first + 1
    assert res.next_offset == model.batches[j - 1].next
    if j < len(model.batches) and segment_of(log, model.batches[j].base) == segment_of(log, offset):
        # A read may end on a batch boundary the sparse index knows (so nothing read is cut
        # off and copied) when that boundary uses at least 7/8 of the budget.
        assert len(res.data) + len(model.batches[j].data) > max_bytes or len(
            res.data
        ) >= max_bytes - (max_bytes >> 3), "the budget was not used"


def read_all(log: PartitionLog) -> bytes:
    """Every stored batch from the log start, by following ``next_offset``."""
    out = []
    offset = log.log_start_offset
    while True:
        res = log.read(offset, 4096)
        if not res.data:
            assert res.next_offset == offset == log.log_end_offset
            return b"".join(out)
        out.append(res.data)
        offset = res.next_offset


def check_contents(log: PartitionLog, model: Model, budgets: tuple[int, ...] = (1, 10**6)) -> None:
    assert (log.log_start_offset, log.log_end_offset) == (model.start, model.end)
    assert log.size_bytes == sum(len(b.data) for b in model.batches)
    assert read_all(log) == b"".join(b.data for b in model.batches)
    for offset in range(model.start, model.end):
        for budget in budgets:
            check_read(log, model, offset, budget)


def brute_offset_for_timestamp(model: Model, ts: int) -> int | None:
    return next((o for o, r in model.records() if r.timestamp >= ts), None)


def check_timestamps(log: PartitionLog, model: Model) -> None:
    stamps = sorted({r.timestamp for _, r in model.records()})
    probes = {stamps[0] - 1, stamps[-1] + 1} | {t + d for t in stamps for d in (-1, 0, 1)}
    for ts in sorted(probes):
        assert log.offset_for_timestamp(ts) == brute_offset_for_timestamp(model, ts), ts


def expected_bases(sizes: list[tuple[int, int]], segment_bytes: int) -> list[int]:
    """Segment bases when rolling by size only: ``sizes`` is ``(base, size)`` per batch."""
    bases: list[int] = []
    used = 0
    for base, size in sizes:
        if not bases or (used > 0 and used + size > segment_bytes):
            bases.append(base)
            used = 0
        used += size
    return bases


# --- offsets and reads ----------------------------------------------------------------------------


def test_offsets_are_consecutive_across_segments(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=1024))
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    h.fill(log, 60)
    bases = [b.base for b in h.model.batches]
    assert bases == sorted(bases)
    assert all(a.next == b.base for a, b in zip(h.model.batches, h.model.batches[1:], strict=False))
    assert log.segment_count >= 4
    assert log.segment_bases == expected_bases(
        [(b.base, len(b.data)) for b in h.model.batches], 1024
    )
    assert log.log_end_offset == h.model.end
    assert log.size_bytes == sum(len(b.data) for b in h.model.batches)
    log.close()


def test_read_from_every_offset(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=2048))
    h.fill(log, 50)
    assert log.segment_count >= 3
    check_contents(log, h.model, budgets=(1, 61, 300, 900, 10**6))
    log.close()


def test_read_with_max_offset(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=2048))
    h.fill(log, 20)
    m = h.model
    for cap in range(m.start, m.end + 1):
        for offset in range(m.start, m.end + 1):
            res = log.read(offset, 10**6, max_offset=cap)
            if offset >= cap:
                assert (res.data, res.next_offset) == (b"", offset)
                continue
            bases = [hdr.base_offset for _, hdr in iter_batches(res.data)]
            assert bases, (offset, cap)
            assert bases[0] == m.batches[m.holding(offset)].base
            assert all(b < cap for b in bases), (offset, cap)
            assert res.next_offset >= min(cap, m.end) or segment_of(
                log, res.next_offset
            ) != segment_of(log, offset)
    log.close()


def test_read_at_end_and_out_of_range(h: Harness) -> None:
    log = h.open(h.config())
    res = log.read(0)
    assert (res.data, res.next_offset, res.log_end_offset) == (b"", 0, 0)
    h.fill(log, 5)
    end = h.model.end
    res = log.read(end, 1)
    assert (res.data, res.next_offset, res.log_start_offset, res.log_end_offset) == (
        b"",
        end,
        0,
        end,
    )
    for bad in (-1, -(2**40), end + 1, end + 10**9):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(bad)
    log.close()


def test_records_read_back_equal_what_was_written(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=1500))
    h.fill(log, 40)
    data = read_all(log)
    got = []
    for pos, hdr in iter_batches(data):
        got.extend(iter_records(memoryview(data)[pos : pos + hdr.size]))
    want = list(h.model.records())
    assert [r.offset for r in got] == [o for o, _ in want] == list(range(h.model.end))
    assert [(r.timestamp, r.key, r.value, r.headers) for r in got] == [tuple(r) for _, r in want]
    log.close()


# --- rolling --------------------------------------------------------------------------------------


def test_roll_by_size(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=1024, max_batch_bytes=4096))
    h.fill(log, 30)
    # a batch larger than segment_bytes gets a segment of its own
    big = h.append(log, records=[Rec(T0, b"k", h.rng.randbytes(1500), ())])
    h.fill(log, 5)
    assert big.base in log.segment_bases
    assert big.next in log.segment_bases
    sizes = [(b.base, len(b.data)) for b in h.model.batches]
    assert log.segment_bases == expected_bases(sizes, 1024)
    assert any(size > 1024 for _, size in sizes)
    assert all(f in h.fs.listdir(h.directory) for f in (f"{b:020d}.log" for b in log.segment_bases))
    check_contents(log, h.model)
    log.close()


def test_roll_by_age(h: Harness) -> None:
    cfg = h.config(segment_ms=1000)
    log = h.open(cfg)
    h.append(log)  # segment 0 created at T0
    h.clock.now += 999
    h.append(log)
    assert log.segment_count == 1
    h.clock.now += 1  # 1000 ms after the first append of segment 0
    second = h.append(log)
    assert log.segment_bases == [0, second.base]
    h.clock.now += 10_000  # an old segment rolls on the next append, not before
    assert log.segment_count == 2
    third = h.append(log)
    assert log.segment_bases == [0, second.base, third.base]
    h.clock.now += 500
    h.append(log)
    assert log.segment_count == 3
    log.close()
    # after a reopen the active segment's age counts from the open
    h.clock.now += 100_000
    log = h.open(cfg, clean=True)
    h.append(log)
    assert log.segment_count == 3
    h.clock.now += 1000
    fourth = h.append(log)
    assert log.segment_bases == [0, second.base, third.base, fourth.base]
    check_contents(log, h.model)
    log.close()


# --- timestamps -----------------------------------------------------------------------------------


def test_offset_for_timestamp_matches_brute_force(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=1200))
    assert log.offset_for_timestamp(0) is None
    for i in range(45):
        # timestamps wander up and down, within and across batches and segments
        h.append(log, ts_base=T0 + 700 * ((i * 7) % 11) - 100 * i)
    assert log.segment_count >= 3
    check_timestamps(log, h.model)
    log.close()
    log = h.open(h.config(segment_bytes=1200), clean=True)  # indexes loaded from disk
    check_timestamps(log, h.model)
    log.close()


# --- truncation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["mid-batch", "batch-start", "segment-start", "end", "start"])
def test_truncate_then_append(h: Harness, where: str) -> None:
    cfg = h.config(segment_bytes=1024)
    log = h.open(cfg)
    h.fill(log, 40)
    m = h.model
    bases = log.segment_bases
    assert len(bases) >= 3
    multi = next(b for b in m.batches[len(m.batches) // 3 :] if len(b.records) > 1)
    target = {
        "mid-batch": multi.base + 1,
        "batch-start": m.batches[len(m.batches) // 2].base,
        "segment-start": bases[-2],
        "end": m.end,
        "start": 0,
    }[where]
    holding = next((b for b in m.batches if b.base <= target < b.next), None)
    new_end = holding.base if holding is not None else m.end
    assert log.truncate_to(target) == new_end
    m.truncate(new_end)
    assert log.log_end_offset == new_end
    assert log.flushed_offset <= new_end
    check_contents(log, m)
    nxt = h.append(log)
    assert nxt.base == new_end
    h.fill(log, 3)
    check_contents(log, m)
    check_timestamps(log, m)  # the truncated segment's time index was rebuilt
    log.close()
    log = h.open(cfg, clean=True)
    check_contents(log, m)
    h.append(log)
    log.abandon()
    log = h.open(cfg)
    check_contents(log, m)
    log.close()


def test_truncate_below_log_start_is_refused(h: Harness) -> None:
    log = h.open(h.config(segment_bytes=1024, retention_bytes=0))
    h.fill(log, 20)
    log.apply_retention(T0)
    h.model.drop_below(log.log_start_offset)
    assert log.log_start_offset > 0
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(log.log_start_offset - 1)
    check_contents(log, h.model)
    log.close()


# --- retention ------------------------------------------------------------------------------------


def segment_sizes(log: PartitionLog, model: Model) -> list[int]:
    sizes = [0] * log.segment_count
    for b in model.batches:
        sizes[segment_of(log, b.base)] += len(b.data)
    return sizes


@pytest.mark.parametrize("retention_bytes", [0, 1500, 4000, 10**9])
def test_retention_by_bytes(h: Harness, retention_bytes: int) -> None:
    cfg = h.config(segment_bytes=1024, retention_bytes=retention_bytes, retention_ms=-1)
    log = h.open(cfg)
    h.fill(log, 50)
    bases, sizes = log.segment_bases, segment_sizes(log, h.model)
    total, k = sum(sizes), 0
    while k < len(bases) - 1 and total - sizes[k] >= retention_bytes:
        total -= sizes[k]
        k += 1
    assert log.apply_retention(T0 + 10**12) == bases[:k]
    assert log.segment_bases == bases[k:]
    assert log.log_start_offset == bases[k]
    assert log.size_bytes == total
    names = h.fs.listdir(h.directory)
    for b in bases[:k]:
        assert not any(n.startswith(f"{b:020d}") for n in names)
    h.model.drop_below(bases[k])
    if k:
        with pytest.raises(OffsetOutOfRangeError):
            log.read(bases[k] - 1)
    check_contents(log, h.model)
    check_timestamps(log, h.model)
    assert log.apply_retention(T0 + 10**12) == []
    h.append(log)
    log.close()
    log = h.open(cfg, clean=True)
    check_contents(log, h.model)
    log.close()


@pytest.mark.parametrize("reopen", [False, True], ids=["live", "reopened"])
@pytest.mark.parametrize("expired_segments", [0, 1, 3, 99])
def test_retention_by_time(h: Harness, expired_segments: int, reopen: bool) -> None:
    cfg = h.config(segment_bytes=1024, retention_ms=60_000)
    log = h.open(cfg)
    for i in range(40):
        h.clock.now = T0 + 10_000 * i
        h.append(log)
    if reopen:  # sealed segments' newest timestamps then come from their index files
        log.close()
        log = h.open(cfg, clean=True)
    bases = log.segment_bases
    max_ts = [-1] * len(bases)
    for b in h.model.batches:
        i = segment_of(log, b.base)
        max_ts[i] = max(max_ts[i], *(r.timestamp for r in b.records))
    assert max_ts == sorted(max_ts)
    k = min(expired_segments, len(bases) - 1)  # the active segment is never deleted
    now = (max_ts[k - 1] if k else max_ts[0] - 1) + 60_001
    if k == len(bases) - 1:
        now = max_ts[-1] + 10**9
    assert log.apply_retention(now) == bases[:k]
    assert log.log_start_offset == bases[k]
    h.model.drop_below(bases[k])
    check_contents(log, h.model)
    check_timestamps(log, h.model)
    log.abandon()
    log = h.open(cfg)
    check_contents(log, h.model)
    log.close()


# --- reopening ------------------------------------------------------------------------------------


def snapshot(log: PartitionLog, model: Model) -> tuple[object, ...]:
    reads = tuple(log.read(o, 700) for o in range(model.start, model.end))
    stamps = tuple(log.offset_for_timestamp(T0 + d) for d in range(-4000, 4000, 97))
    return (log.log_start_offset, log.log_end_offset, log.segment_bases, reads, stamps)


@pytest.mark.parametrize("crash", [False, True], ids=["close", "abandon"])
def test_reopen_gives_identical_reads(h: Harness, crash: bool) -> None:
    cfg = h.config(segment_bytes=1500)
    log = h.open(cfg)
    h.fill(log, 45)
    before = snapshot(log, h.model)
    for _ in range(2):  # twice: a reopened log is reopened as well as a fresh one
        if crash:
            log.abandon()
        else:
            log.close()
        log = h.open(cfg, clean=not crash)
        assert log.report.clean is not crash
        assert log.report.truncated_bytes == 0
        assert log.report.corruption is None
        assert log.corruption is None
        assert snapshot(log, h.model) == before
        if not crash:
            assert log.report.scanned_segments == 0, "a clean close left an index unusable"
        check_contents(log, h.model)
    h.fill(log, 10)
    check_contents(log, h.model)
    log.close()
    with pytest.raises(LogClosedError):
        log.read(0)
    with pytest.raises(LogClosedError):
        h.append(log)


def test_clean_restart_cycles_keep_indexes_trusted(h: Harness) -> None:
    """Appending to a reopened log, rolling, closing: the next clean open scans nothing."""
    cfg = h.config(segment_bytes=1200)
    for cycle in range(4):
        log = h.open(cfg, clean=cycle > 0)
        if cycle:
            assert log.report.scanned_segments == 0, log.report
            assert log.report.rebuilt_indexes == []
        check_contents(log, h.model, budgets=(10**6,))
        h.fill(log, 12)
        log.close()


# --- async appends --------------------------------------------------------------------------------


def test_append_async_durability(h: Harness) -> None:
    cfg = h.config(segment_bytes=2048)
    always = h.policy is FsyncPolicy.ALWAYS

    async def run() -> None:
        log = h.open(cfg)
        for _ in range(15):
            records = random_records(h.rng, 3, T0)
            info = await log.append_async(build(records))
            assert info.base_offset == h.model.end
            h.model.batches.append(
                Stored(info.base_offset, as_stored(build(records), info.base_offset), records)
            )
            if always:
                assert info.last_offset < log.flushed_offset
            else:
                assert log.flushed_offset == 0
        # concurrent appends share fsyncs and still get consecutive offsets in call order
        batches = [random_records(h.rng, 2, T0) for _ in range(40)]
        infos = await asyncio.gather(*(log.append_async(build(r)) for r in batches))
        for info, records in zip(infos, batches, strict=True):
            assert info.base_offset == h.model.end
            h.model.batches.append(
                Stored(info.base_offset, as_stored(build(records), info.base_offset), records)
            )
        assert log.log_end_offset == h.model.end
        if always:
            assert log.flushed_offset == log.log_end_offset
        else:
            assert log.flushed_offset == 0
        await log.flush_async()
        assert log.flushed_offset == log.log_end_offset
        check_contents(log, h.model, budgets=(10**6,))
        await log.close_async()

    asyncio.run(run())
    log = h.open(cfg, clean=True)
    check_contents(log, h.model, budgets=(10**6,))
    log.close()


# --- malformed batches ----------------------------------------------------------------------------


def _bad_crc(b: bytes) -> bytes:
    buf = bytearray(b)
    buf[-1] ^= 0x01
    return bytes(buf)


def _bad_magic(b: bytes) -> bytes:
    return b[:16] + b"\x01" + b[17:]


BAD_BATCHES: dict[str, tuple[Callable[[bytes, bytes], bytes], type[TidewireError]]] = {
    "bad-crc": (lambda a, _: _bad_crc(a), CorruptBatchError),
    "crc-field": (lambda a, _: a[:17] + bytes(4) + a[21:], CorruptBatchError),
    "bad-magic": (lambda a, _: _bad_magic(a), InvalidMagicError),
    "two-batches": (lambda a, b: a + b, RecordCountError),
    "trailing-byte": (lambda a, _: a + b"\x00", RecordCountError),
    "truncated": (lambda a, _: a[:-1], BatchLengthError),
    "header-only": (lambda a, _: a[:61], BatchLengthError),
    "empty": (lambda a, _: b"", BatchLengthError),
    "zero-records": (lambda a, _: BatchBuilder().build(), RecordCountError),
    "delta-mismatch": (
        lambda a, _: reseal(patch_header(a, last_offset_delta=0)),
        RecordCountError,
    ),
    "oversized": (
        lambda a, _: build([Rec(T0, None, random.Random(7).randbytes(2100), ())]),
        BatchTooLargeError,
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_BATCHES))
def test_malformed_batch_is_refused_and_changes_nothing(h: Harness, kind: str) -> None:
    cfg = h.config(segment_bytes=1024, max_batch_bytes=2048)
    log = h.open(cfg)
    h.fill(log, 12)
    make, error = BAD_BATCHES[kind]
    good = build(random_records(h.rng, 3, T0))
    bad = make(good, build(random_records(h.rng, 2, T0)))
    before = (h.files(), log.log_end_offset, log.size_bytes, log.segment_bases)
    with pytest.raises(error) as info:
        log.append(bad)
    assert type(info.value) is error
    if error is not BatchTooLargeError:
        assert isinstance(info.value, RecordBatchError)
    with pytest.raises(error):
        asyncio.run(log.append_async(bad))
    assert (h.files(), log.log_end_offset, log.size_bytes, log.segment_bases) == before
    check_contents(log, h.model, budgets=(10**6,))
    assert log.append(good).base_offset == h.model.end  # the log still takes good batches
    log.close()


def test_config_change_takes_effect(h: Harness) -> None:
    log = h.open(h.config())
    h.fill(log, 5)
    log.config = replace(log.config, segment_bytes=1024)
    h.fill(log, 20)
    assert log.segment_count > 1
    check_contents(log, h.model, budgets=(10**6,))
    log.close()
