"""Fetches waiting without a task (:meth:`Broker.park_fetch`): each is answered once, in
time, however its wake-ups come."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker._support import LONG_POLL_MS, PROMPT_S, batch, config, values
from tidewire.broker import Broker, FetchResult
from tidewire.storage import FsyncPolicy, LogConfig

ALL = 1 << 20


def park(
    broker: Broker,
    wants: list[tuple[str, int, int, int]],
    answer: Callable[[list[FetchResult] | None], None],
) -> None:
    """Park a long-poll fetch of ``wants`` (at least a byte, everything there is, room for
    its answer always) that ``answer`` is given."""
    parked = broker.park_fetch(
        wants, answer, max_wait_ms=LONG_POLL_MS, min_bytes=1, max_bytes=ALL, room=lambda: True
    )
    assert parked is not None


def test_a_fetch_woken_by_another_fetchs_read_is_answered(tmp_path: Path) -> None:
    """Under ``interval`` a read writes the log's queued batches first, and so wakes its
    waiters: one fetch's read may wake another. That one is answered too, not left unparked
    (no timer, no wake-up) until some later wake-up."""
    hourly = LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=3_600_000)

    async def main() -> None:
        async with Broker(config(tmp_path, log=hourly)) as broker:
            broker.create_topic("t", 2)
            loop = asyncio.get_running_loop()
            both: asyncio.Future[list[FetchResult] | None] = loop.create_future()
            second: asyncio.Future[list[FetchResult] | None] = loop.create_future()

            park(broker, [("t", 0, 0, ALL), ("t", 1, 0, ALL)], both.set_result)
            park(broker, [("t", 1, 0, ALL)], second.set_result)
            assert broker.fetch_waiters == 2
            # Both appends queued in one turn: partition 0's writes (and wake-up) go first,
            # and the first fetch's read of partition 1 writes its batch and wakes the other.
            await asyncio.gather(
                broker.produce("t", 0, batch([b"a"])), broker.produce("t", 1, batch([b"b"]))
            )
            got = await asyncio.wait_for(both, PROMPT_S)
            assert got is not None
            assert [values(r.data) for r in got] == [[(0, b"a")], [(0, b"b")]]
            got = await asyncio.wait_for(second, 0.5)
            assert got is not None
            assert [values(r.data) for r in got] == [[(0, b"b")]]
            assert (broker.fetch_waiters, broker._waiters) == (0, {})

    asyncio.run(main())


@pytest.mark.parametrize("broken_step", ["_read", "_delivered"])
def test_a_bug_in_a_woken_fetchs_read_is_contained(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    broken_step: str,
) -> None:
    """The read of a woken fetch runs inside another's callback (here the producer's append):
    an unexpected error there, in the read itself or in counting what it delivers once it
    found enough, is logged and the fetch handed to the usual way with nothing delivered
    (answer(None)), not left answered by nobody, waiting for no wake-up and no timer. The
    append and the fetch's waiter count are left whole."""

    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 1)
            loop = asyncio.get_running_loop()
            got: asyncio.Future[list[FetchResult] | None] = loop.create_future()
            park(broker, [("t", 0, 0, ALL)], got.set_result)
            real = getattr(Broker, broken_step)

            def broken(self: Broker, *args: object) -> object:
                monkeypatch.setattr(Broker, broken_step, real)  # once
                raise RuntimeError("a bug")

            monkeypatch.setattr(Broker, broken_step, broken)
            await broker.produce("t", 0, batch([b"a"]))  # the append itself succeeds
            assert await asyncio.wait_for(got, PROMPT_S) is None
            assert (broker.fetch_waiters, broker._waiters) == (0, {})
            assert broker.stats.delivered == 0
            assert "answering a waiting fetch failed" in caplog.text
            assert broker.high_watermark("t", 0) == 1

    asyncio.run(main())
