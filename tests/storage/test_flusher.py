"""The flusher threads that run group commits: bounded in number, replaceable per event loop,
and a flush that fails with something other than an OS error (a bug) still fails its waiters
instead of leaving them hanging."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.storage.history import SteppedExecutor, install_executor, make_batch
from tidewire.errors import StorageError
from tidewire.storage import FaultFS, FsyncPolicy, LogConfig, PartitionLog
from tidewire.storage.flusher import MAX_FLUSH_THREADS, run_flush_job, set_flush_executor


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


@pytest.mark.parametrize("threaded", [False, True])
def test_a_flush_that_fails_with_a_bug_fails_its_waiters(threaded: bool) -> None:
    async def run() -> None:
        if not threaded:
            install_executor(SteppedExecutor(None))
        log = PartitionLog.open(FaultFS(), "/p", LogConfig(fsync=FsyncPolicy.ALWAYS))
        await log.append_async(make_batch([b"ok"]))

        def broken(plan: object) -> None:
            raise ValueError("a bug in the flush")

        log._flush_io = broken  # type: ignore[method-assign,assignment]
        results = await asyncio.wait_for(
            asyncio.gather(
                *(log.append_async(make_batch([b"x"])) for _ in range(3)), return_exceptions=True
            ),
            30,
        )
        assert all(isinstance(r, StorageError) for r in results), results
        assert "a bug in the flush" in str(results[0])
        assert log.flushed_offset == 1  # nothing after the first batch counts as durable
        log.abandon()

    asyncio.run(run())
