"""Writeback hints: under ``never`` and ``interval`` the log asks the OS to start writing back
each ``WRITEBACK_BYTES`` it has written (from a worker thread), never past what it wrote, and
never under ``always``; a hint that fails costs nothing but the hint; the real file system
sends it as ``sync_file_range``."""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import threading
import time
from collections.abc import Sequence

import pytest

from tests.storage.history import make_batch, read_all
from tidewire.storage import FaultFS, FileHandle, FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage import log as log_module
from tidewire.storage.fs import Buffer, FileHandleWrapper, FileSystemWrapper

DIR = "/p"
PAYLOAD = 60_000


class _Hints(FileSystemWrapper):
    """Records every writeback hint ``(path, offset, length, written size then, thread)``;
    ``fail`` makes each hint raise after it is recorded."""

    def __init__(self, inner: FaultFS) -> None:
        super().__init__(inner)
        self.hints: list[tuple[str, int, int, int, str]] = []
        self.fail = False
        self.lock = threading.Lock()

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        return _HintFile(self, self.inner.open(path, create=create))


class _HintFile(FileHandleWrapper):
    def __init__(self, fs: _Hints, inner: FileHandle) -> None:
        super().__init__(inner)
        self._fs = fs
        self.written = 0

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        n = self.inner.pwritev(buffers, offset)
        self.written = max(self.written, offset + n)
        return n

    def start_writeback(self, offset: int, length: int) -> None:
        with self._fs.lock:
            self._fs.hints.append(
                (self.path, offset, length, self.written, threading.current_thread().name)
            )
        if self._fs.fail:
            raise OSError(5, "injected", self.path)


def _append(log: PartitionLog, count: int, steps: int = 1) -> None:
    """Append ``count`` batches ``steps`` times, letting the hint sent (if any) end between
    steps: a hint is sent only when the one before has ended."""

    async def main() -> None:
        n = 0
        for _ in range(steps):
            for _ in range(count):
                await log.append_async(make_batch([b"%06d" % n + b"x" * PAYLOAD]))
                n += 1
            await asyncio.to_thread(_wait_for, _hint_done(log), "the hint ends")

    asyncio.run(main())


def _hint_done(log: PartitionLog) -> object:
    return lambda: log._writeback is None or log._writeback.done()


def _wait_for(cond: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("policy", [FsyncPolicy.NEVER, FsyncPolicy.INTERVAL])
def test_written_bytes_are_hinted_in_order_from_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch, policy: FsyncPolicy
) -> None:
    monkeypatch.setattr(log_module, "WRITEBACK_BYTES", 256 * 1024)
    fs = _Hints(FaultFS())
    log = PartitionLog.open(fs, DIR, LogConfig(fsync=policy))
    _append(log, 5, steps=4)  # 5 batches (300 KB) cross the 256 KiB mark once per step
    hints = fs.hints
    assert len(hints) == 4, hints
    end = 0
    for path, offset, length, written, thread in hints:
        assert path.endswith("00000000000000000000.log")
        assert offset == end, "each hint starts where the one before ended"
        assert length >= 256 * 1024
        assert offset + length <= written, "never a byte that is not written yet"
        assert thread.startswith("tidewire-writeback"), thread
        end = offset + length
    assert end <= log.size_bytes
    assert [int(v[:6]) for _, v in read_all(log, max_bytes=1 << 20)] == list(range(20))
    log.close()


def test_no_hints_under_always(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "WRITEBACK_BYTES", 64 * 1024)
    fs = _Hints(FaultFS())
    log = PartitionLog.open(fs, DIR, LogConfig(fsync=FsyncPolicy.ALWAYS))
    _append(log, 10)
    assert fs.hints == []
    log.close()


def test_a_failed_hint_costs_only_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "WRITEBACK_BYTES", 128 * 1024)
    fs = _Hints(FaultFS())
    fs.fail = True
    log = PartitionLog.open(fs, DIR, LogConfig(fsync=FsyncPolicy.NEVER))
    _append(log, 5, steps=4)
    assert len(fs.hints) >= 4, "hints go on after a failed one"
    assert log.failed is None
    assert log.log_end_offset == 20
    log.flush()
    assert log.flushed_offset == 20
    log.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_os_file_system_sends_sync_file_range(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "f")
    f = OsFileSystem().open(path)
    try:
        f.pwritev([b"x" * 100_000], 0)
        f.start_writeback(0, 100_000)  # accepted
        f.start_writeback(0, 0)  # nothing to do
    finally:
        f.close()
    with pytest.raises(OSError, match="sync_file_range") as caught:  # closed: EBADF
        f.start_writeback(0, 4096)
    assert caught.value.errno == errno.EBADF
