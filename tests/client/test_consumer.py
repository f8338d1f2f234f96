"""The consumer by partition and offset against a real broker on port 0, both twins
(:class:`AsyncConsumer` and :class:`Consumer`): positions from earliest, latest, an offset
and a time; iteration and poll; the long-poll woken by new data; seek; a lost connection."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.client._producer_support import CuttingProxy, consuming
from tests.client._support import PROMPT_S, T0, addr, run, serve, until_waiting
from tidewire.broker import Broker
from tidewire.client import AsyncConsumer, Consumer, ConsumerRecord
from tidewire.errors import UnknownTopicError
from tidewire.protocol.messages import ApiKey
from tidewire.records import BatchBuilder


async def put(
    broker: Broker, topic: str, partition: int, values: list[bytes], ts: int = T0
) -> None:
    """Store ``values`` as one batch, record ``i`` at time ``ts + i``."""
    b = BatchBuilder()
    for i, v in enumerate(values):
        b.append(v, key=b"k" + v, headers=[("i", b"%d" % i)], timestamp_ms=ts + i)
    await broker.produce(topic, partition, b.build())


def values(records: list[ConsumerRecord]) -> list[bytes | None]:
    return [r.value for r in records]


def test_iterates_from_earliest_across_partitions(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            await put(broker, "t", 0, [b"a0", b"a1"])
            await put(broker, "t", 1, [b"b0"])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign([("t", 0, "earliest"), ("t", 1, "earliest")])
                got = await c.take(3)
                assert sorted(values(got)) == [b"a0", b"a1", b"b0"]
                r = next(r for r in got if r.value == b"a1")
                assert (r.topic, r.partition, r.offset, r.timestamp) == ("t", 0, 1, T0 + 1)
                assert (r.key, r.headers) == (b"ka1", (("i", b"1"),))
                assert (c.position("t", 0), c.position("t", 1)) == (2, 1)
                assert sorted(c.assignment()) == [("t", 0), ("t", 1)]

    run(main())


def test_latest_offset_and_time_positions(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"%d" % i for i in range(10)])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                # An offset inside a batch: the records before it are skipped.
                await c.assign([("t", 0, 7)])
                assert values(await c.take(3)) == [b"7", b"8", b"9"]
                when = datetime.fromtimestamp((T0 + 4) / 1000, tz=UTC)
                await c.assign([("t", 0, when)])
                assert c.position("t", 0) == 4
                assert values(await c.take(1)) == [b"4"]
                await c.assign([("t", 0, "latest")])
                assert c.position("t", 0) == 10
                assert await c.poll(0.05) == []
                await put(broker, "t", 0, [b"new"])
                assert values(await c.poll(PROMPT_S)) == [b"new"]

    run(main())


def test_long_poll_wakes_when_data_arrives(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with consuming(kind, addr(server), max_wait_ms=30_000) as c:
                await c.assign([("t", 0, 0)])
                polling = asyncio.ensure_future(c.poll(PROMPT_S * 2))
                await until_waiting(broker, 1)
                await put(broker, "t", 0, [b"hello"])
                got = await asyncio.wait_for(polling, PROMPT_S)
                assert values(got) == [b"hello"]

    run(main())


def test_seek_moves_the_position(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"%d" % i for i in range(6)])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign([("t", 0, "earliest")])
                assert values(await c.take(2)) == [b"0", b"1"]
                await c.seek("t", 0, 4)
                assert c.position("t", 0) == 4
                assert values(await c.take(2)) == [b"4", b"5"]
                await c.seek("t", 0, "earliest")
                assert values(await c.take(1)) == [b"0"]
                with pytest.raises(ValueError, match="not assigned"):
                    await c.seek("t", 9, 0)

    run(main())


def test_poll_limits_and_errors(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"%d" % i for i in range(10)])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                with pytest.raises(ValueError, match="assign"):
                    await c.poll(0)
                await c.assign([("t", 0, 0)])
                first = await c.poll(PROMPT_S, max_records=4)
                assert values(first) == [b"0", b"1", b"2", b"3"]
                assert c.position("t", 0) == 4
                with pytest.raises(UnknownTopicError):
                    await c.assign([("missing", 0, "earliest")])
                with pytest.raises(ValueError, match="negative"):
                    await c.assign([("t", 0, -5)])
                with pytest.raises(ValueError, match="earliest"):
                    await c.assign([("t", 0, "soonest")])

    run(main())


def test_a_lost_connection_resumes_from_the_position(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"a", b"b"])
            async with (
                CuttingProxy(server.port, api=ApiKey.FETCH, cut_responses=1) as proxy,
                consuming(kind, proxy.addr, max_wait_ms=50) as c,
            ):
                await c.assign([("t", 0, 0)])
                assert values(await c.take(2)) == [b"a", b"b"]
                assert proxy.cuts == 1
                await put(broker, "t", 0, [b"c"])
                proxy.cut_all()
                assert values(await c.take(1)) == [b"c"]
                assert proxy.connections >= 3

    run(main())


def test_consumer_is_the_blocking_twin() -> None:
    import inspect

    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            n: inspect.signature(m)
            for n, m in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_")
        }

    a, s = public(AsyncConsumer), public(Consumer)
    assert (
        sorted(a)
        == sorted(s)
        == ["assign", "assignment", "close", "poll", "poll_batch", "position", "seek"]
    )
    for name in a:
        assert a[name] == s[name], name
    assert inspect.signature(AsyncConsumer.__init__) == inspect.signature(Consumer.__init__)


def test_a_seek_does_not_wait_for_the_long_poll_on_its_way(tmp_path: Path) -> None:
    """Caught up, the consumer's next fetch waits on the broker (a long-poll of max_wait_ms);
    a seek back drops it, so the next poll answers from the new position at once, for each
    way of reading."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"%d" % i for i in range(5)])
            for how in ("poll", "poll_batch"):
                async with AsyncConsumer(addr(server), max_wait_ms=30_000) as c:
                    await c.assign([("t", 0, "earliest")])
                    got = (
                        await c.poll(PROMPT_S)
                        if how == "poll"
                        else list(await c.poll_batch(PROMPT_S))
                    )
                    assert values(got) == [b"%d" % i for i in range(5)]
                    # The long-poll at the log's end (sent by request or request_soon).
                    assert len(c._t._waiting) + len(c._t._answers) == 1
                    await c.seek("t", 0, 2)
                    assert not c._t._waiting
                    assert not c._t._answers
                    t0 = time.monotonic()
                    again = await c.poll(PROMPT_S)
                    assert values(again) == [b"2", b"3", b"4"], how
                    assert time.monotonic() - t0 < PROMPT_S

    run(main())


