"""The latency path of an append: the group commit starts in the loop turn that writes the
batch (not turns later, when the appender resumes), its result comes back to the loop without
an intermediate task or future, and the log tells readers (``PartitionLog.on_visible``) as
soon as they may see more: under ``always`` once an fsync covers the batch, in the step that
settles the appends, before their callers resume; under ``interval`` and ``never`` once it is
written."""

from __future__ import annotations

import asyncio
import errno

import pytest

from tests.storage.history import SteppedExecutor, install_executor, make_batch
from tidewire.errors import LogFailedError, StorageError
from tidewire.storage import FaultFS, FsyncPolicy, LogConfig, PartitionLog

DIR = "/p"


def _open(fs: FaultFS, policy: FsyncPolicy) -> PartitionLog:
    return PartitionLog.open(fs, DIR, LogConfig(fsync=policy))


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_readers_are_told_once_they_may_see_the_batch(policy: FsyncPolicy) -> None:
    always = policy is FsyncPolicy.ALWAYS

    async def run() -> None:
        log = _open(FaultFS(), policy)
        events: list[tuple[str, int, int]] = []
        log.on_visible = lambda: events.append(("visible", log.log_end_offset, log.flushed_offset))
        info = await log.append_async(make_batch([b"a", b"b", b"c"]))
        events.append(("acked", log.log_end_offset, log.flushed_offset))
        assert [e[0] for e in events] == ["visible", "acked"], events
        _, end, flushed = events[0]
        assert end == info.last_offset + 1 == 3
        # Under always nothing is visible before the fsync; under the others, before it.
        assert flushed == (end if always else 0), events

        # Concurrent appends: by the time the last one is acknowledged, readers were told
        # about every batch, and never about more than what they may read.
        events.clear()
        infos = await asyncio.gather(*(log.append_async(make_batch([b"x"] * 2)) for _ in range(20)))
        told = [flushed if always else end for kind, end, flushed in events if kind == "visible"]
        assert told, "no wake-up for 20 appends"
        assert told == sorted(told)
        assert told[-1] == infos[-1].last_offset + 1 == log.log_end_offset
        await log.close_async()

    asyncio.run(run())


def test_a_lone_durable_append_waits_only_for_its_fsync() -> None:
    """With the fsync itself taking no time (run on the loop by a stepped executor at once),
    a lone append under ``always`` is acknowledged within three turns of the loop: the turn
    that writes it and starts the fsync, the flush job's own callback that settles the
    waiters (handed back with ``call_soon_threadsafe``: no executor future whose completion
    takes a turn of its own), the appender's resumption. It took six when the fsync started
    only once the appender resumed, in a task of its own, and four through
    ``run_in_executor``.
    """

    async def run() -> int:
        install_executor(SteppedExecutor(None))
        log = _open(FaultFS(), FsyncPolicy.ALWAYS)
        await log.append_async(make_batch([b"warm-up"]))
        task = asyncio.create_task(log.append_async(make_batch([b"lone"])))
        await asyncio.sleep(0)  # the task's first step: the batch is queued
        turns = 0
        while not task.done():
            await asyncio.sleep(0)
            turns += 1
            assert turns < 50, "the append never finished"
        assert log.flushed_offset == 2
        await log.close_async()
        return turns

    assert asyncio.run(run()) <= 3


def test_a_failed_fsync_fails_the_waiting_appends_and_later_ones() -> None:
    async def run() -> None:
        fs = FaultFS()
        log = _open(fs, FsyncPolicy.ALWAYS)
        told: list[int] = []
        log.on_visible = lambda: told.append(log.flushed_offset)
        await log.append_async(make_batch([b"ok"]))
        fs.fail_kinds["sync"] = errno.EIO
        results = await asyncio.gather(
            *(log.append_async(make_batch([b"lost"])) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, StorageError) for r in results), results
        assert told == [1]  # readers were never told about what no fsync covered
        with pytest.raises(LogFailedError):
            await log.append_async(make_batch([b"refused"]))
        log.abandon()

    asyncio.run(run())
