"""Injected I/O errors: EIO and ENOSPC on writes, fsyncs, segment creation, directory syncs and
reads, and backpressure on the group commit.

The rules under test (``tidewire.storage.log``): a failed *write* raises ``StorageError``
naming the error, leaves the log as it was (the file is truncated back) and the log stays
usable once the fault is gone. A failed *fsync* fails every append of its group commit — none
of them is acknowledged — and the log then refuses writes (``LogFailedError``): a failed fsync
is never retried as if it had worked. Either way what was acknowledged before stays readable
and survives a power cut. A failed *read* raises ``StorageError`` and is never mistaken for
corruption or a torn tail.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Sequence

import pytest

from tests.storage.history import (
    History,
    SteppedExecutor,
    check_recovered,
    install_executor,
    make_batch,
    read_all,
    record_appends,
)
from tidewire.errors import (
    BackpressureError,
    LogFailedError,
    StorageError,
    TidewireError,
)
from tidewire.storage import (
    AppendInfo,
    FaultFS,
    FileHandle,
    FsyncPolicy,
    LogConfig,
    LogManager,
    PartitionLog,
)
from tidewire.storage.fs import Buffer, FileHandleWrapper, FileSystemWrapper

DIR = "/p"
ERRNOS = pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
SMALL = {"segment_bytes": 1024, "index_interval_bytes": 64}


def config(policy: FsyncPolicy = FsyncPolicy.ALWAYS, **kw: int) -> LogConfig:
    return LogConfig(fsync=policy, **{**SMALL, **kw})


def batch(tag: str, size: int = 40) -> bytes:
    return make_batch([tag.encode() + b"." * size])


def values(log: PartitionLog) -> list[bytes]:
    return [v for _, v in read_all(log)]


def state(fs: FaultFS, log: PartitionLog) -> tuple[object, ...]:
    """Everything a failed operation must leave as it was."""
    files = {p: fs.contents(p) for p in fs.files() if p.endswith(".log")}
    return (
        log.log_start_offset,
        log.log_end_offset,
        log.flushed_offset,
        log.size_bytes,
        log.segment_bases,
        files,
    )


def assert_names(exc: BaseException, code: int) -> None:
    """The error says what failed: the errno's text in the message, the errno on the cause."""
    assert isinstance(exc, StorageError), repr(exc)
    assert os.strerror(code) in str(exc), str(exc)
    cause = exc.__cause__
    while isinstance(cause, StorageError):  # wrapped, as the manager wraps a log's error
        cause = cause.__cause__
    if cause is not None:  # a group's waiters share the error raised where the fsync failed
        assert isinstance(cause, OSError)
        assert cause.errno == code


def reopen_after_power_cut(fs: FaultFS, history: History, durable_end: int) -> PartitionLog:
    """Cut power in every mode, reopen, and check nothing promised durable was lost."""
    survivors = [fs.power_cut(mode=mode) for mode in ("lose", "torn", "garbage")]
    for survivor in survivors:
        log = PartitionLog.open(survivor, DIR, config())
        problems = check_recovered(history, read_all(log), durable_end=durable_end)
        assert not problems, "\n".join(problems)
        assert log.corruption is None
    return PartitionLog.open(survivors[0], DIR, config())


# --- test doubles -------------------------------------------------------------------------------


class FlakyFS(FileSystemWrapper):
    """A :class:`FaultFS` behind a file-system wrapper adding what FaultFS does not model:
    failing reads, short writes (part of the bytes land, then ENOSPC), and fsyncs that wait
    on a gate (so a group commit can be held in flight)."""

    def __init__(self, inner: FaultFS) -> None:
        super().__init__(inner)
        self.read_errno: int | None = None  # every pread / read_file fails with it...
        self.read_prefix = ""  # ...of a path that starts with this
        self.open_handles = 0  # handles opened and not closed
        self.short_write = False  # the next write lands half its bytes, then ENOSPC
        self.gate: threading.Event | None = None  # syncs wait for it to be set
        self.sync_errno_once: int | None = None  # the next file sync fails with it
        self.in_sync = threading.Event()

    def _read_fault(self, path: str) -> None:
        if self.read_errno is not None and path.startswith(self.read_prefix):
            raise OSError(self.read_errno, os.strerror(self.read_errno), path)

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        handle = _FlakyFile(self, self.inner.open(path, create=create))
        self.open_handles += 1
        return handle

    def read_file(self, path: str) -> bytes:
        self._read_fault(path)
        return self.inner.read_file(path)


