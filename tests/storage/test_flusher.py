"""The flusher threads that run group commits: bounded in number, replaceable per event loop,
a small lone commit run on the loop instead (and when it is not), and a flush that fails with
something other than an OS error (a bug) still fails its waiters instead of leaving them
hanging."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from tests.storage.history import SteppedExecutor, install_executor, make_batch
from tidewire.errors import StorageError
from tidewire.storage import FaultFS, FsyncPolicy, LogConfig, PartitionLog, flusher
from tidewire.storage import log as log_module
from tidewire.storage.flusher import (
    INLINE_FLUSH_MAX_BYTES,
    MAX_FLUSH_THREADS,
    run_flush_job,
    set_flush_executor,
)


def _fsync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tidewire-fsync-")]


def test_jobs_beyond_the_thread_bound_wait_for_a_thread_and_all_run() -> None:
    jobs = MAX_FLUSH_THREADS * 3
    release = threading.Event()
    started = threading.Semaphore(0)
    done: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        started.release()
        assert release.wait(30), "never released"
        with lock:
            done.append(i)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for i in range(jobs):
            run_flush_job(loop, lambda i=i: job(i))
        # Every thread there may be is busy: the bound holds while jobs wait for one.
        for _ in range(MAX_FLUSH_THREADS):
            assert started.acquire(timeout=30), "a flusher thread never took its job"
        assert len(_fsync_threads()) == MAX_FLUSH_THREADS
        assert not started.acquire(timeout=0.05), "more jobs ran at once than threads"
        release.set()
        while len(done) < jobs:
            await asyncio.sleep(0.01)
        assert sorted(done) == list(range(jobs))
        assert len(_fsync_threads()) == MAX_FLUSH_THREADS

    asyncio.run(asyncio.wait_for(run(), 60))


def test_an_executor_set_for_a_loop_runs_its_jobs_until_unset() -> None:
    ran_on: list[str] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        set_flush_executor(loop, SteppedExecutor(None))  # runs the job at once, on the loop
        run_flush_job(loop, lambda: ran_on.append(threading.current_thread().name))
        assert ran_on == [threading.current_thread().name]
        set_flush_executor(loop, None)
        finished = asyncio.Event()

        def job() -> None:
            ran_on.append(threading.current_thread().name)
            loop.call_soon_threadsafe(finished.set)

        run_flush_job(loop, job)
        await asyncio.wait_for(finished.wait(), 30)
        assert ran_on[1].startswith("tidewire-fsync-")

    asyncio.run(run())


def _count_thread_jobs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the group commits the logs hand to the flusher threads (they still run)."""
    jobs: list[int] = []

    def counting(loop: asyncio.AbstractEventLoop, job: Callable[[], None]) -> None:
        jobs.append(1)
        run_flush_job(loop, job)

    monkeypatch.setattr(log_module, "run_flush_job", counting)
    return jobs


async def _open_warm(path: str) -> PartitionLog:
    """A log under ``always`` whose first commit is done."""
    log = PartitionLog.open(FaultFS(), path, LogConfig(fsync=FsyncPolicy.ALWAYS))
    await asyncio.wait_for(log.append_async(make_batch([b"warm"])), 30)
    await log.wait_idle()
    return log


async def _threads_idle() -> None:
    """Wait (bounded) until no flusher thread is busy: a thread counts itself idle just
    after it handed its commit's result back."""
    threads = flusher._threads()
    for _ in range(30_000):
        if not threads.busy():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("a flusher thread stayed busy")


def test_a_small_lone_commit_runs_on_the_loop_and_others_on_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = _count_thread_jobs(monkeypatch)

    async def run() -> None:
        log = await _open_warm("/p")
        before = len(jobs)
        for i in range(5):  # one at a time, each awaited: each commit alone and small
            await asyncio.wait_for(log.append_async(make_batch([b"m%d" % i])), 30)
        assert len(jobs) == before, "a lone small commit went to a flusher thread"
        assert log.flushed_offset == 6
        big = make_batch([b"x" * (INLINE_FLUSH_MAX_BYTES + 1)])
        await asyncio.wait_for(log.append_async(big), 30)
        assert len(jobs) == before + 1, "a commit above INLINE_FLUSH_MAX_BYTES ran on the loop"
        assert log.flushed_offset == 7
        await _threads_idle()
        # Two small batches in one commit: appends come faster than fsyncs, a thread.
        await asyncio.wait_for(log.append_many_async([make_batch([b"p"]), make_batch([b"q"])]), 30)
        assert len(jobs) == before + 2, "a commit of two batches ran on the loop"
        assert log.flushed_offset == 9
        log.close()

    asyncio.run(run())


