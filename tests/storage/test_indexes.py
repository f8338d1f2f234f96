"""Sparse indexes: their file format, and their rebuild when the files on disk are damaged.

The ``.index`` and ``.timeindex`` files only speed up an open; they are never trusted unless
they check out. Whatever happens to them — deleted, truncated, overwritten, extended, swapped
between segments, left over from an earlier state — the reopened log rebuilds them and answers
every read and every timestamp lookup exactly as before.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.records import BatchBuilder
from tidewire.storage import FaultFS, FileSystem, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage.index import (
    INDEX_HEADER,
    OffsetIndex,
    TimeIndex,
    decode_index_file,
    encode_index_file,
)

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128)

# --- the file format ------------------------------------------------------------------------------


def offset_index(base: int, entries: list[tuple[int, int]]) -> OffsetIndex:
    idx = OffsetIndex(base)
    for o, p in entries:
        idx.append(o, p)
    return idx


def time_index(base: int, entries: list[tuple[int, int]]) -> TimeIndex:
    idx = TimeIndex(base)
    for t, o in entries:
        idx.maybe_append(t, o)
    return idx


def increasing(draw: st.DrawFn, n: int, lo: int, hi: int) -> list[int]:
    """``n`` distinct integers within ``lo..hi``, ascending."""
    return sorted(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n, unique=True)))


@st.composite
def offset_indexes(draw: st.DrawFn) -> tuple[OffsetIndex, int, int]:
    """An offset index with its ``.log`` size and next offset."""
    base = draw(st.integers(0, 2**40))
    n = draw(st.integers(0, 40))
    rel = increasing(draw, n, 0, 2**20)
    pos = increasing(draw, n, 0, 2**31 - 2)
    log_size = (pos[-1] if n else 0) + draw(st.integers(1, 10**6))
    next_offset = base + (rel[-1] if n else 0) + draw(st.integers(1, 10**6))
    entries = [(base + r, p) for r, p in zip(rel, pos, strict=True)]
    return offset_index(base, entries), log_size, next_offset


@st.composite
def time_indexes(draw: st.DrawFn) -> tuple[TimeIndex, int]:
    """A time index with its segment's next offset."""
    base = draw(st.integers(0, 2**40))
    n = draw(st.integers(0, 40))
    stamps = increasing(draw, n, -1, 2**50)
    rel = increasing(draw, n, 0, 2**20)
    next_offset = base + (rel[-1] if n else 0) + draw(st.integers(1, 10**6))
    return time_index(base, [(t, base + r) for t, r in zip(stamps, rel, strict=True)]), next_offset


@settings(max_examples=150, deadline=None)
@given(offset_indexes(), st.integers(-1, 2**50))
def test_offset_index_round_trip(case: tuple[OffsetIndex, int, int], max_ts: int) -> None:
    idx, log_size, next_offset = case
    data = encode_index_file(idx, log_size=log_size, next_offset=next_offset, max_timestamp=max_ts)
    assert len(data) == INDEX_HEADER.size + 8 * len(idx)
    got = decode_index_file(data, time=False, base_offset=idx.base_offset)
    assert got is not None
    assert got[:3] == (log_size, next_offset, max_ts)
    assert isinstance(got.entries, OffsetIndex)
    assert list(got.entries.offsets) == list(idx.offsets)
    assert list(got.entries.positions) == list(idx.positions)
    assert decode_index_file(data, time=True, base_offset=idx.base_offset) is None
    assert decode_index_file(data, time=False, base_offset=idx.base_offset + 1) is None


@settings(max_examples=150, deadline=None)
@given(time_indexes(), st.integers(0, 2**31 - 1))
def test_time_index_round_trip(case: tuple[TimeIndex, int], log_size: int) -> None:
    idx, next_offset = case
    max_ts = idx.last_timestamp
    data = encode_index_file(idx, log_size=log_size, next_offset=next_offset, max_timestamp=max_ts)
    assert len(data) == INDEX_HEADER.size + 12 * len(idx)
    got = decode_index_file(data, time=True, base_offset=idx.base_offset)
    assert got is not None
    assert got[:3] == (log_size, next_offset, max_ts)
    assert isinstance(got.entries, TimeIndex)
    assert list(got.entries.timestamps) == list(idx.timestamps)
    assert list(got.entries.offsets) == list(idx.offsets)
    assert decode_index_file(data, time=False, base_offset=idx.base_offset) is None


