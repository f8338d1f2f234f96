"""A reader at the tail: the next read starts where the last one ended, found without reading
the file, and never where the file no longer holds what that read saw."""

from __future__ import annotations

import errno
import random
from pathlib import Path
from typing import Any

import pytest

from tidewire.errors import TidewireError
from tidewire.records import BatchBuilder, iter_batches
from tidewire.storage import FaultFS, FileSystem, LogConfig, OsFileSystem, PartitionLog

CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128)


def batch(tag: bytes, n: int = 3) -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(tag + b"-%d" % i + b"x" * 40, timestamp_ms=1_700_000_000_000)
    return bytes(b.build())


@pytest.fixture(params=["faultfs", "osfs"])
def fs_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FileSystem, str]:
    if request.param == "faultfs":
        return FaultFS(), "/data/tail-0"
    return OsFileSystem(), str(tmp_path / "tail-0")


class _CountingFile:
    """A segment's file handle that counts its preads."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.preads = 0

    def pread(self, size: int, offset: int) -> bytes:
        self.preads += 1
        return self.inner.pread(size, offset)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def count_preads(log: PartitionLog) -> _CountingFile:
    """Count the preads of the active segment's file from now on."""
    seg = log._segments[-1]
    seg.file = counting = _CountingFile(seg.file)
    return counting


def test_a_read_from_where_the_last_ended_reads_the_file_once(
    fs_dir: tuple[FileSystem, str],
) -> None:
    log = PartitionLog.open(*fs_dir, CONFIG)
    for i in range(20):  # past several index intervals: a lookup would walk from an entry
        log.append(batch(b"a%d" % i))
    first = log.read(0, 1 << 20)
    assert first.next_offset == 60
    log.append(batch(b"b"))
    counting = count_preads(log)
    tail = log.read(first.next_offset, 1 << 20)
    assert counting.preads == 1  # the batches themselves; where they start was known
    log.read(30, 1 << 20)  # anywhere else: looked up and walked as before
    assert counting.preads == 3
    assert (tail.data, tail.next_offset) == whole_batches_from(log, 60)
    log.close()


def whole_batches_from(log: PartitionLog, offset: int) -> tuple[bytes, int]:
    """What a read from ``offset`` must return, found from a read of the whole log: every
    batch from the one holding ``offset`` on, and the offset after them."""
    everything = log.read(log.log_start_offset, 1 << 20)
    assert everything.next_offset == log.log_end_offset
    for pos, h in iter_batches(everything.data):
        if h.last_offset >= offset:
            return bytes(everything.data[pos:]), everything.next_offset
    return b"", offset


@pytest.mark.parametrize("cut", [60, 58, 45])
def test_a_truncated_and_rewritten_tail_is_read_as_it_is_now(
    fs_dir: tuple[FileSystem, str], cut: int
) -> None:
    """A replica's truncation rebuilds the segment: where the read before it ended no longer
    says where a batch starts (the batches written after the cut differ in size)."""
    log = PartitionLog.open(*fs_dir, CONFIG)
    for i in range(20):
        log.append(batch(b"a%d" % i))
    assert log.read(0, 1 << 20).next_offset == 60
    log.truncate_to(cut)
    for i in range(10):
        log.append(batch(b"c%d" % i, n=1 + i % 4))
    assert log.log_end_offset > 61
    got = log.read(60, 1 << 20)
    assert (got.data, got.next_offset) == whole_batches_from(log, 60)
    log.close()


def _outcome(log: PartitionLog, offset: int, max_bytes: int, max_offset: int | None) -> Any:
    try:
        r = log.read(offset, max_bytes, max_offset=max_offset)
    except TidewireError as exc:
        return type(exc).__name__
    return bytes(r.data), r.next_offset


@pytest.mark.parametrize("seed", range(12))
def test_reads_from_where_the_last_ended_match_reads_looked_up(seed: int) -> None:
    """Appends (some failing), reads mostly at the tail, truncations, flipped bits, repairs of
    the damage found, deleted segments and reopens, in a random order: every read returns
    what the same read returns once the segments forget where the last reads ended."""
    rng = random.Random(seed)
    fs = FaultFS()
    config = LogConfig(
        segment_bytes=rng.choice([1500, 4000, 1 << 20]),
        index_interval_bytes=rng.choice([100, 300, 4096]),
    )
    log = PartitionLog.open(fs, "/data/tail-0", config)
    tail = 0
    for step in range(200):
        op = rng.random()
        try:
            if op < 0.35:
                data = batch(b"s%d" % step, n=rng.randint(1, 4))
                if rng.random() < 0.05:
                    fs.fail_kinds["write"] = errno.EIO
                try:
                    log.append(data)
                finally:
                    fs.fail_kinds.pop("write", None)
            elif op < 0.75:
                start, end = log.log_start_offset, log.log_end_offset
                at_tail = rng.random() < 0.7 and start <= tail <= end
                offset = tail if at_tail else rng.randint(start, end)
                max_bytes = rng.choice([50, 200, 700, 1 << 20])
                max_offset = rng.choice([None, None, rng.randint(start, end + 1)])
                got = _outcome(log, offset, max_bytes, max_offset)
                ends = [seg._read_end for seg in log._segments]
                for seg in log._segments:
                    seg._read_end = (-1, -1)
                assert got == _outcome(log, offset, max_bytes, max_offset), (seed, step)
                for seg, read_end in zip(log._segments, ends, strict=True):
                    seg._read_end = read_end
                if isinstance(got, tuple):
                    tail = got[1]
            elif op < 0.82:
                if log.log_end_offset > log.log_start_offset:
                    log.truncate_to(rng.randint(log.log_start_offset, log.log_end_offset))
            elif op < 0.87:
                path = rng.choice([p for p in fs.files() if p.endswith(".log")])
                buf = bytearray(fs.contents(path))
                if buf:
                    buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
                    fs.set_contents(path, bytes(buf))
            elif op < 0.92:
                if log.damage:
                    d = rng.choice(log.damage)
                    if rng.random() < 0.5:
                        log.quarantine(d.start)
                    else:
                        log.truncate_at_damage(d.start)
            elif op < 0.96:
                if len(log.segment_bases) > 1:
                    log.delete_before(log.segment_bases[1])
            else:
                log.close()
                log = PartitionLog.open(fs, "/data/tail-0", config, clean=True)
        except TidewireError:
            pass  # a refused append, a damaged read or repair: the log goes on
    log.close()