class _FlakyFile(FileHandleWrapper):
    def __init__(self, fs: FlakyFS, inner: FileHandle) -> None:
        super().__init__(inner)
        self._fs = fs

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        if self._fs.short_write:
            self._fs.short_write = False
            data = b"".join(bytes(b) for b in buffers)
            self.inner.pwritev([data[: len(data) // 2]], offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        return self.inner.pwritev(buffers, offset)

    def pread(self, size: int, offset: int) -> bytes:
        self._fs._read_fault(self.path)
        return self.inner.pread(size, offset)

    def sync(self) -> None:
        code, self._fs.sync_errno_once = self._fs.sync_errno_once, None
        if code is not None:
            raise OSError(code, os.strerror(code), self.path)
        gate = self._fs.gate
        if gate is not None:
            self._fs.in_sync.set()
            assert gate.wait(timeout=10), "the test never opened the gate"
        self.inner.sync()

    def close(self) -> None:
        self._fs.open_handles -= 1
        self.inner.close()


def open_log(
    fs: FaultFS | FlakyFS, policy: FsyncPolicy = FsyncPolicy.ALWAYS, **kw: int
) -> tuple[PartitionLog, History]:
    log = PartitionLog.open(fs, DIR, config(policy, **kw))
    history = History()
    record_appends(log, history)
    return log, history


def acked_append(log: PartitionLog, history: History, b: bytes) -> None:
    """Append and flush synchronously; count it acknowledged."""
    info = log.append(b)
    log.flush()
    history.acked.add(info.base_offset)


# --- (a) a failed write -------------------------------------------------------------------------


@ERRNOS
@pytest.mark.parametrize("how", ["once", "until removed"])
def test_failed_write_changes_nothing_and_the_log_stays_writable(code: int, how: str) -> None:
    fs = FaultFS()
    log, history = open_log(fs)
    for i in range(3):
        acked_append(log, history, batch(f"ok{i}"))
    before = state(fs, log)
    if how == "once":
        fs.failures = {fs.ops + 1: code}  # the next operation: the append's write
    else:
        fs.fail_kinds = {"write": code}
    attempts = 1 if how == "once" else 3
    for _ in range(attempts):
        with pytest.raises(StorageError) as caught:
            log.append(batch("refused"))
        assert_names(caught.value, code)
        assert "write of a" in str(caught.value)
        assert f"{DIR}/00000000000000000000.log" in str(caught.value)
        assert state(fs, log) == before
        assert log.failed is None
        assert values(log) == [b"ok%d" % i + b"." * 40 for i in range(3)]
    fs.fail_kinds = {}
    assert log.append(batch("after")).base_offset == 3
    log.flush()
    assert values(log)[-1] == b"after" + b"." * 40
    history.acked.add(3)
    reopen_after_power_cut(fs, history, durable_end=4)


@ERRNOS
def test_failed_write_under_append_async_is_not_acknowledged(code: int) -> None:
    fs = FaultFS()
    log, history = open_log(fs)

    async def main() -> None:
        await log.append_async(batch("first"))
        fs.fail_kinds = {"write": code}
        with pytest.raises(StorageError) as caught:
            await log.append_async(batch("refused"))
        assert_names(caught.value, code)
        fs.fail_kinds = {}
        info = await log.append_async(batch("second"))
        assert info.base_offset == 1
        assert log.flushed_offset == 2

    asyncio.run(main())
    history.acked.update({0, 1})
    assert [p for _, (p,) in history.written] == [b"first" + b"." * 40, b"second" + b"." * 40]
    reopen_after_power_cut(fs, history, durable_end=2)


class _SecondSegmentFails(FileSystemWrapper):
    """Every write to a ``.log`` other than the first segment's fails with ``code``; writes are
    counted per file."""

    def __init__(self, inner: FaultFS, code: int) -> None:
        super().__init__(inner)
        self.code: int | None = code
        self.writes: dict[str, int] = {}

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        return _CountedFile(self, self.inner.open(path, create=create))


class _CountedFile(FileHandleWrapper):
    def __init__(self, fs: _SecondSegmentFails, inner: FileHandle) -> None:
        super().__init__(inner)
        self._fs = fs

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        name = os.path.basename(self.path)
        if name.endswith(".log"):
            self._fs.writes[name] = self._fs.writes.get(name, 0) + 1
            if self._fs.code is not None and name != "00000000000000000000.log":
                raise OSError(self._fs.code, os.strerror(self._fs.code), self.path)
        return self.inner.pwritev(buffers, offset)


@ERRNOS
@pytest.mark.parametrize("policy", [FsyncPolicy.NEVER, FsyncPolicy.ALWAYS])
def test_failed_gathered_write_after_a_roll_undoes_only_the_new_segment(
    code: int, policy: FsyncPolicy
) -> None:
    """Appends gathered in one turn that roll: the batches of the first segment go out in one
    pwritev and are acknowledged; the new segment's pwritev fails, and every batch in it fails
    with the log rolled back to the end of the first segment (the new segment removed)."""
    inner = FaultFS()
    fs = _SecondSegmentFails(inner, code)
    log, history = open_log(fs, policy)
    tags = [f"g{i:02d}" for i in range(20)]

    async def main() -> list[object]:
        return await asyncio.gather(
            *(log.append_async(batch(t)) for t in tags), return_exceptions=True
        )

    results = asyncio.run(main())
    done = [r for r in results if isinstance(r, AppendInfo)]
    failed = [r for r in results if isinstance(r, BaseException)]
    assert done, "the first segment takes some of the appends"
    assert failed, "the appends must fill the first segment and roll"
    assert results[: len(done)] == done, "acknowledged appends are the first ones, in order"
    assert [i.base_offset for i in done] == list(range(len(done)))
    for exc in failed:
        assert_names(exc, code)
    assert fs.writes == {
        "00000000000000000000.log": 1,
        f"{len(done):020d}.log": 1,
    }, "one pwritev per segment"
    assert log.log_end_offset == len(done)
    assert log.segment_bases == [0]
    assert f"{DIR}/{len(done):020d}.log" not in inner.files()
    assert values(log) == [t.encode() + b"." * 40 for t in tags[: len(done)]]
    fs.code = None
    info = asyncio.run(log.append_async(batch("after")))
    assert info.base_offset == len(done)
    log.flush()
    history.acked.update(range(len(done) + 1))
    assert values(log)[-1] == b"after" + b"." * 40
    reopen_after_power_cut(inner, history, durable_end=len(done) + 1)


def test_short_write_is_truncated_back() -> None:
    """Half the batch reached the file before ENOSPC: the tail is cut off again, so the next
    append does not land behind a torn batch."""
    inner = FaultFS()
    fs = FlakyFS(inner)
    log, history = open_log(fs)
    acked_append(log, history, batch("ok"))
    size = log.size_bytes
    fs.short_write = True
    with pytest.raises(StorageError) as caught:
        log.append(batch("half", 200))
    assert_names(caught.value, errno.ENOSPC)
    assert len(inner.contents(f"{DIR}/00000000000000000000.log")) == size
    acked_append(log, history, batch("next"))
    assert values(log) == [b"ok" + b"." * 40, b"next" + b"." * 40]
    log.abandon()
    # A restart without power loss: the file as the process left it.
    again = PartitionLog.open(inner, DIR, config())
    assert again.report.truncated_bytes == 0
    assert values(again) == [b"ok" + b"." * 40, b"next" + b"." * 40]


def test_short_write_whose_truncation_fails_stops_the_log() -> None:
    """If the file cannot be truncated back, the log must not append behind the torn bytes:
    it refuses writes, keeps serving, and the next open cuts the torn tail."""
    inner = FaultFS()
    fs = FlakyFS(inner)
    log, history = open_log(fs)
    acked_append(log, history, batch("ok"))
    fs.short_write = True
    inner.fail_kinds = {"truncate": errno.EIO}
    with pytest.raises(StorageError):
        log.append(batch("half", 200))
    inner.fail_kinds = {}
    assert log.failed is not None
    with pytest.raises(LogFailedError) as caught:
        log.append(batch("refused"))
    # Both failures are named: the write's and the truncation's.
    assert os.strerror(errno.ENOSPC) in str(caught.value)
    assert os.strerror(errno.EIO) in str(caught.value)
    assert values(log) == [b"ok" + b"." * 40]
    log.abandon()
    again = PartitionLog.open(inner, DIR, config())
    assert again.report.truncated_bytes > 0
    assert again.report.truncated_from_offset == 1
    assert again.corruption is None
    assert values(again) == [b"ok" + b"." * 40]
    assert again.append(batch("after")).base_offset == 1


# --- (b) a failed fsync -------------------------------------------------------------------------


@ERRNOS
@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "threads"])
@pytest.mark.parametrize("how", ["until removed", "once"])
def test_failed_fsync_fails_the_whole_group(code: int, threaded: bool, how: str) -> None:
    """``once``: only that fsync fails; a second one would succeed, and must not be tried as
    if it made the group durable (the kernel may have dropped the dirty pages)."""
    inner = FaultFS()
    fs = FlakyFS(inner)
    log, history = open_log(fs)
    results: dict[str, BaseException | None] = {}

    async def append(tag: str, pause: int = 0) -> None:
        for _ in range(pause):
            await asyncio.sleep(0)
        try:
            info = await log.append_async(batch(tag))
        except TidewireError as exc:
            results[tag] = exc
        else:
            results[tag] = None
            history.acked.add(info.base_offset)

    async def main() -> None:
        if not threaded:
            install_executor(SteppedExecutor())
        async with asyncio.TaskGroup() as tg:  # one group commit, acknowledged
            for i in range(3):
                tg.create_task(append(f"acked{i}"))
        assert log.flushed_offset == 3
        if how == "once":
            fs.sync_errno_once = code
        else:
            inner.fail_kinds = {"sync": code}
        async with asyncio.TaskGroup() as tg:
            for i in range(4):
                tg.create_task(append(f"group{i}"))
            # One more appended while the failing group commit is in flight: it must fail too.
            tg.create_task(append("late", pause=1))
        inner.fail_kinds = {}
        # Never retried as if it had worked: the fault is gone, the log still refuses.
        with pytest.raises(StorageError):
            await log.flush_async()
        with pytest.raises(LogFailedError) as refused:
            await log.append_async(batch("after"))
        assert "accepts no writes after a storage failure" in str(refused.value)
        assert os.strerror(code) in str(refused.value)

    asyncio.run(main())
    assert all(results[f"acked{i}"] is None for i in range(3))
    for tag in [f"group{i}" for i in range(4)]:
        exc = results[tag]
        assert exc is not None, f"{tag} was acknowledged though its fsync failed"
        assert_names(exc, code)
    assert isinstance(results["late"], StorageError | LogFailedError)
    assert log.flushed_offset == 3
    assert isinstance(log.failed, StorageError)
    with pytest.raises(LogFailedError):
        log.append(batch("sync append"))
    with pytest.raises(StorageError):
        log.flush()
    assert log.flushed_offset == 3
    # What was acknowledged is still served.
    assert values(log)[:3] == [b"acked%d" % i + b"." * 40 for i in range(3)]
    log.close()  # skips the flush of a failed log
    reopen_after_power_cut(inner, history, durable_end=3)


def test_failed_interval_flush_stops_the_log_and_marks_the_shutdown_unclean() -> None:
    fs = FaultFS()
    mgr = LogManager("/data", fs=fs, default_config=config(FsyncPolicy.INTERVAL)).open()
    log = mgr.create_log("t", 0)
    history = History()
    record_appends(log, history)

    async def main() -> None:
        install_executor(SteppedExecutor())
        for i in range(3):
            await log.append_async(batch(f"a{i}"))
        assert await mgr.flush_due(0.0) == 0  # starts the interval clock
        assert await mgr.flush_due(1.0) == 1
        assert log.flushed_offset == 3
        await log.append_async(batch("unflushed"))
        fs.fail_kinds = {"sync": errno.EIO}
        assert await mgr.flush_due(2.0) == 1  # the failure is logged, not raised
        fs.fail_kinds = {}
        assert await mgr.flush_due(3.0) == 0  # a failed log is not flushed again
        with pytest.raises(LogFailedError):
            await log.append_async(batch("refused"))

    asyncio.run(main())
    assert log.flushed_offset == 3
    mgr.close()
    assert ".clean-shutdown" not in fs.listdir("/data")
    survivor = fs.power_cut(mode="torn")
    again = LogManager("/data", fs=survivor, default_config=config(FsyncPolicy.INTERVAL)).open()
    assert not again.was_clean
    problems = check_recovered(history, read_all(again.get_log("t", 0)), durable_end=3)
    assert not problems, problems


# --- (c) a roll: segment creation, directory sync, index files ----------------------------------


def fill_until_roll_fails(
    log: PartitionLog, history: History
) -> tuple[StorageError, tuple[object, ...]]:
    """Append (acknowledged) until the append that rolls fails; return its error and the
    state just before it."""
    assert isinstance(log.fs, FaultFS)
    for i in range(100):  # a 1 KiB segment holds a handful of these batches
        before = state(log.fs, log)
        try:
            acked_append(log, history, batch(f"b{i}", 100))
        except StorageError as exc:
            return exc, before
    raise AssertionError("no append rolled")


@ERRNOS
@pytest.mark.parametrize("op", ["create", "truncate"])
def test_failed_segment_creation_changes_nothing(code: int, op: str) -> None:
    fs = FaultFS()
    log, history = open_log(fs)
    fs.fail_kinds = {op: code}
    exc, before = fill_until_roll_fails(log, history)
    assert "cannot create segment" in str(exc)
    assert f"{DIR}/{log.log_end_offset:020d}.log" in str(exc)
    assert_names(exc, code)
    assert log.segment_count == 1
    assert log.failed is None
    assert len(history.written) == log.log_end_offset > 0
    after = state(fs, log)
    # The log is unchanged; at most an empty file of the new segment is left behind.
    assert after[:5] == before[:5]
    stray = {p: b"" for p in fs.files() if p.endswith(f"{log.log_end_offset:020d}.log")}
    assert after[5] == {**before[5], **stray}  # type: ignore[dict-item]
    with pytest.raises(StorageError):  # still failing: the roll is retried, and fails again
        log.append(batch("again", 100))
    fs.fail_kinds = {}
    end = log.log_end_offset
    acked_append(log, history, batch("rolled", 100))
    assert log.segment_bases == [0, end]
    for i in range(10):  # and on, across more rolls
        acked_append(log, history, batch(f"more{i}", 100))
    assert log.segment_count > 2
    assert values(log) == [p for _, (p,) in history.written]
    log.close()
    clean = PartitionLog.open(fs.power_cut(), DIR, config(), clean=True)
    assert clean.report.scanned_segments == 0
    assert values(clean) == [p for _, (p,) in history.written]


@pytest.mark.parametrize("op", ["create", "truncate"])
def test_small_append_after_a_failed_roll(op: str) -> None:
    """After a failed roll, a batch small enough for the old segment comes next. (A failed
    truncate leaves the new segment's file behind, empty: the log must not grow the old
    segment past that file's base offset, or the two overlap at the next open.)"""
    fs = FaultFS()
    log, history = open_log(fs)
    fs.fail_kinds = {op: errno.ENOSPC}
    fill_until_roll_fails(log, history)
    fs.fail_kinds = {}
    acked_append(log, history, make_batch([b"tiny"]))
    for i in range(10):
        acked_append(log, history, batch(f"more{i}", 100))
    log.close()
    survivor = fs.power_cut()
    for clean in (True, False, True):
        again = PartitionLog.open(survivor, DIR, config(), clean=clean)
        assert again.corruption is None, again.corruption
        assert values(again) == [p for _, (p,) in history.written]
        if clean:
            assert again.report.scanned_segments == 0, again.report
        again.close()


BATCHES = [batch(f"b{i}", 100) for i in range(30)]


def rolling_append() -> int:
    """The index of the first append of ``BATCHES`` that rolls a segment."""
    probe = PartitionLog.open(FaultFS(), DIR, config())
    for k, b in enumerate(BATCHES):
        probe.append(b)
        if probe.segment_count > 1:
            return k
    raise AssertionError("no append rolled")


def flush_after_a_roll(
    fs: FaultFS, kind: str, code: int
) -> tuple[PartitionLog, History, dict[str, BaseException | None]]:
    """Append ``BATCHES`` up to the one that rolls (each acknowledged), append that one and one
    more, arm the fault, and wait for their group commit. Returns what each waiter got."""
    log, history = open_log(fs)
    k = rolling_append()
    results: dict[str, BaseException | None] = {}

    async def wait(tag: str, end: int, base: int) -> None:
        try:
            await log.wait_durable(end)
        except TidewireError as exc:
            results[tag] = exc
        else:
            results[tag] = None
            history.acked.add(base)

    async def main() -> None:
        install_executor(SteppedExecutor())
        for b in BATCHES[:k]:
            history.acked.add((await log.append_async(b)).base_offset)
        rolled = log.append(BATCHES[k])
        assert log.segment_count == 2
        other = log.append(BATCHES[k + 1])
        fs.fail_kinds = {kind: code}
        async with asyncio.TaskGroup() as tg:
            tg.create_task(wait("rolled", rolled.last_offset + 1, rolled.base_offset))
            tg.create_task(wait("other", other.last_offset + 1, other.base_offset))
        fs.fail_kinds = {}

    asyncio.run(main())
    return log, history, results


@ERRNOS
def test_failed_directory_sync_after_a_roll_fails_the_group(code: int) -> None:
    """The group commit after a roll syncs the directory, making the new segment's entry
    durable: if that fails, the group fails like a failed fsync."""
    fs = FaultFS()
    log, history, results = flush_after_a_roll(fs, "sync_dir", code)
    for tag in ("rolled", "other"):
        exc = results[tag]
        assert exc is not None, f"{tag} was acknowledged though the directory sync failed"
        assert_names(exc, code)
    with pytest.raises(LogFailedError):
        log.append(batch("refused"))
    acked = history.acked_end()
    assert acked == log.flushed_offset == rolling_append()
    assert values(log)[:acked] == [p for _, (p,) in history.written][:acked]
    reopen_after_power_cut(fs, history, durable_end=acked)


@ERRNOS
@pytest.mark.parametrize("kind", ["create", "write", "rename"])
def test_failed_index_write_after_a_roll_acknowledges_nothing_unsafely(
    code: int, kind: str
) -> None:
    """Writing the sealed segment's index files (temp file, write, rename) fails: whatever
    the log decides, an acknowledged batch is durable and a failed one names the error."""
    fs = FaultFS()
    log, history, results = flush_after_a_roll(fs, kind, code)
    failed = [exc for exc in results.values() if exc is not None]
    for exc in failed:
        assert_names(exc, code)
    if failed:
        assert log.flushed_offset == rolling_append()
    survivor = fs.power_cut(mode="lose")
    again = PartitionLog.open(survivor, DIR, config())
    problems = check_recovered(history, read_all(again), durable_end=history.acked_end())
    assert not problems, problems
    assert again.corruption is None


# --- (d) a failed read --------------------------------------------------------------------------


def test_failed_read_raises_storage_error_and_is_not_corruption() -> None:
    inner = FaultFS()
    fs = FlakyFS(inner)
    log, history = open_log(fs)
    for i in range(12):
        acked_append(log, history, batch(f"r{i}", 100))
    assert log.segment_count > 1
    expected = values(log)
    fs.read_errno = errno.EIO
    for offset in (0, log.log_end_offset - 1):
        with pytest.raises(StorageError) as caught:
            log.read(offset)
        assert_names(caught.value, errno.EIO)
        assert "read of" in str(caught.value)
    with pytest.raises(StorageError):
        log.offset_for_timestamp(0)
    # Writes need no reads: the log takes them while reads fail.
    acked_append(log, history, batch("written while reads fail"))
    fs.read_errno = None
    assert log.corruption is None
    assert log.failed is None
    assert values(log) == [*expected, b"written while reads fail" + b"." * 40]


@pytest.mark.parametrize("clean", [False, True], ids=["after a crash", "after a clean close"])
def test_failed_read_during_recovery_fails_the_open_and_cuts_nothing(clean: bool) -> None:
    inner = FaultFS()
    log = PartitionLog.open(inner, "/data/t-0", config())
    history = History()
    record_appends(log, history)
    for i in range(12):
        acked_append(log, history, batch(f"r{i}", 100))
    if clean:
        log.close()
    else:
        log.abandon()
    files = {p: inner.contents(p) for p in inner.files()}
    fs = FlakyFS(inner)
    fs.read_errno = errno.EIO
    with pytest.raises(StorageError) as caught:
        PartitionLog.open(fs, "/data/t-0", config(), clean=clean)
    assert_names(caught.value, errno.EIO)
    assert "cannot open log /data/t-0" in str(caught.value)
    assert {p: inner.contents(p) for p in inner.files()} == files, "a failed open changed files"
    with pytest.raises(StorageError) as caught:
        LogManager("/data", fs=fs, default_config=config()).open()
    assert_names(caught.value, errno.EIO)
    assert "/data/t-0" in str(caught.value)
    fs.read_errno = None
    again = PartitionLog.open(fs, "/data/t-0", config(), clean=clean)
    assert again.report.truncated_bytes == 0
    assert values(again) == [p for _, (p,) in history.written]


def test_failed_log_open_closes_the_logs_the_manager_opened_before() -> None:
    inner = FaultFS()
    mgr = LogManager("/data", fs=inner, default_config=config()).open()
    for topic in ("a", "b"):
        _fill = mgr.create_log(topic, 0)
        _fill.append(batch(topic))
    mgr.close()
    fs = FlakyFS(inner)
    fs.read_errno = errno.EIO
    fs.read_prefix = "/data/b-0/0000"  # "a" opens, then "b"'s segment cannot be read
    failing = LogManager("/data", fs=fs, default_config=config())
    with pytest.raises(StorageError) as caught:
        failing.open()
    assert_names(caught.value, errno.EIO)
    assert "/data/b-0" in str(caught.value)
    assert fs.open_handles == 0, "the logs opened before the failure were left open"
    fs.read_errno = None
    again = LogManager("/data", fs=fs, default_config=config()).open()
    assert again.was_clean
    assert [values(again.get_log(t, 0)) for t in ("a", "b")] == [
        [b"a" + b"." * 40],
        [b"b" + b"." * 40],
    ]
    again.close()
    assert fs.open_handles == 0


@ERRNOS
def test_failed_create_log_leaves_nothing_open_and_can_be_retried(code: int) -> None:
    """The last step of create_log (the data directory's sync) fails: no handle stays open,
    the log is not registered, and creating it again works."""
    probe = LogManager("/data", fs=FaultFS(), default_config=config()).open()
    start = probe.fs.ops  # type: ignore[attr-defined]
    probe.create_log("t", 0)
    steps = probe.fs.ops - start  # type: ignore[attr-defined]
    inner = FaultFS()
    fs = FlakyFS(inner)
    mgr = LogManager("/data", fs=fs, default_config=config()).open()
    inner.failures = {inner.ops + steps: code}
    with pytest.raises(StorageError) as caught:
        mgr.create_log("t", 0)
    assert_names(caught.value, code)
    assert "cannot create partition 0 of topic 't'" in str(caught.value)
    assert fs.open_handles == 0, "the half-created log was left open"
    assert mgr.topics() == {}
    log = mgr.create_log("t", 0)
    log.append(batch("x"))
    mgr.close()
    assert fs.open_handles == 0
    again = LogManager("/data", fs=inner.power_cut(), default_config=config()).open()
    assert values(again.get_log("t", 0)) == [b"x" + b"." * 40]


# --- backpressure -------------------------------------------------------------------------------


def test_backpressure_when_max_pending_appends_await_an_fsync() -> None:
    inner = FaultFS()
    fs = FlakyFS(inner)
    log, _ = open_log(fs, max_pending_appends=2)
    fs.gate = threading.Event()

    async def main() -> None:
        first = asyncio.create_task(log.append_async(batch("p0")))
        # The group commit is now held in its fsync, in a worker thread.
        assert await asyncio.to_thread(fs.in_sync.wait, 30)
        second = asyncio.create_task(log.append_async(batch("p1")))
        await asyncio.sleep(0)  # it appends and waits for the next group commit
        assert log.log_end_offset == 2
        size = len(inner.contents(f"{DIR}/00000000000000000000.log"))
        with pytest.raises(BackpressureError) as caught:
            await log.append_async(batch("refused"))
        assert "max_pending_appends=2" in str(caught.value)
        assert caught.value.retriable
        # Nothing of the refused batch was written.
        assert log.log_end_offset == 2
        assert len(inner.contents(f"{DIR}/00000000000000000000.log")) == size
        assert fs.gate is not None
        fs.gate.set()
        assert [i.base_offset for i in await asyncio.gather(first, second)] == [0, 1]
        # The queue drained: appends are taken again.
        assert (await log.append_async(batch("p2"))).base_offset == 2

    asyncio.run(main())
    assert values(log) == [b"p%d" % i + b"." * 40 for i in range(3)]
