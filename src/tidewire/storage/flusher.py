"""The threads that run the logs' group commits (their fsyncs), and the seam that replaces them.

A group commit is handed to a flusher thread as one callable; the callable, when its fsync is
done, hands the result back to the event loop itself with ``call_soon_threadsafe``. That is one
wake-up of the loop, and the log's callback runs in it. The loop's default executor
(``run_in_executor``) cost more on the latency path of a lone message: a
``concurrent.futures.Future`` and a work item per job, two locks on submit, and on the way back
the future's state copied into an ``asyncio.Future`` by one callback whose own done-callbacks
run one loop turn later (~50-100 µs a turn on a loaded 2-core machine), before the appenders
could be told.

A small group commit when nothing else is flushing runs on the loop's own thread instead
(:func:`inline_flush_allowed`), as Redis runs its ``appendfsync always`` fsync in its event loop:
a lone durable message (one producer awaiting each send, or a moderate paced rate) then waits
for its fsync only, not also for waking a flusher thread (a futex wake-up and, on the way back,
the loop's own wake-up through ``call_soon_threadsafe``: 60-100 µs of the ~550 µs the broker
spends on such a message on the 2-core test machine, and the costliest call left on the loop).
It is refused for a commit of more than one batch or more than a few KiB (the loop would sit
idle while more appends could be written, which the threads let it do: a pipelining producer
would otherwise fall into lockstep with the fsyncs), for a second log in the same loop turn
(fsyncs of different logs run in parallel on the threads, not one after the other on the
loop), while a flusher thread is busy, while the loop's recent fsyncs are slow, and for a
second after one stalled the loop (a slow device must not stall every connection of the loop).

Tests replace the threads for one event loop with :func:`set_flush_executor` (an executor that
runs the jobs on the loop after a seeded number of turns replays an interleaving exactly); a
loop with an executor set never flushes inline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from queue import SimpleQueue

__all__ = [
    "FSYNC_AVERAGE_WEIGHT",
    "INLINE_FLUSH_BACKOFF_S",
    "INLINE_FLUSH_MAX_BYTES",
    "INLINE_FLUSH_SLOW_S",
    "INLINE_FLUSH_STALL_S",
    "MAX_FLUSH_THREADS",
    "fsync_observed",
    "inline_flush_allowed",
    "run_flush_job",
    "set_flush_executor",
]

log = logging.getLogger(__name__)

#: Flusher threads at most in a process. fsyncs of different logs run in parallel (a device
#: takes several at once, and a slow one must not hold the others back), as many as the
#: default executor would run for a 4-core machine (``min(32, cpus + 4)``); a log runs one
#: group commit at a time, so more logs than this wait their turn for a thread, never
#: unboundedly: at most one queued job per log.
MAX_FLUSH_THREADS = 8

#: Bytes to sync at most for a group commit to run on the loop's thread: a few 1 KB messages,
#: what a lone producer or a moderate rate leaves between two fsyncs. A commit of more is what
#: a busy log gathers while its previous fsync ran; the loop writes the next batches meanwhile
#: when the fsync is on a thread (pipelined durable publishing keeps its throughput).
INLINE_FLUSH_MAX_BYTES = 16 * 1024

#: Commits run inline only while the moving average of this loop's fsyncs (inline or on the
#: threads, :data:`FSYNC_AVERAGE_WEIGHT`) is at most this (seconds): the loop then stalls
#: about that long per commit, which a thread hand-off (tens of µs to a few ms when the
#: machine is busy) costs a lone message anyway. 2 ms is several times the fsync of the local
#: SSDs and VM disks measured (0.1-0.5 ms quiet, 1-4 ms at the p90 on a loaded 2-core VM).
INLINE_FLUSH_SLOW_S = 0.002

#: Weight of the newest fsync in the moving average (about the last 5 count).
FSYNC_AVERAGE_WEIGHT = 0.2

#: An inline fsync longer than this (seconds) stalled every connection of the loop that long:
#: the commits of the next :data:`INLINE_FLUSH_BACKOFF_S` go to the threads whatever the
#: average says, so a device in trouble stalls the loop at most once in that time.
INLINE_FLUSH_STALL_S = 0.02

#: How long commits go to the threads after an inline fsync over :data:`INLINE_FLUSH_STALL_S`.
INLINE_FLUSH_BACKOFF_S = 1.0

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


class _InlineState:
    """Per event loop: whether a commit ran inline in this turn, the moving average of its
    fsyncs (seconds), and until when commits go to the threads after a stall
    (``time.monotonic``)."""

    __slots__ = ("average_s", "in_this_turn", "threads_until")

    def __init__(self) -> None:
        self.in_this_turn = False
        self.average_s = 0.0
        self.threads_until = 0.0

    def next_turn(self) -> None:
        self.in_this_turn = False


_INLINE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _InlineState] = (
    weakref.WeakKeyDictionary()
)


def _state(loop: asyncio.AbstractEventLoop) -> _InlineState:
    state = _INLINE.get(loop)
    if state is None:
        state = _INLINE[loop] = _InlineState()
    return state


def inline_flush_allowed(loop: asyncio.AbstractEventLoop, nbytes: int, batches: int) -> bool:
    """Whether a group commit of ``batches`` batches, ``nbytes`` to sync, may run on
    ``loop``'s thread now (the caller runs it at once, and reports every commit's fsync time
    to :func:`fsync_observed`): it covers one batch (several mean appends arrive faster than
    fsyncs: a pipelining producer, whose next requests the loop should read and write while
    the fsync runs, not after it), it is small (:data:`INLINE_FLUSH_MAX_BYTES`), no executor
    is set for ``loop``, no flusher thread of the process is busy, no other commit ran inline
    in this turn of ``loop``, the loop's fsyncs have been fast lately
    (:data:`INLINE_FLUSH_SLOW_S`) and none stalled it lately (:data:`INLINE_FLUSH_STALL_S`)."""
    if batches > 1 or nbytes > INLINE_FLUSH_MAX_BYTES or loop in _EXECUTORS:
        return False
    threads = _THREADS.get(os.getpid())
    if threads is not None and threads.busy():
        return False
    state = _state(loop)
    if state.in_this_turn or state.average_s > INLINE_FLUSH_SLOW_S:
        return False
    if state.threads_until and time.monotonic() < state.threads_until:
        return False
    state.in_this_turn = True
    # Reset in the next turn: other logs whose commits start later in this one use the
    # threads, so that their fsyncs run in parallel rather than one after another here.
    loop.call_soon(state.next_turn)
    return True


def fsync_observed(loop: asyncio.AbstractEventLoop, seconds: float, *, inline: bool) -> None:
    """A group commit of a log owned by ``loop`` took ``seconds`` (``inline``: on the loop's
    thread). Feeds the moving average :func:`inline_flush_allowed` looks at; an inline one
    over :data:`INLINE_FLUSH_STALL_S` sends the commits of the next
    :data:`INLINE_FLUSH_BACKOFF_S` to the threads."""
    state = _state(loop)
    state.average_s += FSYNC_AVERAGE_WEIGHT * (seconds - state.average_s)
    if inline and seconds > INLINE_FLUSH_STALL_S:
        state.threads_until = time.monotonic() + INLINE_FLUSH_BACKOFF_S
        log.warning(
            "an fsync on the event loop took %.1f ms (more than %.1f ms): group commits go to "
            "the flusher threads for %.1f s",
            seconds * 1e3,
            INLINE_FLUSH_STALL_S * 1e3,
            INLINE_FLUSH_BACKOFF_S,
        )


def run_flush_job(loop: asyncio.AbstractEventLoop, job: Callable[[], None]) -> None:
    """Run ``job`` (blocking disk work that hands its own result back to ``loop``) in a
    flusher thread, or through the executor set for ``loop``."""
    executor = _EXECUTORS.get(loop)
    if executor is not None:
        executor.submit(job)
        return
    _threads().submit(job)


class _FlushThreads:
    """Up to :data:`MAX_FLUSH_THREADS` daemon threads taking jobs from one queue; a thread is
    added only when a job arrives and none is idle."""

    def __init__(self) -> None:
        self._jobs: SimpleQueue[Callable[[], None]] = SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def busy(self) -> bool:
        """Whether a thread runs a job or a job waits for one (read without the lock: a
        heuristic for :func:`inline_flush_allowed`, exact enough under the GIL)."""
        return self._idle < self._threads

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle <= 0 and self._threads < MAX_FLUSH_THREADS:
                self._threads += 1
                self._idle += 1  # counted idle until it takes its first job
                threading.Thread(
                    target=self._work, name=f"tidewire-fsync-{self._threads}", daemon=True
                ).start()
            self._idle -= 1
        self._jobs.put(job)

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            try:
                job()
            except BaseException as exc:  # a job hands its own errors back: this is a bug
                log.error("a flush job failed", exc_info=exc)
            with self._lock:
                self._idle += 1


_THREADS: dict[int, _FlushThreads] = {}  # by process id: a forked child has no threads


def _threads() -> _FlushThreads:
    pid = os.getpid()
    threads = _THREADS.get(pid)
    if threads is None:
        threads = _THREADS[pid] = _FlushThreads()
    return threads
