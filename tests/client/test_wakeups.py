"""How many loop turns a newly stored message takes from the socket to the reader's code,
against a real broker on port 0: the answer of a pull consumer's long-poll fetch and a
subscriber's push frame are handed to the waiting ``poll`` in the turn after the one that read
them (asyncio.wait and asyncio.wait_for took one and two turns more).

Turns are counted by a callback that schedules itself again every turn, never by a clock.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.client._support import PROMPT_S, addr, run, serve, until_waiting
from tidewire.client import AsyncConsumer, AsyncProducer, AsyncSubscriber
from tidewire.errors import ConnectionLostError


class Turns:
    """Counts the event loop's turns: a callback that runs once in each and schedules itself
    for the next (it keeps the loop from sleeping while it runs: stop it)."""

    def __init__(self) -> None:
        self.n = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.n += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def poll_one(reader: AsyncConsumer | AsyncSubscriber, turns: list[Turns]) -> Any:
    """The one record the next poll returns, and the turn it returned in."""
    got = await reader.poll(timeout_s=PROMPT_S)
    assert len(got) == 1
    return got[0], turns[0].n


def test_a_fetch_answer_wakes_a_waiting_poll_in_the_next_turn(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with (
                AsyncProducer(addr(server), linger_ms=0) as p,
                AsyncConsumer(addr(server), max_wait_ms=int(PROMPT_S * 1000)) as c,
            ):
                await c.assign([("t", 0, "latest")])
                for i in range(3):
                    read_at: list[int] = []
                    turns: list[Turns] = []
                    fetched = c._fetched

                    def seen(
                        *args: Any,
                        fetched: Any = fetched,
                        at: list[int] = read_at,
                        turns: list[Turns] = turns,
                    ) -> None:
                        at.append(turns[0].n)
                        fetched(*args)

                    c._fetched = seen  # type: ignore[method-assign]
                    polling = asyncio.ensure_future(poll_one(c, turns))
                    await until_waiting(broker, 1)  # the long-poll is in the broker
                    turns.append(Turns())
                    try:
                        await p.send("t", b"m%d" % i)
                        record, returned_at = await asyncio.wait_for(polling, PROMPT_S)
                    finally:
                        turns[0].stop()
                    assert record.value == b"m%d" % i
                    assert read_at, "the answer came by request_soon"
                    assert returned_at - read_at[-1] == 1

    run(main())


def test_a_poll_waiting_for_a_fetch_that_is_dropped_is_woken(tmp_path: Path) -> None:
    """``close`` drops the fetch a poll is waiting for: the poll ends (as before, with the
    cancelled fetch's error) rather than wait out its timeout."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            c = AsyncConsumer(addr(server), max_wait_ms=60_000)
            await c.assign([("t", 0, "earliest")])
            polling = asyncio.ensure_future(c.poll(timeout_s=60))
            await until_waiting(broker, 1)
            await c.close()
            with pytest.raises((asyncio.CancelledError, ConnectionLostError)):
                await asyncio.wait_for(polling, PROMPT_S)

    run(main())


def test_a_push_frame_wakes_a_waiting_poll_in_the_next_turn(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with (
                AsyncProducer(addr(server), linger_ms=0) as p,
                AsyncSubscriber(addr(server)) as sub,
            ):
                await sub.subscribe([("t", 0, "latest")])
                for i in range(3):
                    read_at: list[int] = []
                    turns = [Turns()]
                    on_push = sub._on_push

                    def seen(
                        ev: Any,
                        on_push: Any = on_push,
                        at: list[int] = read_at,
                        turns: list[Turns] = turns,
                    ) -> None:
                        at.append(turns[0].n)
                        on_push(ev)

                    for link in sub._links:
                        link.transport.on_push = seen
                    try:
                        polling = asyncio.ensure_future(poll_one(sub, turns))
                        await asyncio.sleep(0)  # the poll waits
                        await p.send("t", b"m%d" % i)
                        record, returned_at = await asyncio.wait_for(polling, PROMPT_S)
                    finally:
                        turns[0].stop()
                    assert record.value == b"m%d" % i
                    assert len(read_at) == 1
                    assert returned_at - read_at[0] == 1

    run(main())


def test_credit_for_lone_pushes_is_given_back_without_a_task(tmp_path: Path) -> None:
    """Each lone message handed out gives its bytes back to the broker at once (each is a
    quarter of this small window or more): the grant is written from the poll's step and
    answered in the read callback, no task per grant, and every byte received is granted
    back."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with (
                AsyncProducer(addr(server), linger_ms=0) as p,
                AsyncSubscriber(addr(server), credit_bytes=256) as sub,
            ):
                await sub.subscribe([("t", 0, "latest")])
                tasks = 0
                send_credit = sub._send_credit

                async def counted(*args: Any) -> None:
                    nonlocal tasks
                    tasks += 1
                    await send_credit(*args)

                sub._send_credit = counted  # type: ignore[method-assign]
                for i in range(5):
                    await (await p.send("t", b"m%d" % i))
                    got = await sub.poll(timeout_s=PROMPT_S)
                    assert [r.value for r in got] == [b"m%d" % i]

                async def all_granted() -> None:
                    while sub.stats.granted < sub.stats.received:
                        await asyncio.sleep(0)

                await asyncio.wait_for(all_granted(), PROMPT_S)
                assert sub.stats.granted == sub.stats.received > 0
                assert tasks == 0

    run(main())


def test_a_seek_while_a_poll_waits_refetches_instead_of_cancelling_the_poll(
    tmp_path: Path,
) -> None:
    """The waiting poll's fetch is dropped by the seek: the poll fetches from the new
    position (it does not raise CancelledError as if its own task had been cancelled)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0) as p:
                for i in range(3):
                    await (await p.send("t", b"v%d" % i))
            c = AsyncConsumer(addr(server), max_wait_ms=60_000)
            try:
                await c.assign([("t", 0, "latest")])
                polling = asyncio.ensure_future(c.poll(timeout_s=PROMPT_S))
                await until_waiting(broker, 1)
                await c.seek("t", 0, 0)
                got = await asyncio.wait_for(polling, PROMPT_S)
                assert [r.value for r in got] == [b"v0", b"v1", b"v2"]
            finally:
                await c.close()

    run(main())


def test_concurrent_polls_share_the_records_once_each(tmp_path: Path) -> None:
    """Three polls of one consumer woken by the same answers: every record handed out once,
    in order (a woken poll must not forget the next fetch another poll sent)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            c = AsyncConsumer(addr(server), max_wait_ms=60_000)
            try:
                await c.assign([("t", 0, "earliest")])
                seen: list[bytes] = []

                async def poller() -> None:
                    while len(seen) < 200:
                        got = await c.poll(timeout_s=0.5, max_records=7)
                        seen.extend(r.value or b"" for r in got)

                tasks = [asyncio.ensure_future(poller()) for _ in range(3)]
                async with AsyncProducer(addr(server), linger_ms=0) as p:
                    for i in range(200):
                        await p.send("t", b"%d" % i)
                        if i % 10 == 0:
                            await asyncio.sleep(0.001)
                    await p.flush()
                await asyncio.wait_for(asyncio.gather(*tasks), PROMPT_S)
                assert seen == [b"%d" % i for i in range(200)]
            finally:
                await c.close()

    run(main())