def test_the_next_fetch_is_on_its_way_while_records_are_handed_out(tmp_path: Path) -> None:
    """Catch-up overlaps the broker's work with the consumer's: once a fetch's records are
    there, the next fetch's request is already written (before the first of them is handed
    out by iteration, before poll and poll_batch return), not when the buffer runs dry."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"%d" % i for i in range(10)])
            for how in ("iterate", "poll", "poll_batch"):
                async with AsyncConsumer(addr(server), max_wait_ms=5_000) as c:
                    await c.assign([("t", 0, "earliest")])
                    if how == "iterate":
                        assert (await anext(aiter(c))).value == b"0"
                        assert len(c._buffer) == 9  # still to hand out, and meanwhile:
                    elif how == "poll":
                        assert len(await c.poll(PROMPT_S, max_records=4)) == 4
                    else:
                        assert len(await c.poll_batch(PROMPT_S, max_records=4)) == 4
                    # The next fetch waits on the broker (sent by request or request_soon).
                    assert len(c._t._waiting) + len(c._t._answers) == 1
                    await put(broker, "t", 0, [b"late"])  # and brings it
                    got: list[ConsumerRecord] = []
                    for _ in range(3):  # the rest of the first fetch, then the second
                        got += await c.poll(PROMPT_S)
                        if got and got[-1].value == b"late":
                            break
                    assert values(got)[-1] == b"late", how

    run(main())


def test_a_connected_consumer_fetches_without_a_task(tmp_path: Path) -> None:
    """Once connected to a single node, a fetch is written at once and its answer read into
    a future from the read callback (Transport.request_soon), not by a task per fetch: the
    records reach a waiting poll one loop turn sooner. A long-poll dropped by a seek is
    forgotten by the transport too."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"a"])
            async with AsyncConsumer(addr(server), max_wait_ms=5_000) as c:
                await c.assign([("t", 0, "earliest")])
                assert values(await c.poll(PROMPT_S)) == [b"a"]  # connects (a task)
                fetch = c._fetch
                assert fetch is not None
                assert not isinstance(fetch, asyncio.Task)
                assert len(c._t._answers) == 1
                await put(broker, "t", 0, [b"b"])
                assert values(await c.poll(PROMPT_S)) == [b"b"]
                await c.seek("t", 0, 0)
                assert not c._t._answers
                assert values(await c.poll(PROMPT_S)) == [b"a", b"b"]

    run(main())
