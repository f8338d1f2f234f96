"""Streams waited on are out of the timer wheel: a tick costs nothing for them however many
wait (it looked at each one an idle time after it started waiting, and every idle time
again: ticks of 100-300 ms with 100,000 receivers), and the last receiver to leave puts the
stream back, so it is still forgotten an idle time later. A stream holding messages keeps
its place for their expiry, and a hand-over nobody took leaves its stream to be forgotten."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker._support import PROMPT_S
from tests.broker.streams._support import FakeClock, streams_broker
from tests.broker.streams.test_manager import until
from tidewire.broker.streams.model import SendItem


def test_waited_streams_leave_the_wheel_and_come_back_when_left(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=10_000) as (_, st):
            ids = [f"w{i}" for i in range(200)]
            waits = [asyncio.create_task(st.receive([sid], wait_ms=300_000)) for sid in ids]
            await until(lambda: st.stats().receivers == 200, "all wait")
            assert all(st._streams[sid].due == 0 for sid in ids)  # no timer of their own
            for _ in range(3):
                clock.advance(11_000)
                st.tick()
                assert st.stats().streams == 200
                assert all(st._streams[sid].due == 0 for sid in ids)
            st.release_waiters()
            assert await asyncio.wait_for(asyncio.gather(*waits), PROMPT_S) == [[]] * 200
            assert all(st._streams[sid].due > 0 for sid in ids)  # back in the wheel
            clock.advance(9_000)
            st.tick()
            assert st.stats().streams == 200  # idle for 9 s of 10
            clock.advance(2_000)
            st.tick()
            assert st.stats().streams == 0
            assert st.stats().evicted == 200

    asyncio.run(main())


def test_a_waited_stream_holding_messages_still_expires_them(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=10_000) as (_, st):
            await st.send([SendItem("p", b"old", ttl_ms=5_000, persistent=True)])
            reading = asyncio.create_task(st.read({"p": "$"}, wait_ms=300_000))
            await until(lambda: st.stats().receivers == 1, "the read waits")
            assert st._streams["p"].due > 0  # its message's expiry
            clock.advance(6_000)
            st.tick()
            assert st.stats().expired == 1
            assert st.describe("p") is not None  # waited on: kept
            st.release_waiters()
            msgs, _ = await asyncio.wait_for(reading, PROMPT_S)
            assert msgs == []
            clock.advance(11_000)
            st.tick()
            assert st.describe("p") is None

    asyncio.run(main())


def test_a_hand_over_nobody_took_leaves_its_stream_to_be_forgotten(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=10_000) as (_, st):
            (res,) = await st.send([SendItem("h", b"x")], ring_size=0, block_ms=50)
            assert res.code != 0  # nobody came to take it
            assert st.describe("h") is not None
            clock.advance(11_000)
            st.tick()
            assert st.describe("h") is None

    asyncio.run(main())
