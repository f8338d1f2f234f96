"""The broker's per-request paths do not ask asyncio for the running loop: on CPython 3.11
every ``asyncio.get_running_loop()`` is a ``getpid`` system call, and the produce fast path
asked once a request (its duplicate-detection future), a long-poll twice (its future and its
timer). The broker keeps the loop it was started on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.broker._support import ALL, config
from tidewire.broker import Broker
from tidewire.records import BatchBuilder
from tidewire.storage import FsyncPolicy, LogConfig


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ``asyncio.get_running_loop()`` call."""
    calls: list[int] = []
    inner = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        calls.append(1)
        return inner()

    monkeypatch.setattr(asyncio, "get_running_loop", counted)
    return calls


def _idempotent(seq: int) -> bytes:
    b = BatchBuilder(producer_id=7, producer_epoch=0, base_sequence=seq)
    b.append(b"v", timestamp_ms=1_700_000_000_000)
    return b.build()


def test_fast_produces_and_a_woken_long_poll_ask_for_no_loop(
    tmp_path: Path, asked: list[int]
) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            b.create_topic("t", 1, LogConfig(fsync=FsyncPolicy.ALWAYS))
            settled: list[Any] = []
            done = asyncio.Event()

            def callback(r: Any, exc: BaseException | None) -> None:
                settled.append((r, exc))
                if len(settled) == 4:
                    done.set()

            # The log asks once, at its first append (storage's own, not the broker's).
            assert b.produce_soon("t", 0, _idempotent(0), durable=None, callback=callback)
            asked.clear()
            for seq in range(1, 4):
                assert b.produce_soon("t", 0, _idempotent(seq), durable=None, callback=callback)
            assert asked == []
            await asyncio.wait_for(done.wait(), 5)
            assert [r.base_offset for r, _ in settled] == [0, 1, 2, 3]

            poll = asyncio.ensure_future(b.fetch([("t", 0, 4, ALL)], max_wait_ms=30_000))
            for _ in range(20):  # bounded: the fetch reaches its wait
                await asyncio.sleep(0)
            asked.clear()
            woke = asyncio.Event()
            assert b.produce_soon(
                "t", 0, _idempotent(4), durable=None, callback=lambda r, e: woke.set()
            )
            (r,) = await asyncio.wait_for(poll, 5)
            assert r.next_offset == 5
            assert asked == []

    asyncio.run(main())


def test_a_broker_started_on_one_loop_serves_a_long_poll_on_another(tmp_path: Path) -> None:
    """The loop kept is used only while it runs: a broker started by one ``asyncio.run`` and
    used by the next (a test, a script) asks for the running loop again."""
    broker = Broker(config(tmp_path))
    asyncio.run(broker.start())  # that loop is closed when this returns

    async def use() -> None:
        broker.create_topic("t", 1)
        (result,) = await asyncio.wait_for(broker.fetch([("t", 0, 0, ALL)], max_wait_ms=50), 5)
        assert (result.data, result.next_offset) == (b"", 0)

    asyncio.run(use())
