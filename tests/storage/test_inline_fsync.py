"""A lone append's group commit on the event loop's own thread (``INLINE_FSYNC_AFTER``): a
partition written one message at a time, alone, and not read has its fsyncs run on the loop
after a few group commits of one batch each; two batches in a commit, a read, a roll, zeros
written ahead, another partition committing, a slow fsync, a busy flusher thread or a
stand-in executor send them back to the flusher threads. Either way an append returns only
once its fsync is done, and a failed fsync fails it.

The file handles here record the thread of each segment fsync and skip the device (a busy
disk's fsync would otherwise count as slow and make the tests depend on it); a slow fsync is
made by sleeping in it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import threading
import time
from pathlib import Path

import pytest

from tests.storage.history import make_batch, read_all
from tidewire.errors import LogFailedError, StorageError
from tidewire.storage import FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage import log as log_module
from tidewire.storage.flusher import set_flush_executor
from tidewire.storage.fs import FileHandle, FileHandleWrapper, FileSystemWrapper

AFTER = log_module.INLINE_FSYNC_AFTER
#: What counts as a slow fsync in these tests.
SLOW_S = 0.05


@pytest.fixture(autouse=True)
def _settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "INLINE_FSYNC_MAX_S", SLOW_S)
    monkeypatch.setattr(log_module, "_COMMITS", log_module._Commits())


class _Syncs(FileSystemWrapper):
    """Records the thread of each fsync of a segment file and whether it had finished when
    the append that waited for it returned; ``delay_s`` slows each one down, ``gate`` (when
    set) holds each one until it is set, ``fail`` fails each one with EIO."""

    def __init__(self) -> None:
        super().__init__(OsFileSystem())
        self.threads: list[int] = []
        self.done = 0
        self.delay_s = 0.0
        self.gate: threading.Event | None = None
        self.fail = False

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        handle = self.inner.open(path, create=create)
        return _Handle(handle, self) if path.endswith(".log") else handle


class _Handle(FileHandleWrapper):
    def __init__(self, inner: FileHandle, fs: _Syncs) -> None:
        super().__init__(inner)
        self.fs = fs

    def sync(self) -> None:
        fs = self.fs
        fs.threads.append(threading.get_ident())
        if fs.gate is not None:
            assert fs.gate.wait(30), "the gate was never opened"
        if fs.delay_s:
            time.sleep(fs.delay_s)
        if fs.fail:
            raise OSError(errno.EIO, "an I/O error")
        fs.done += 1


def _open(
    path: Path, fs: _Syncs, fsync: FsyncPolicy = FsyncPolicy.ALWAYS, **config: int
) -> PartitionLog:
    log = PartitionLog.open(fs, str(path), LogConfig(fsync=fsync, **config))
    log.preallocate_bytes = 0
    return log


async def _one_at_a_time(log: PartitionLog, fs: _Syncs, n: int) -> list[bool]:
    """``n`` appends, each awaited; for each, whether its fsync ran on the loop's thread.
    Each append's own fsync is done by the time it returns."""
    me = threading.get_ident()
    on_loop = []
    for _ in range(n):
        syncs = len(fs.threads)
        i = log.log_end_offset
        await log.append_async(make_batch([f"m{i}".encode()]))
        assert fs.done == len(fs.threads) > syncs  # its fsync ran, and finished, first
        on_loop.append(fs.threads[-1] == me)
    return on_loop


#: One message at a time from a fresh count: AFTER commits in threads, then on the loop.
LONE = [False] * AFTER + [True]


def test_one_message_at_a_time_moves_onto_the_loop(tmp_path: Path) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        on_loop = await _one_at_a_time(log, fs, AFTER + 5)
        assert on_loop == [False] * AFTER + [True] * 5
        assert log.flushed_offset == AFTER + 5

    asyncio.run(main())
    assert [v for _, v in read_all(log)] == [f"m{i}".encode() for i in range(AFTER + 5)]
    log.close()


