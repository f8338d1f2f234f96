"""``PartitionLog.append_many_soon``: the append without a task that the listener's produce
fast path uses. Its callback comes once, only after what ``append_many_async`` would have
waited for (under ``always`` the group commit that covers the batches), with the same infos,
and with the error instead when the write or the fsync fails; what it refuses up front it
raises before anything is queued."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.storage.history import install_executor, make_batch
from tidewire import _step
from tidewire.errors import BackpressureError, StorageError
from tidewire.storage import FaultFS, FsyncPolicy, LogConfig, PartitionLog
from tidewire.storage.fs import Buffer, FileHandle, FileHandleWrapper, FileSystem, FileSystemWrapper
from tidewire.storage.log import AppendInfo, check_appendable


class HeldExecutor(concurrent.futures.ThreadPoolExecutor):
    """Keeps each group commit until the test runs it (on the loop's thread)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)  # never started
        self.jobs: list[Callable[[], None]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.jobs.append(lambda: fn(*args, **kwargs))
        return None

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()


Outcome = tuple[list[AppendInfo] | None, BaseException | None]


def _append_soon(log: PartitionLog, payloads: list[bytes], calls: list[Outcome], **kw: Any) -> None:
    batches = [make_batch([p]) for p in payloads]
    headers = [check_appendable(memoryview(b), 0) for b in batches]
    log.append_many_soon(batches, checked=headers, callback=lambda i, e: calls.append((i, e)), **kw)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_callback_comes_once_after_the_group_commit() -> None:
    async def run() -> None:
        held = HeldExecutor()
        install_executor(held)
        log = PartitionLog.open(FaultFS(), "/p", LogConfig(fsync=FsyncPolicy.ALWAYS))
        calls: list[Outcome] = []
        _append_soon(log, [b"a", b"b"], calls)
        await _turns()
        assert calls == []  # written, not yet fsynced: not acknowledged
        assert log.log_end_offset == 2
        assert log.flushed_offset == 0
        assert len(held.jobs) == 1
        held.run_all()  # the commit's result comes back with call_soon_threadsafe
        await _turns()
        assert len(calls) == 1
        infos, error = calls[0]
        assert error is None
        assert infos is not None
        assert [(i.base_offset, i.last_offset) for i in infos] == [(0, 0), (1, 1)]
        assert log.flushed_offset == 2
        # The same as the awaited append gives for the next batch.
        task = asyncio.ensure_future(log.append_many_async([make_batch([b"c"])]))
        await _turns()
        held.run_all()
        (info,) = await asyncio.wait_for(task, 30)
        assert (info.base_offset, info.last_offset) == (2, 2)
        assert len(calls) == 1  # never called again
        log.abandon()

    asyncio.run(run())


def test_without_an_fsync_the_callback_comes_once_written() -> None:
    async def run() -> None:
        held = HeldExecutor()
        install_executor(held)
        log = PartitionLog.open(FaultFS(), "/p", LogConfig(fsync=FsyncPolicy.ALWAYS))
        calls: list[Outcome] = []
        _append_soon(log, [b"a"], calls, durable=False)  # acks=leader
        assert calls == []  # queued: written at the end of this turn
        await _turns()
        assert len(calls) == 1
        assert calls[0][1] is None
        assert held.jobs == []  # no commit was asked for
        log.abandon()

    asyncio.run(run())


@pytest.mark.parametrize("fails", ["write", "sync"])
def test_a_failed_write_or_fsync_calls_back_with_the_error(fails: str) -> None:
    async def run() -> None:
        held = HeldExecutor()
        install_executor(held)
        fs = FaultFS()
        log = PartitionLog.open(fs, "/p", LogConfig(fsync=FsyncPolicy.ALWAYS))
        fs.fail_kinds[fails] = errno.EIO
        calls: list[Outcome] = []
        _append_soon(log, [b"a"], calls)
        await _turns()
        held.run_all()
        await _turns()
        assert len(calls) == 1
        infos, error = calls[0]
        assert infos is None, calls
        assert isinstance(error, StorageError), calls
        assert log.flushed_offset == 0
        log.abandon()

    asyncio.run(run())


def test_backpressure_raises_before_anything_is_queued() -> None:
    async def run() -> None:
        held = HeldExecutor()
        install_executor(held)
        config = LogConfig(fsync=FsyncPolicy.ALWAYS, max_pending_appends=2)
        log = PartitionLog.open(FaultFS(), "/p", config)
        calls: list[Outcome] = []
        _append_soon(log, [b"a", b"b"], calls)
        with pytest.raises(BackpressureError):
            _append_soon(log, [b"c"], calls)
        await _turns()
        assert log.log_end_offset == 2  # the refused batch was not queued
        held.run_all()
        await _turns()
        assert len(calls) == 1
        assert calls[0][1] is None
        log.abandon()

    asyncio.run(run())


class _FailOnePwritev(FileSystemWrapper):
    """Fails the first ``pwritev`` of exactly ``size`` bytes."""

    def __init__(self, inner: FileSystem, size: int) -> None:
        super().__init__(inner)
        self.size = size

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        fs = self

        class Handle(FileHandleWrapper):
            def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
                if fs.size and sum(len(b) for b in buffers) == fs.size:
                    fs.size = 0
                    raise OSError(errno.EIO, "Input/output error", path)
                return self.inner.pwritev(buffers, offset)

        return Handle(super().open(path, create=create))


def test_an_append_made_by_a_callback_is_not_acknowledged_before_the_drain_is_written() -> None:
    """The listener appends again from an answer's callback (a pipelined request read
    meanwhile). The first batch's callback must not run while a later run of the same drain
    (here: the next batch, in a new segment) is still unwritten: an append made from it, big
    enough to be written at once, was acknowledged and then rolled back when that run
    failed."""

    async def run() -> None:
        second = make_batch([b"y" * 3100])
        fs = _FailOnePwritev(FaultFS(), len(second))
        log = PartitionLog.open(fs, "/p", LogConfig(fsync=FsyncPolicy.NEVER, segment_bytes=4096))
        calls: dict[str, Outcome] = {}
        big = make_batch([b"z" * (4 * 1024 * 1024 + 10)])

        def soon(data: bytes, name: str, then: Callable[[], None] | None = None) -> None:
            def callback(infos: list[AppendInfo] | None, exc: BaseException | None) -> None:
                calls[name] = (infos, exc)
                if then is not None:
                    then()

            header = check_appendable(memoryview(data), 0)
            log.append_many_soon([data], durable=False, checked=[header], callback=callback)

        soon(make_batch([b"x" * 3000]), "first", lambda: soon(big, "again"))
        soon(second, "second")  # rolls the segment: a run of its own, which fails
        await _turns()
        assert calls["first"][1] is None
        assert isinstance(calls["second"][1], StorageError)
        infos, error = calls.get("again", (None, None))
        if error is None:  # acknowledged: it must be in the log
            assert infos is not None
            assert infos[-1].last_offset < log.log_end_offset, (infos, log.log_end_offset)
        log.abandon()

    asyncio.run(run())


@pytest.mark.parametrize("fsync", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
def test_what_a_callback_puts_off_runs_at_the_end_of_its_step(fsync: FsyncPolicy) -> None:
    """A callback settled by a group commit's result (``always``) or by the end of the turn
    that writes it (``interval``) runs inside one step (:mod:`tidewire._step`): what it puts
    off runs once every callback of the step has run, and before the step's callback of the
    loop returns, not in a later one."""

    async def run() -> None:
        held = HeldExecutor()
        install_executor(held)
        log = PartitionLog.open(FaultFS(), "/p", LogConfig(fsync=fsync))
        seen: list[str] = []

        def callback(name: str) -> Callable[[Any, Any], None]:
            def call(infos: Any, exc: Any) -> None:
                assert exc is None
                seen.append(name)
                assert _step.defer(lambda: seen.append(f"after {name}"))

            return call

        steps: list[list[str]] = []
        for name in ("_flush_finished", "_end_of_turn"):
            inner = getattr(log, name)

            def wrapped(*a: Any, _inner: Any = inner) -> None:
                _inner(*a)
                steps.append(list(seen))  # what the step did, by the time it returned
                seen.clear()

            setattr(log, name, wrapped)
        for p in (b"a", b"b"):
            b = make_batch([p])
            log.append_many_soon(
                [b], checked=[check_appendable(memoryview(b), 0)], callback=callback(p.decode())
            )
        await _turns()
        held.run_all()
        await _turns()
        assert ["a", "b", "after a", "after b"] in steps
        assert _step.defer(lambda: None) is False  # outside a step: nothing kept
        log.close()

    asyncio.run(run())


def test_a_step_runs_what_it_put_off_once_even_when_one_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[int] = []
    assert _step.defer(lambda: ran.append(0)) is False

    def fail() -> None:
        raise RuntimeError("boom")

    assert _step.begin() is True
    try:  # a failed assertion must not leave the thread's step open for the next tests
        assert _step.begin() is False  # inside a step: the outer one runs what is put off
        assert _step.defer(lambda: ran.append(1))
        assert _step.defer(fail)
        assert _step.defer(lambda: (ran.append(2), _step.defer(lambda: ran.append(3))))
        once = ran.clear
        assert _step.defer(once)
        assert _step.defer(once)  # put off twice, run once
        assert _step.active()
    finally:
        _step.end()
    assert not _step.active()
    assert ran == [3]  # 1 and 2 ran before the clear, 3 (put off by 2) after it
    assert "put off to the end of a step failed" in caplog.text
    assert _step.defer(lambda: ran.append(4)) is False
    _step.end()  # outside a step: nothing to run
    assert ran == [3]