SAMPLES: list[tuple[str, bytes, bool, int]] = [
    (
        "offset",
        encode_index_file(
            offset_index(1000, [(1004, 300), (1010, 700), (1031, 1500)]),
            log_size=2000,
            next_offset=1040,
            max_timestamp=T0,
        ),
        False,
        1000,
    ),
    (
        "time",
        encode_index_file(
            time_index(1000, [(T0 - 5, 1003), (T0, 1009), (T0 + 7, 1030)]),
            log_size=2000,
            next_offset=1040,
            max_timestamp=T0 + 7,
        ),
        True,
        1000,
    ),
    (
        "empty",
        encode_index_file(OffsetIndex(0), log_size=0, next_offset=0, max_timestamp=-1),
        False,
        0,
    ),
]


@pytest.mark.parametrize(
    ("data", "time", "base"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES]
)
def test_any_single_byte_change_is_refused(data: bytes, time: bool, base: int) -> None:
    assert decode_index_file(data, time=time, base_offset=base) is not None
    for i in range(len(data)):
        for x in range(1, 256):
            buf = bytearray(data)
            buf[i] ^= x
            assert decode_index_file(bytes(buf), time=time, base_offset=base) is None, (i, x)


@pytest.mark.parametrize(
    ("data", "time", "base"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES]
)
def test_truncated_or_extended_files_are_refused(data: bytes, time: bool, base: int) -> None:
    for n in range(len(data)):
        assert decode_index_file(data[:n], time=time, base_offset=base) is None, n
    for extra in (b"\x00", bytes(8), bytes(12), data[-12:]):
        assert decode_index_file(data + extra, time=time, base_offset=base) is None


@pytest.mark.parametrize(
    "entries",
    [
        [(10, 100), (10, 200)],  # offsets do not grow
        [(10, 100), (12, 100)],  # positions do not grow
        [(12, 100), (10, 200)],
        [(10, 5000)],  # position beyond the .log size
        [(60, 100)],  # offset at or beyond next_offset
    ],
)
def test_sealed_but_inconsistent_offset_entries_are_refused(entries: list[tuple[int, int]]) -> None:
    data = encode_index_file(
        offset_index(0, entries), log_size=2000, next_offset=60, max_timestamp=1
    )
    assert decode_index_file(data, time=False, base_offset=0) is None


@pytest.mark.parametrize(
    "entries",
    [
        [(5, 10), (5, 20)],  # timestamps do not grow
        [(5, 10), (6, 10)],  # offsets do not grow
        [(5, 60)],  # offset at or beyond next_offset
    ],
)
def test_sealed_but_inconsistent_time_entries_are_refused(entries: list[tuple[int, int]]) -> None:
    idx = TimeIndex(0)
    for t, o in entries:  # bypass maybe_append, which would drop them
        idx.timestamps.append(t)
        idx.offsets.append(o)
    data = encode_index_file(idx, log_size=2000, next_offset=60, max_timestamp=6)
    assert decode_index_file(data, time=True, base_offset=0) is None


def test_header_fields_out_of_range_are_refused() -> None:
    idx = offset_index(100, [(105, 10)])
    for log_size, next_offset in ((-1, 200), (2000, 99)):
        data = encode_index_file(idx, log_size=log_size, next_offset=next_offset, max_timestamp=0)
        assert decode_index_file(data, time=False, base_offset=100) is None


def test_offset_index_lookup_and_truncate() -> None:
    idx = offset_index(100, [(110, 400), (125, 900), (140, 1300)])
    assert idx.lookup(100) == (100, 0)
    assert idx.lookup(109) == (100, 0)
    assert idx.lookup(110) == (110, 400)
    assert idx.lookup(139) == (125, 900)
    assert idx.lookup(10**9) == (140, 1300)
    idx.truncate_to_position(900)
    assert (list(idx.offsets), list(idx.positions)) == ([110], [400])
    idx.truncate_to_position(0)
    assert len(idx) == 0
    assert idx.lookup(150) == (100, 0)


def test_time_index_start_offset_and_truncate() -> None:
    idx = time_index(100, [(T0, 104), (T0 + 10, 120), (T0 + 10, 130), (T0 + 20, 150)])
    assert list(idx.timestamps) == [T0, T0 + 10, T0 + 20]  # only a new maximum is kept
    assert idx.start_offset_for(T0 - 1) == 100
    assert idx.start_offset_for(T0) == 100
    assert idx.start_offset_for(T0 + 1) == 105
    assert idx.start_offset_for(T0 + 10) == 105
    assert idx.start_offset_for(T0 + 11) == 121
    assert idx.start_offset_for(T0 + 99) == 151
    idx.truncate_to_offset(120)
    assert (list(idx.timestamps), list(idx.offsets)) == ([T0], [104])
    assert idx.last_timestamp == T0


# --- damaged index files in a log -----------------------------------------------------------------


