"""Zeros written ahead of a busy ``always`` partition's appends (``preallocate_bytes``): when
they are written and when not, that reads and recovery never take them for batches, that a
sealed segment and a clean shutdown leave no zeros behind, and that a failure on the way is
either harmless (writing the zeros) or fails the flush (cutting them)."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Sequence

import pytest

from tests.storage.history import make_batch, read_all
from tidewire.broker import Broker, BrokerConfig
from tidewire.errors import InvalidConfigError, StorageError
from tidewire.storage import (
    FaultFS,
    FileHandle,
    FsyncPolicy,
    LogConfig,
    LogManager,
    OsFileSystem,
    PartitionLog,
)
from tidewire.storage import log as log_module
from tidewire.storage.fs import Buffer, FileHandleWrapper, FileSystemWrapper

DIR = "/p"
AHEAD = 8192
ALWAYS = LogConfig(fsync=FsyncPolicy.ALWAYS)


def _open(fs: object, config: LogConfig = ALWAYS, **kw: object) -> PartitionLog:
    log = PartitionLog.open(fs, DIR, config, **kw)  # type: ignore[arg-type]
    log.preallocate_bytes = AHEAD
    return log


def _durable_appends(log: PartitionLog, n: int, *, start: int = 0) -> None:
    """``n`` appends, each flushed on its own: ``n`` small fsyncs."""
    for i in range(start, start + n):
        log.append(make_batch([f"m{i}".encode() * 10]))
        log.flush()


def _active_file_size(fs: FaultFS, log: PartitionLog) -> int:
    return len(fs.contents(f"{DIR}/{log.active_segment_base:020d}.log"))


def test_zeros_come_after_the_eighth_small_fsync_and_appends_fill_them() -> None:
    fs = FaultFS()
    log = _open(fs)
    _durable_appends(log, log_module.PREALLOCATE_AFTER_SYNCS - 1)
    assert _active_file_size(fs, log) == log.size_bytes  # not yet
    _durable_appends(log, 1, start=7)
    grown = _active_file_size(fs, log)
    assert grown == log.size_bytes + AHEAD  # zeros from the end of the last batch
    path = f"{DIR}/{log.active_segment_base:020d}.log"
    assert fs.contents(path)[log.size_bytes :] == bytes(AHEAD)
    # The next appends land on the zeros and leave the file's size alone...
    _durable_appends(log, 5, start=8)
    assert _active_file_size(fs, log) == grown
    # ...and every read stops at the last batch.
    assert [v for _, v in read_all(log)] == [f"m{i}".encode() * 10 for i in range(13)]
    # Once less than a quarter is left, more zeros come, from the end of the earlier ones.
    while _active_file_size(fs, log) == grown:
        _durable_appends(log, 1, start=log.log_end_offset)
    assert grown < _active_file_size(fs, log) <= grown + AHEAD
    assert _active_file_size(fs, log) - log.size_bytes >= AHEAD * 3 // 4
    log.close()


@pytest.mark.parametrize(
    "config",
    [
        (LogConfig(fsync=FsyncPolicy.ALWAYS), 0),
        (LogConfig(fsync=FsyncPolicy.INTERVAL), AHEAD),
        (LogConfig(fsync=FsyncPolicy.NEVER), AHEAD),
    ],
    ids=["off", "interval", "never"],
)
def test_no_zeros_when_off_or_not_always(config: tuple[LogConfig, int]) -> None:
    fs = FaultFS()
    log = _open(fs, config[0])
    log.preallocate_bytes = config[1]
    _durable_appends(log, 20)
    assert _active_file_size(fs, log) == log.size_bytes
    log.close()


def test_no_zeros_for_a_partition_written_now_and_then() -> None:
    """Small fsyncs further apart than PREALLOCATE_WINDOW_MS: 10,000 such partitions must not
    each take preallocate_bytes of disk."""
    now = [1_000_000]
    fs = FaultFS()
    log = _open(fs, clock=lambda: now[0])
    for i in range(3 * log_module.PREALLOCATE_AFTER_SYNCS):
        now[0] += log_module.PREALLOCATE_WINDOW_MS // (log_module.PREALLOCATE_AFTER_SYNCS - 2)
        _durable_appends(log, 1, start=i)
    assert _active_file_size(fs, log) == log.size_bytes
    log.close()


def test_no_zeros_for_large_fsyncs() -> None:
    """Group commit under load: each fsync covers more than PREALLOCATE_SMALL_SYNC; zeros
    would double what the disk writes."""
    fs = FaultFS()
    log = _open(fs)
    big = b"x" * (log_module.PREALLOCATE_SMALL_SYNC + 1)
    for _ in range(log_module.PREALLOCATE_AFTER_SYNCS + 4):
        log.append(make_batch([big]))
        log.flush()
    assert _active_file_size(fs, log) == log.size_bytes
    log.close()


def test_a_clean_close_cuts_the_zeros_and_a_clean_open_trusts_the_indexes() -> None:
    fs = FaultFS()
    log = _open(fs)
    _durable_appends(log, 12)
    assert _active_file_size(fs, log) > log.size_bytes
    end, size = log.log_end_offset, log.size_bytes
    log.close()
    assert _active_file_size(fs, log) == size
    again = PartitionLog.open(fs, DIR, ALWAYS, clean=True)
    assert again.report.scanned_segments == 0
    assert (again.log_end_offset, again.size_bytes) == (end, size)
    again.close()


def test_a_rolled_segment_is_cut_back_to_its_batches_and_synced() -> None:
    fs = FaultFS()
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=2048)
    log = _open(fs, config)
    _durable_appends(log, 40)  # several segments, each with zeros ahead before it rolled
    log.close()
    bases = sorted(p for p in fs.files() if p.endswith(".log"))
    assert len(bases) >= 3
    # A power cut now keeps only synced bytes: every sealed segment's durable size is exactly
    # its batches (the cut was synced), so the persisted indexes describe it.
    survivor = fs.power_cut(mode="lose")
    for path in bases:
        assert not survivor.contents(path).endswith(b"\0" * 64), path
    again = PartitionLog.open(survivor, DIR, config, clean=True)
    assert again.report.scanned_segments == 0
    assert len(read_all(again)) == 40
    again.close()


def test_a_crash_with_zeros_ahead_cuts_them_as_zeros_and_takes_appends() -> None:
    fs = FaultFS()
    log = _open(fs)
    _durable_appends(log, 12)
    end = log.log_end_offset
    ahead = _active_file_size(fs, log) - log.size_bytes
    assert ahead > AHEAD // 2
    log.abandon()  # a crash: no clean close, the zeros stay
    survivor = fs.power_cut(mode="lose")
    again = PartitionLog.open(survivor, DIR, ALWAYS, clean=False, recovery_point=end)
    report = again.report
    assert again.log_end_offset == end
    assert report.truncated_bytes == ahead
    assert report.truncated_from_offset == end
    assert report.truncated_batches_seen == 0
    assert report.truncated_zero_bytes == ahead
    assert again.corruption is None
    assert again.append(make_batch([b"after"])).base_offset == end
    again.flush()
    assert read_all(again)[-1] == (end, b"after")
    again.close()


def test_a_crash_names_a_tail_of_zeros_and_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tidewire.storage")
    fs = FaultFS()
    log = _open(fs)
    _durable_appends(log, 12)
    log.abandon()
    PartitionLog.open(fs.power_cut(mode="lose"), DIR, ALWAYS, clean=False).close()
    cuts = [r for r in caplog.records if "cut" in r.getMessage()]
    assert [r.levelno for r in cuts] == [logging.INFO]
    assert "bytes of zeros after its last batch (offset 12)" in cuts[0].getMessage()


def test_a_torn_batch_over_zeros_is_still_a_torn_tail(caplog: pytest.LogCaptureFixture) -> None:
    """Half a batch written over the zeros: a torn tail, warned of, not counted as zeros."""
    fs = FaultFS()
    log = _open(fs)
    _durable_appends(log, 12)
    path = f"{DIR}/{log.active_segment_base:020d}.log"
    size = log.size_bytes
    log.abandon()
    survivor = fs.power_cut(mode="lose")
    data = survivor.contents(path)
    half = make_batch([b"torn" * 50])[:60]
    survivor.set_contents(path, data[:size] + half + data[size + len(half) :])
    again = PartitionLog.open(survivor, DIR, ALWAYS, clean=False)
    assert again.log_end_offset == 12
    assert again.report.truncated_zero_bytes == 0
    assert again.report.truncated_bytes == len(data) - size
    assert "cut a torn tail" in caplog.text
    again.close()


def test_zeros_below_the_recovery_point_are_damage_not_an_end() -> None:
    """Synced batches turned to zeros are lost data, not zeros written ahead: reported as
    damage, never cut silently."""
    fs = FaultFS()
    log = _open(fs)
    _durable_appends(log, 12)
    end = log.log_end_offset
    path = f"{DIR}/{log.active_segment_base:020d}.log"
    log.abandon()
    survivor = fs.power_cut(mode="lose")
    data = survivor.contents(path)
    half = log.size_bytes // 2
    survivor.set_contents(path, data[:half] + bytes(len(data) - half))
    again = PartitionLog.open(survivor, DIR, ALWAYS, clean=False, recovery_point=end)
    assert again.corruption is not None
    assert again.report.truncated_bytes == 0
    again.close()


class _FailWrites(FileSystemWrapper):
    """Fails every write of nothing but zeros (the zeros ahead) with ENOSPC."""

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        return _ZeroWritesFail(self.inner.open(path, create=create))


class _ZeroWritesFail(FileHandleWrapper):
    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        data = b"".join(bytes(b) for b in buffers)
        if len(data) >= AHEAD and not data.strip(b"\0"):
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        return self.inner.pwritev(buffers, offset)


def test_zeros_that_cannot_be_written_cost_nothing(caplog: pytest.LogCaptureFixture) -> None:
    inner = FaultFS()
    log = _open(_FailWrites(inner))
    _durable_appends(log, 30)  # the log stays writable, and does not try again and again
    assert caplog.text.count("writing zeros ahead") == 1
    assert len(read_all(log)) == 30
    assert _active_file_size(inner, log) == log.size_bytes
    log.close()


class _FailCuts(FileSystemWrapper):
    """With ``fail`` set, fails every truncation to a size above 0 (a new segment's file is
    truncated to 0) with EIO."""

    fail = False

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        return _CutFails(self, self.inner.open(path, create=create))


class _CutFails(FileHandleWrapper):
    def __init__(self, fs: _FailCuts, inner: FileHandle) -> None:
        super().__init__(inner)
        self._fs = fs

    def truncate(self, size: int) -> None:
        if self._fs.fail and size > 0:
            raise OSError(errno.EIO, "Input/output error", self.path)
        self.inner.truncate(size)


def test_a_roll_that_cannot_cut_the_zeros_fails_and_the_log_stays_writable() -> None:
    fs = FaultFS()
    wrapper = _FailCuts(fs)
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=2048)
    log = _open(wrapper, config)
    _durable_appends(log, 12)
    assert _active_file_size(fs, log) > log.size_bytes
    end, segments = log.log_end_offset, log.segment_count
    wrapper.fail = True
    big = make_batch([b"y" * 2048])  # rolls
    with pytest.raises(StorageError, match="cutting the zeros past the end of"):
        log.append(big)
    assert (log.log_end_offset, log.segment_count) == (end, segments)
    wrapper.fail = False
    assert log.append(big).base_offset == end
    log.flush()
    assert log.segment_count == segments + 1
    sealed = f"{DIR}/{log.segment_bases[-2]:020d}.log"
    assert not fs.contents(sealed).endswith(bytes(64))
    log.close()


def test_a_close_that_cannot_cut_the_zeros_fails_its_flush() -> None:
    fs = FaultFS()
    wrapper = _FailCuts(fs)
    log = _open(wrapper)
    _durable_appends(log, 12)
    wrapper.fail = True
    with pytest.raises(StorageError, match="cutting the zeros past the end of"):
        log.close()
    # Not taken as sealed: the next open scans the segment and cuts the zeros as zeros.
    again = PartitionLog.open(fs, DIR, ALWAYS, clean=True)
    assert again.log_end_offset == 12
    assert again.report.truncated_batches_seen == 0
    again.close()


def test_rolls_between_flushes_leave_no_zeros_inside_the_log() -> None:
    """Appends not waited durable (acks=leader under ``always``) roll segment after segment
    with no flush between: each roll cuts the zeros at once, so a crash that keeps every
    write (a killed process: the page cache survives) loses none of them."""
    fs = FaultFS()
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=4096)
    log = _open(fs, config)
    _durable_appends(log, 12)
    flushed = log.flushed_offset
    assert _active_file_size(fs, log) > log.size_bytes
    for i in range(200):
        log.append(make_batch([b"leader-%d" % i]))
    assert log.segment_count >= 3
    end = log.log_end_offset
    log.abandon()
    again = _open(fs, config, clean=False, recovery_point=flushed)
    assert again.log_end_offset == end
    assert len(read_all(again)) == end
    assert again.report.truncated_bytes == 0
    again.close()


def test_the_setting_is_the_managers_for_every_log(tmp_path: os.PathLike[str]) -> None:
    data = str(tmp_path)
    mgr = LogManager(data, preallocate_bytes=AHEAD).open()
    created = mgr.create_log("t", 0, LogConfig(fsync=FsyncPolicy.ALWAYS))
    assert created.preallocate_bytes == AHEAD
    stored = json.loads((tmp_path / "t-0" / "log.json").read_text())
    assert not any("prealloc" in k for k in stored)
    mgr.close()
    mgr = LogManager(data, preallocate_bytes=0).open()
    assert mgr.get_log("t", 0).preallocate_bytes == 0
    mgr.close()


def test_the_brokers_setting_reaches_its_logs(tmp_path: os.PathLike[str]) -> None:
    broker = Broker(BrokerConfig(str(tmp_path), preallocate_bytes=0))
    assert broker.logs.preallocate_bytes == 0
    assert Broker(BrokerConfig(str(tmp_path / "b"))).logs.preallocate_bytes == 256 * 1024


def test_zeros_ahead_on_a_real_file_system(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path / "p")
    log = PartitionLog.open(OsFileSystem(), directory, ALWAYS)
    log.preallocate_bytes = AHEAD
    _durable_appends(log, 12)
    path = f"{directory}/{log.active_segment_base:020d}.log"
    size = log.size_bytes
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) > size + AHEAD // 2
    assert not data[size:].strip(b"\0")
    log.close()
    assert os.path.getsize(path) == size


@pytest.mark.parametrize("bad", [-1, 1, 4095, 16 * 1024 * 1024 + 1, True, 4096.0])
def test_out_of_range_settings_are_refused(bad: int, tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(InvalidConfigError, match="preallocate_bytes"):
        LogManager(str(tmp_path), preallocate_bytes=bad)
    with pytest.raises(InvalidConfigError, match="preallocate_bytes"):
        BrokerConfig(str(tmp_path), preallocate_bytes=bad)