def test_two_batches_in_one_commit_go_back_to_the_threads(tmp_path: Path) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        # Two appends in one turn: one group commit of two batches, in a thread.
        await asyncio.gather(
            log.append_async(make_batch([b"a"])), log.append_async(make_batch([b"b"]))
        )
        assert fs.threads[-1] != threading.get_ident()
        # And the count starts again.
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE

    asyncio.run(main())
    log.close()


def test_an_append_while_a_commit_runs_starts_the_count_again(tmp_path: Path) -> None:
    """Two producers sending back to back: one append arrives while the other's commit
    runs, so that commit does not count."""
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER - 1) == [False] * (AFTER - 1)
        gate = fs.gate = threading.Event()
        first = asyncio.ensure_future(log.append_async(make_batch([b"first"])))
        for _ in range(10_000):  # bounded: until its fsync is under way, in a thread
            if len(fs.threads) == AFTER:
                break
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(log.append_async(make_batch([b"second"])))
        await asyncio.sleep(0.01)
        gate.set()
        fs.gate = None
        await asyncio.gather(first, second)
        # The first commit did not count; the second (alone) did.
        assert await _one_at_a_time(log, fs, AFTER) == [False] * (AFTER - 1) + [True]

    asyncio.run(main())
    log.close()


def test_a_read_of_the_partition_keeps_its_commits_in_the_threads_a_while(
    tmp_path: Path,
) -> None:
    """A reader (a consumer, a follower, a queue's deliveries) waits on the loop too; one that
    reads as the data comes reads between some of the commits, not all."""
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        log.read(0)
        assert await _one_at_a_time(log, fs, AFTER + 2) == [False] * (AFTER + 2)
        # No read for a while: the count starts again.
        await asyncio.sleep(log_module.INLINE_ALONE_S * 2)
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE

    asyncio.run(main())
    log.close()


def test_a_read_of_what_is_durable_leaves_the_partitions_commits_on_the_loop(
    tmp_path: Path,
) -> None:
    """A consumer under ``always`` reads no further than the durable offset: once caught up,
    what it waits for is the commit itself, so its reads of the committing partition do not
    send the commits back to the threads. A read past the durable offset (a follower) still
    does, and so does one that stopped short of it (a consumer catching up, which would wait
    behind each fsync on the loop)."""
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        for _ in range(3):  # a consumer tailing the partition between the commits
            at = log.flushed_offset
            assert log.read(at - 1, max_offset=at).next_offset == at
            assert log.read(at, max_offset=at).data == b""  # a long poll finding nothing
            assert await _one_at_a_time(log, fs, 1) == [True]
        # A read past the durable offset: up to a batch written but not yet fsynced.
        log.append(make_batch([b"not durable yet"]))
        end = log.log_end_offset
        assert log.flushed_offset < end
        assert log.read(log.flushed_offset, max_offset=end).next_offset == end
        await log.flush_async()  # one batch, alone: on the loop but for that read
        assert fs.threads[-1] != threading.get_ident()
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * (AFTER + 1)
        await asyncio.sleep(log_module.INLINE_ALONE_S * 2)
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        short = log.read(0, 1, max_offset=log.flushed_offset)  # one batch of several
        assert short.next_offset < log.flushed_offset
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * (AFTER + 1)

    asyncio.run(main())
    log.close()


