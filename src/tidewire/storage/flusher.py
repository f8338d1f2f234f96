"""The threads that run the logs' group commits (their fsyncs), and the seam that replaces them.

A group commit is handed to a flusher thread as one callable; the callable, when its fsync is
done, hands the result back to the event loop itself with ``call_soon_threadsafe``. That is one
wake-up of the loop, and the log's callback runs in it. The loop's default executor
(``run_in_executor``) cost more on the latency path of a lone message: a
``concurrent.futures.Future`` and a work item per job, two locks on submit, and on the way back
the future's state copied into an ``asyncio.Future`` by one callback whose own done-callbacks
run one loop turn later (~50-100 µs a turn on a loaded 2-core machine), before the appenders
could be told.

Tests replace the threads for one event loop with :func:`set_flush_executor` (an executor that
runs the jobs on the loop after a seeded number of turns replays an interleaving exactly).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from queue import SimpleQueue

__all__ = ["MAX_FLUSH_THREADS", "flush_threads_idle", "run_flush_job", "set_flush_executor"]

log = logging.getLogger(__name__)

#: Flusher threads at most in a process. fsyncs of different logs run in parallel (a device
#: takes several at once, and a slow one must not hold the others back), as many as the
#: default executor would run for a 4-core machine (``min(32, cpus + 4)``); a log runs one
#: group commit at a time, so more logs than this wait their turn for a thread, never
#: unboundedly: at most one queued job per log.
MAX_FLUSH_THREADS = 8

#: Executors standing in for the threads, per event loop (tests).
_EXECUTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, concurrent.futures.Executor] = (
    weakref.WeakKeyDictionary()
)


def set_flush_executor(
    loop: asyncio.AbstractEventLoop, executor: concurrent.futures.Executor | None
) -> None:
    """Run the group commits of logs owned by ``loop`` through ``executor`` (its ``submit``)
    instead of the flusher threads; None: the threads again."""
    if executor is None:
        _EXECUTORS.pop(loop, None)
    else:
        _EXECUTORS[loop] = executor


#: A group commit's blocking disk work, returning the hand-back of its result to its loop
#: (or None: it handed it back itself).
FlushJob = Callable[[], Callable[[], None] | None]


def run_flush_job(loop: asyncio.AbstractEventLoop, job: FlushJob) -> None:
    """Run ``job`` (blocking disk work) in a flusher thread, or through the executor set
    for ``loop``, then the hand-back it returns; a thread counts itself idle in between, so
    the loop, told, finds it idle (:func:`flush_threads_idle`)."""
    executor = _EXECUTORS.get(loop)
    if executor is not None:
        executor.submit(functools.partial(_run_and_hand_back, job))
        return
    _threads().submit(job)


def _run_and_hand_back(job: FlushJob) -> None:
    hand_back = job()
    if hand_back is not None:
        hand_back()


def flush_threads_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a group commit may run on ``loop``'s own thread instead (see
    ``PartitionLog._start_flush``): no executor stands in for the threads on it (tests),
    and no flusher thread is busy (whose result the loop, blocked, would take back late)."""
    if _EXECUTORS and loop in _EXECUTORS:
        return False
    threads = _THREADS
    return threads is None or threads.idle()


class _FlushThreads:
    """Up to :data:`MAX_FLUSH_THREADS` daemon threads taking jobs from one queue; a thread is
    added only when a job arrives and none is idle."""

    def __init__(self) -> None:
        self._jobs: SimpleQueue[FlushJob] = SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, job: FlushJob) -> None:
        with self._lock:
            if self._idle <= 0 and self._threads < MAX_FLUSH_THREADS:
                self._threads += 1
                self._idle += 1  # counted idle until it takes its first job
                threading.Thread(
                    target=self._work, name=f"tidewire-fsync-{self._threads}", daemon=True
                ).start()
            self._idle -= 1
        self._jobs.put(job)

    def idle(self) -> bool:
        """No job is queued or running (read without the lock: a hint)."""
        return self._idle >= self._threads

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            hand_back: Callable[[], None] | None = None
            try:
                hand_back = job()
            except BaseException as exc:  # a job hands its own errors back: this is a bug
                log.error("a flush job failed", exc_info=exc)
            with self._lock:
                self._idle += 1
            if hand_back is not None:
                try:
                    hand_back()
                except BaseException as exc:  # likewise
                    log.error("handing a flush job's result back failed", exc_info=exc)


#: The process's threads; a forked child has none of its parent's (reset at fork: asking
#: ``os.getpid`` at every group commit was a system call a message).
_THREADS: _FlushThreads | None = None


def _forget_threads() -> None:
    global _THREADS  # noqa: PLW0603 (the process's one pool)
    _THREADS = None


os.register_at_fork(after_in_child=_forget_threads)


def _threads() -> _FlushThreads:
    global _THREADS  # noqa: PLW0603 (the process's one pool)
    threads = _THREADS
    if threads is None:
        threads = _THREADS = _FlushThreads()
    return threads
