"""A lone append's group commit on the event loop's own thread (``INLINE_FSYNC_AFTER``): a
partition written one message at a time, and not read, has its fsyncs run on the loop after
a few group commits of one batch each; two batches in a commit, a read, a slow fsync, a busy
flusher thread or a stand-in executor send them back to the flusher threads. Either way an
append returns only once its fsync is done."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from tests.storage.history import make_batch, read_all
from tidewire.storage import FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage import log as log_module
from tidewire.storage.flusher import set_flush_executor
from tidewire.storage.fs import FileHandle, FileHandleWrapper, FileSystemWrapper

AFTER = log_module.INLINE_FSYNC_AFTER
#: What counts as a slow fsync in these tests (the real bound is a few ms, which a busy
#: disk's fsync may take: the tests slow one down on purpose instead).
SLOW_S = 0.05


@pytest.fixture(autouse=True)
def _slow_means_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "INLINE_FSYNC_MAX_S", SLOW_S)


class _Syncs(FileSystemWrapper):
    """Records, for each fsync of a segment file, the thread it ran on and whether it had
    finished when the append that waited for it returned; ``delay_s`` slows each one."""

    def __init__(self) -> None:
        super().__init__(OsFileSystem())
        self.threads: list[int] = []
        self.done = 0
        self.delay_s = 0.0

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        handle = self.inner.open(path, create=create)
        return _Handle(handle, self) if path.endswith(".log") else handle


class _Handle(FileHandleWrapper):
    def __init__(self, inner: FileHandle, fs: _Syncs) -> None:
        super().__init__(inner)
        self.fs = fs

    def sync(self) -> None:
        self.fs.threads.append(threading.get_ident())
        if self.fs.delay_s:
            time.sleep(self.fs.delay_s)
        self.inner.sync()
        self.fs.done += 1


def _open(tmp_path: object, fs: _Syncs, fsync: FsyncPolicy = FsyncPolicy.ALWAYS) -> PartitionLog:
    log = PartitionLog.open(fs, str(tmp_path), LogConfig(fsync=fsync))
    log.preallocate_bytes = 0
    return log


async def _one_at_a_time(log: PartitionLog, fs: _Syncs, n: int) -> list[bool]:
    """``n`` appends, each awaited; for each, whether its fsync ran on the loop's thread.
    Each append's own fsync is done by the time it returns."""
    me = threading.get_ident()
    on_loop = []
    for i in range(n):
        syncs = len(fs.threads)
        await log.append_async(make_batch([f"m{i}".encode()]))
        assert fs.done == len(fs.threads) > syncs  # its fsync ran, and finished, first
        on_loop.append(fs.threads[-1] == me)
    return on_loop


def test_one_message_at_a_time_moves_onto_the_loop(tmp_path: object) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        on_loop = await _one_at_a_time(log, fs, AFTER + 5)
        assert on_loop == [False] * AFTER + [True] * 5
        assert log.flushed_offset == AFTER + 5

    asyncio.run(main())
    assert [v for _, v in read_all(log)] == [f"m{i}".encode() for i in range(AFTER + 5)]
    log.close()


def test_two_batches_in_one_commit_go_back_to_the_threads(tmp_path: object) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * AFTER + [True]
        # Two appends in one turn: one group commit of two batches, in a thread.
        await asyncio.gather(
            log.append_async(make_batch([b"a"])), log.append_async(make_batch([b"b"]))
        )
        assert fs.threads[-1] != threading.get_ident()
        # And the count starts again.
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * AFTER + [True]

    asyncio.run(main())
    log.close()


def test_a_read_of_the_partition_keeps_the_threads(tmp_path: object) -> None:
    """A consumer reading the partition waits on the loop too: the loop is not blocked."""
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        for i in range(2 * AFTER):
            await log.append_async(make_batch([f"m{i}".encode()]))
            log.messages_out += 1  # what the broker counts per fetch or push
            assert fs.threads[-1] != threading.get_ident()

    asyncio.run(main())
    log.close()


def test_a_slow_fsync_goes_back_to_the_threads(tmp_path: object) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs)

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * AFTER + [True]
        fs.delay_s = SLOW_S * 2
        assert await _one_at_a_time(log, fs, 1) == [True]  # found slow, on the loop
        fs.delay_s = 0.0
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * AFTER + [True]

    asyncio.run(main())
    log.close()


@pytest.mark.parametrize("fsync", [FsyncPolicy.INTERVAL, FsyncPolicy.NEVER])
def test_only_under_always(tmp_path: object, fsync: FsyncPolicy) -> None:
    fs = _Syncs()
    log = _open(tmp_path, fs, fsync)

    async def main() -> None:
        for i in range(AFTER + 3):
            await log.append_async(make_batch([f"m{i}".encode()]), durable=True)
        assert fs.threads
        assert threading.get_ident() not in fs.threads

    asyncio.run(main())
    log.close()


def test_a_stand_in_executor_keeps_every_commit(tmp_path: object) -> None:
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


def test_a_busy_flusher_thread_keeps_the_threads(tmp_path: object) -> None:
    """Another log's fsync running in a flusher thread: the loop must take its result back,
    so this log's commit does not block it."""
    fs, other_fs = _Syncs(), _Syncs()
    log = _open(tmp_path / "a", fs)  # type: ignore[operator]
    other = _open(tmp_path / "b", other_fs)  # type: ignore[operator]

    async def main() -> None:
        assert await _one_at_a_time(log, fs, AFTER + 1) == [False] * AFTER + [True]
        other_fs.delay_s = 0.2
        slow = asyncio.ensure_future(other.append_async(make_batch([b"slow"])))
        while not other_fs.threads:  # bounded by the other append's fsync starting
            await asyncio.sleep(0.001)
        assert await _one_at_a_time(log, fs, 1) == [False]
        await slow
        assert other_fs.threads[-1] != threading.get_ident()

    asyncio.run(main())
    log.close()
    other.close()