@pytest.mark.parametrize("bounded", [False, True])
def test_a_read_of_another_partition_keeps_the_commits_in_the_threads_a_while(
    tmp_path: Path, bounded: bool
) -> None:
    """A consumer of another partition waits on the same loop, caught up (its read bounded
    by that partition's durable offset, and reaching it) or not: only the committing
    partition's own caught-up readers are left out."""
    fs, other_fs = _Syncs(), _Syncs()
    log, other = _open(tmp_path / "a", fs), _open(tmp_path / "b", other_fs)

    async def main() -> None:
        await other.append_async(make_batch([b"x"]))
        await asyncio.sleep(log_module.INLINE_ALONE_S * 2)
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        if bounded:
            at = other.flushed_offset
            assert other.read(0, max_offset=at).next_offset == at
        else:
            other.read(0)
        assert await _one_at_a_time(log, fs, AFTER + 2) == [False] * (AFTER + 2)
        await asyncio.sleep(log_module.INLINE_ALONE_S * 2)
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE

    asyncio.run(main())
    log.close()
    other.close()


def test_a_large_batch_goes_to_the_threads(tmp_path: Path) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        big = bytes(log_module.PREALLOCATE_SMALL_SYNC + 1)
        await log.append_async(make_batch([big]))
        assert fs.threads[-1] != threading.get_ident()

    asyncio.run(main())
    log.close()


def test_a_roll_goes_to_the_threads(tmp_path: Path) -> None:
    """A roll's commit syncs the new segment, the directory and the old one's indexes."""
    fs = _Syncs()
    log = _open(tmp_path, fs, segment_bytes=2048)

    async def main() -> None:
        me = threading.get_ident()
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        segments = log.segment_count
        while log.segment_count == segments:  # bounded: the segment fills within 2 KiB
            on_loop = await _one_at_a_time(log, fs, 1)
        assert on_loop == [False]
        assert fs.threads[-1] != me

    asyncio.run(main())
    log.close()


def test_zeros_written_ahead_go_to_the_threads(tmp_path: Path) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)
    log.preallocate_bytes = 8192

    async def main() -> None:
        inline_before = []
        for _ in range(log_module.PREALLOCATE_AFTER_SYNCS):  # bounded: zeros come at the 8th
            active = log._segments[-1]
            before = active.zeroed_to
            (on_loop,) = await _one_at_a_time(log, fs, 1)
            if active.zeroed_to > before:
                break
            inline_before.append(on_loop)
        else:
            raise AssertionError("no zeros were written ahead")
        assert any(inline_before)
        assert not on_loop  # the commit that wrote the zeros synced them in a thread
        # ... which started the count again; the commits after it come back to the loop.
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE

    asyncio.run(main())
    log.close()


def test_another_partition_committing_keeps_both_in_the_threads(tmp_path: Path) -> None:
    fs_a, fs_b = _Syncs(), _Syncs()
    a, b = _open(tmp_path / "a", fs_a), _open(tmp_path / "b", fs_b)

    async def main() -> None:
        me = threading.get_ident()
        for _ in range(3 * AFTER):  # one message at a time to each, in turn
            await _one_at_a_time(a, fs_a, 1)
            await _one_at_a_time(b, fs_b, 1)
        assert me not in fs_a.threads
        assert me not in fs_b.threads
        # b left alone past the window: it comes back to the loop.
        await asyncio.sleep(log_module.INLINE_ALONE_S * 2)
        assert await _one_at_a_time(b, fs_b, AFTER + 1) == LONE
        # One commit of a, now and then: b's next commit goes to the threads.
        await _one_at_a_time(a, fs_a, 1)
        assert await _one_at_a_time(b, fs_b, 1) == [False]

    asyncio.run(main())
    a.close()
    b.close()


def test_a_slow_fsync_goes_back_to_the_threads(tmp_path: Path) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        fs.delay_s = SLOW_S * 2
        assert await _one_at_a_time(log, fs, 1) == [True]  # found slow, on the loop
        fs.delay_s = 0.0
        # Twice as many quick lone commits needed now...
        assert await _one_at_a_time(log, fs, 2 * AFTER + 1) == [False] * 2 * AFTER + [True]
        fs.delay_s = SLOW_S * 2
        assert await _one_at_a_time(log, fs, 1) == [True]
        fs.delay_s = 0.0
        # ... then four times ...
        assert await _one_at_a_time(log, fs, 4 * AFTER + 1) == [False] * 4 * AFTER + [True]
        # ... and after twice that many quick ones in a row, twice again.
        assert all(await _one_at_a_time(log, fs, 4 * AFTER))
        fs.delay_s = SLOW_S * 2
        assert await _one_at_a_time(log, fs, 1) == [True]
        fs.delay_s = 0.0
        assert await _one_at_a_time(log, fs, 4 * AFTER + 1) == [False] * 4 * AFTER + [True]

    asyncio.run(main())
    log.close()