def test_two_logs_committing_in_one_turn_share_it_with_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = _count_thread_jobs(monkeypatch)

    async def run() -> None:
        a, b = await _open_warm("/a"), await _open_warm("/b")
        before = len(jobs)
        # Both appends queue in the same turn: their commits start in the next one, the
        # first on the loop, the second on a thread (in parallel, not after the first).
        await asyncio.wait_for(
            asyncio.gather(a.append_async(make_batch([b"a"])), b.append_async(make_batch([b"b"]))),
            30,
        )
        assert len(jobs) == before + 1
        assert (a.flushed_offset, b.flushed_offset) == (2, 2)
        # In a later turn, with the threads idle, a lone commit runs on the loop again.
        await _threads_idle()
        await asyncio.wait_for(a.append_async(make_batch([b"a2"])), 30)
        assert len(jobs) == before + 1
        a.close()
        b.close()

    asyncio.run(run())


def test_while_fsyncs_are_slow_commits_go_to_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = _count_thread_jobs(monkeypatch)

    async def run() -> None:
        log = await _open_warm("/p")
        await _threads_idle()
        monkeypatch.setattr(flusher, "INLINE_FLUSH_SLOW_S", -1.0)  # every fsync is slow
        before = len(jobs)
        for i in range(3):
            await asyncio.wait_for(log.append_async(make_batch([b"m%d" % i])), 30)
        assert len(jobs) == before + 3
        # Fast again: once the average of the fsyncs (on the threads too) is under the
        # bound, a lone commit runs on the loop again.
        monkeypatch.setattr(flusher, "INLINE_FLUSH_SLOW_S", 3600.0)
        await _threads_idle()
        await asyncio.wait_for(log.append_async(make_batch([b"last"])), 30)
        assert len(jobs) == before + 3
        assert log.flushed_offset == 5
        log.close()

    asyncio.run(run())


def test_an_inline_fsync_that_stalled_the_loop_sends_commits_to_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = _count_thread_jobs(monkeypatch)

    async def run() -> None:
        log = await _open_warm("/p")
        await _threads_idle()
        monkeypatch.setattr(flusher, "INLINE_FLUSH_STALL_S", -1.0)  # every fsync stalls
        monkeypatch.setattr(flusher, "INLINE_FLUSH_BACKOFF_S", 3600.0)
        before = len(jobs)
        await asyncio.wait_for(log.append_async(make_batch([b"first"])), 30)
        assert len(jobs) == before  # it ran inline, and stalled the loop
        for i in range(3):
            await asyncio.wait_for(log.append_async(make_batch([b"m%d" % i])), 30)
        assert len(jobs) == before + 3
        assert log.flushed_offset == 5
        log.close()

    asyncio.run(run())


@pytest.mark.parametrize("where", ["stepped", "thread", "inline"])
def test_a_flush_that_fails_with_a_bug_fails_its_waiters(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "thread":
        monkeypatch.setattr(flusher, "INLINE_FLUSH_MAX_BYTES", -1)
    jobs = _count_thread_jobs(monkeypatch)

    async def run() -> None:
        if where == "stepped":
            install_executor(SteppedExecutor(None))
        log = PartitionLog.open(FaultFS(), "/p", LogConfig(fsync=FsyncPolicy.ALWAYS))
        await log.append_async(make_batch([b"ok"]))

        def broken(plan: object) -> None:
            raise ValueError("a bug in the flush")

        log._flush_io = broken  # type: ignore[method-assign,assignment]
        appends = 1 if where == "inline" else 3  # a commit of one batch runs on the loop
        await log.wait_idle()
        before = len(jobs)
        results = await asyncio.wait_for(
            asyncio.gather(
                *(log.append_async(make_batch([b"x"])) for _ in range(appends)),
                return_exceptions=True,
            ),
            30,
        )
        assert all(isinstance(r, StorageError) for r in results), results
        assert "a bug in the flush" in str(results[0])
        assert log.flushed_offset == 1  # nothing after the first batch counts as durable
        if where == "inline":
            assert len(jobs) == before, "the failing commit did not run on the loop"
        elif where == "thread":
            assert len(jobs) > before
        log.abandon()

    asyncio.run(run())