@dataclass
class Env:
    fs: FileSystem
    directory: str

    def path(self, base: int, suffix: str) -> str:
        return f"{self.directory}/{base:020d}{suffix}"

    def read(self, base: int, suffix: str) -> bytes:
        return self.fs.read_file(self.path(base, suffix))

    def write(self, base: int, suffix: str, data: bytes) -> None:
        f = self.fs.open(self.path(base, suffix))
        f.truncate(0)
        f.pwritev([data], 0)
        f.close()

    def remove(self, base: int, suffix: str) -> None:
        self.fs.remove(self.path(base, suffix))


@pytest.fixture(params=["faultfs", "osfs"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    if request.param == "faultfs":
        return Env(FaultFS(), "/data/idx-0")
    return Env(OsFileSystem(), str(tmp_path / "idx-0"))


def fill(log: PartitionLog, batches: int, seed: int) -> list[tuple[int, int]]:
    """Append batches with timestamps that go up and down; return ``(offset, timestamp)``."""
    rng = random.Random(seed)
    out = []
    for i in range(batches):
        b = BatchBuilder()
        stamps = [
            T0 + 40 * ((i * 13) % 17) + rng.randrange(-90, 90) for _ in range(rng.randrange(1, 5))
        ]
        for ts in stamps:
            b.append(rng.randbytes(rng.randrange(5, 70)), timestamp_ms=ts)
        info = log.append(b.build())
        out.extend(zip(range(info.base_offset, info.last_offset + 1), stamps, strict=True))
    return out


Answers = tuple[object, ...]


def answers(log: PartitionLog, records: list[tuple[int, int]]) -> Answers:
    end = log.log_end_offset
    reads = tuple(log.read(o, b) for o in range(log.log_start_offset, end) for b in (1, 500))
    stamps = sorted({t for _, t in records})
    probes = [stamps[0] - 1, *stamps, stamps[-1] + 1]
    times = tuple(log.offset_for_timestamp(t) for t in probes)
    for t, got in zip(probes, times, strict=True):
        assert got == next((o for o, ts in records if ts >= t), None), t
    return (end, log.segment_bases, reads, times)


def build(env: Env) -> tuple[list[int], list[tuple[int, int]], Answers]:
    """A log of several segments, closed cleanly: every segment has its indexes."""
    log = PartitionLog.open(env.fs, env.directory, CONFIG)
    records = fill(log, 45, seed=1)
    bases = log.segment_bases
    assert len(bases) >= 4
    before = answers(log, records)
    log.close()
    for b in bases:
        assert env.fs.exists(env.path(b, ".index"))
        assert env.fs.exists(env.path(b, ".timeindex"))
    return bases, records, before


Damage = Callable[[Env, list[int], int], None]


def _overwrite(env: Env, base: int, suffix: str, seed: int) -> None:
    data = bytearray(env.read(base, suffix))
    rng = random.Random(seed)
    for _ in range(3):
        i = rng.randrange(len(data))
        data[i] ^= rng.randrange(1, 256)
    env.write(base, suffix, bytes(data))


def _remove(env: Env, base: int, suffixes: tuple[str, ...]) -> None:
    for s in suffixes:
        env.remove(base, s)


def _swap(env: Env, a: int, b: int, suffixes: tuple[str, ...]) -> None:
    for s in suffixes:
        da, db = env.read(a, s), env.read(b, s)
        env.write(a, s, db)
        env.write(b, s, da)


def _other(bases: list[int], i: int) -> int:
    return bases[i - 1] if i else bases[1]


DAMAGES: dict[str, Damage] = {
    "delete-index": lambda e, bs, i: e.remove(bs[i], ".index"),
    "delete-timeindex": lambda e, bs, i: e.remove(bs[i], ".timeindex"),
    "delete-both": lambda e, bs, i: _remove(e, bs[i], (".index", ".timeindex")),
    "truncate-index-empty": lambda e, bs, i: e.write(bs[i], ".index", b""),
    "truncate-index-header": lambda e, bs, i: e.write(
        bs[i], ".index", e.read(bs[i], ".index")[:47]
    ),
    "truncate-index-entry": lambda e, bs, i: e.write(bs[i], ".index", e.read(bs[i], ".index")[:-8]),
    "truncate-timeindex": lambda e, bs, i: e.write(
        bs[i], ".timeindex", e.read(bs[i], ".timeindex")[:-1]
    ),
    "overwrite-index": lambda e, bs, i: _overwrite(e, bs[i], ".index", i),
    "overwrite-timeindex": lambda e, bs, i: _overwrite(e, bs[i], ".timeindex", i + 100),
    "garbage-after-index": lambda e, bs, i: e.write(
        bs[i], ".index", e.read(bs[i], ".index") + random.Random(i).randbytes(24)
    ),
    "garbage-after-timeindex": lambda e, bs, i: e.write(
        bs[i], ".timeindex", e.read(bs[i], ".timeindex") + random.Random(i).randbytes(12)
    ),
    "swap-index": lambda e, bs, i: _swap(e, bs[i], _other(bs, i), (".index",)),
    "swap-both": lambda e, bs, i: _swap(e, bs[i], _other(bs, i), (".index", ".timeindex")),
    "index-as-timeindex": lambda e, bs, i: e.write(bs[i], ".timeindex", e.read(bs[i], ".index")),
}
SWAPS = {"swap-index", "swap-both"}


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("where", ["first", "middle", "active"])
@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_damaged_indexes_are_rebuilt(env: Env, kind: str, where: str, clean: bool) -> None:
    bases, records, before = build(env)
    i = {"first": 0, "middle": len(bases) // 2, "active": len(bases) - 1}[where]
    DAMAGES[kind](env, bases, i)
    damaged = {i, bases.index(_other(bases, i))} if kind in SWAPS else {i}
    scanned = damaged | ({len(bases) - 1} if not clean else set())
    log = PartitionLog.open(env.fs, env.directory, CONFIG, clean=clean)
    r = log.report
    assert r.scanned_segments == len(scanned), r
    assert r.rebuilt_indexes == [
        env.path(bases[j], ".index")
        for j in sorted(scanned)
        if env.fs.exists(env.path(bases[j], ".index"))
    ]
    assert (r.truncated_bytes, r.corruption, log.corruption) == (0, None, None)
    assert answers(log, records) == before
    log.close()
    # the close persisted fresh indexes: the next clean open trusts every segment
    log = PartitionLog.open(env.fs, env.directory, CONFIG, clean=True)
    assert log.report.scanned_segments == 0, log.report
    assert answers(log, records) == before
    log.close()


def test_every_index_gone_at_once(env: Env) -> None:
    bases, records, before = build(env)
    for b in bases:
        env.remove(b, ".index")
        env.remove(b, ".timeindex")
    for clean in (True, False):
        log = PartitionLog.open(env.fs, env.directory, CONFIG, clean=clean)
        assert log.report.scanned_segments == len(bases)
        assert answers(log, records) == before
        log.abandon()


def test_stale_indexes_from_an_earlier_close_are_rebuilt(env: Env) -> None:
    """The active segment's indexes from a clean close, put back after more appends: they
    describe a shorter ``.log``, so they are not trusted, even after a clean close."""
    log = PartitionLog.open(env.fs, env.directory, CONFIG)
    records = fill(log, 10, seed=2)
    active = log.segment_bases[-1]
    log.close()
    stale = {s: env.read(active, s) for s in (".index", ".timeindex")}
    log = PartitionLog.open(env.fs, env.directory, CONFIG, clean=True)
    records += fill(log, 2, seed=3)
    assert log.segment_bases[-1] == active
    before = answers(log, records)
    log.close()
    for s, data in stale.items():
        env.write(active, s, data)
    for clean in (True, False):
        log = PartitionLog.open(env.fs, env.directory, CONFIG, clean=clean)
        assert env.path(active, ".index") in log.report.rebuilt_indexes
        assert answers(log, records) == before
        log.abandon()


def test_indexes_written_at_roll_are_trusted_after_a_crash(env: Env) -> None:
    """Sealed segments get their indexes at the flush after the roll; after a crash only the
    active segment is scanned."""
    log = PartitionLog.open(env.fs, env.directory, CONFIG)
    records = fill(log, 40, seed=4)
    log.flush()
    before = answers(log, records)
    bases = log.segment_bases
    log.abandon()
    for b in bases[:-1]:
        assert env.fs.exists(env.path(b, ".index"))
    log = PartitionLog.open(env.fs, env.directory, CONFIG)
    assert log.report.scanned_segments == 1
    assert answers(log, records) == before
    log.close()


def test_orphan_and_temporary_files_are_removed(env: Env) -> None:
    bases, records, before = build(env)
    gone = 10**9
    env.write(gone, ".index", env.read(bases[0], ".index"))
    env.write(gone, ".timeindex", b"x")
    env.fs.open(env.path(bases[1], ".index.tmp")).close()
    log = PartitionLog.open(env.fs, env.directory, CONFIG, clean=True)
    assert sorted(log.report.removed_files) == sorted(
        [f"{gone:020d}.index", f"{gone:020d}.timeindex", f"{bases[1]:020d}.index.tmp"]
    )
    names = env.fs.listdir(env.directory)
    assert not any(n.startswith(f"{gone:020d}") or n.endswith(".tmp") for n in names)
    assert answers(log, records) == before
    log.close()