def test_a_failed_fsync_on_the_loop_fails_its_append(tmp_path: Path) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        fs.fail = True
        with pytest.raises(StorageError, match="an I/O error"):
            await log.append_async(make_batch([b"lost"]))
        assert fs.threads[-1] == threading.get_ident()
        assert log.flushed_offset == AFTER + 1
        with pytest.raises(LogFailedError):  # the log refuses writes from then on
            await log.append_async(make_batch([b"after"]))

    asyncio.run(main())
    log.abandon()


def test_an_interval_partition_s_flushes_do_not_count_as_another_partition(
    tmp_path: Path,
) -> None:
    fs, other_fs = _Syncs(), _Syncs()
    log = _open(tmp_path / "a", fs)
    other = _open(tmp_path / "b", other_fs, FsyncPolicy.INTERVAL)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE
        for _ in range(3):
            await other.append_async(make_batch([b"x"]), durable=True)  # its own fsync
            assert await _one_at_a_time(log, fs, 1) == [True]

    asyncio.run(main())
    log.close()
    other.close()


@pytest.mark.parametrize("fsync", [FsyncPolicy.INTERVAL, FsyncPolicy.NEVER])
def test_only_under_always(tmp_path: Path, fsync: FsyncPolicy) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs, fsync)

    async def main() -> None:
        for i in range(AFTER + 3):
            await log.append_async(make_batch([f"m{i}".encode()]), durable=True)
        assert len(fs.threads) >= AFTER + 3
        assert threading.get_ident() not in fs.threads

    asyncio.run(main())
    log.close()


def test_a_stand_in_executor_keeps_every_commit(tmp_path: Path) -> None:
    """Tests that step group commits through an executor see every one of them."""
    fs = _Syncs()
    log = _open(tmp_path, fs)
    submitted: list[object] = []

    class _Executor(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    async def main() -> None:
        with _Executor(1) as executor:
            set_flush_executor(asyncio.get_running_loop(), executor)
            try:
                on_loop = await _one_at_a_time(log, fs, AFTER + 3)
            finally:
                set_flush_executor(asyncio.get_running_loop(), None)
        assert on_loop == [False] * (AFTER + 3)
        assert len(submitted) == AFTER + 3

    asyncio.run(main())
    log.close()


def test_a_busy_flusher_thread_keeps_the_threads(tmp_path: Path) -> None:
    """Another log's fsync held in a flusher thread: the loop must be free to take its
    result back, so this log's commit does not block it."""
    fs, other_fs = _Syncs(), _Syncs()
    log = _open(tmp_path / "a", fs)
    other = _open(tmp_path / "b", other_fs)

    async def main() -> None:
        gate = other_fs.gate = threading.Event()
        held = asyncio.ensure_future(other.append_async(make_batch([b"held"])))
        for _ in range(10_000):  # bounded: until the other fsync is under way
            if other_fs.threads:
                break
            await asyncio.sleep(0.001)
        assert other_fs.threads, "the other log's fsync never started"
        await asyncio.sleep(log_module.INLINE_ALONE_S * 2)  # this log is alone again
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * (AFTER + 1)
        gate.set()
        await held
        # The last of those (its count reached, a thread busy) started the count again.
        assert await _one_at_a_time(log, fs, AFTER + 1) == LONE

    asyncio.run(main())
    log.close()
    other.close()
