"""The listener's fetch fast path: a fetch the broker can answer at once (data there, or no
wait asked for) is answered in the read callback, without a task; one that must wait, or
whose partition fails, takes the task path and is answered as before.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.server._support import (
    ALL,
    LONG_POLL_MS,
    PROMPT_S,
    Client,
    batch,
    records,
    reset,
    serve,
)
from tidewire.errors import BackpressureError, UnknownTopicError
from tidewire.protocol.messages import (
    ApiKey,
    CreateTopicRequest,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ProducePartition,
    ProduceRequest,
    TopicConfig,
)
from tidewire.server import tcp

FETCH = int(ApiKey.FETCH)


def _fetch(offset: int, *, topic: str = "t", partition: int = 0, **kw: Any) -> FetchRequest:
    return FetchRequest(partitions=[FetchPartition(topic, partition, offset, ALL)], **kw)


async def _park(c: Client, n: int = 1) -> list[int]:
    """Send ``n`` long-poll fetches of partition t-0 from offset 0 and wait until the server
    has read them (a ping answered after them): their correlation ids."""
    corrs = [c.send(_fetch(0, max_wait_ms=LONG_POLL_MS)) for _ in range(n)]
    await c.writer.drain()
    await c.ping()
    return corrs


async def _produce(c: Client, values: list[bytes]) -> None:
    data = batch(values)
    await c.call(ProduceRequest(partitions=[ProducePartition("t", 0, len(data))]), [data])


def test_a_fetch_with_data_there_takes_no_task(tmp_path: Path, tasks_of: list[int]) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            await _produce(c, [b"a", b"b"])
            await _produce(c, [b"c"])
            tasks_of.clear()
            for offset, want in ((0, [b"a", b"b", b"c"]), (2, [b"c"])):
                event = await c.rpc(_fetch(offset, max_wait_ms=LONG_POLL_MS))
                body = event.body
                assert isinstance(body, FetchResponse)
                (p,) = body.partitions
                assert (p.error_code, p.high_watermark) == (0, 3)
                got = [r.value for r in records(bytes(event.data)) if r.offset >= offset]
                assert got == want
            # Nothing there and no wait asked for: answered at once, empty.
            body = (await c.rpc(_fetch(3, max_wait_ms=0))).body
            assert body.partitions[0].size == 0
            assert FETCH not in tasks_of
            assert broker_delivered(server) == 3 + 1

    asyncio.run(main())


def broker_delivered(server: Any) -> int:
    return int(server.broker.stats.delivered)


def test_a_fetch_that_waits_takes_no_task_and_is_answered_by_the_append(
    tmp_path: Path, tasks_of: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[Any] = []
    inner = tcp.fetch_now

    def counted(b: Any, req: Any) -> Any:
        tried.append(req)
        return inner(b, req)

    # A reader caught up waits without a read that finds nothing, and without a task.
    monkeypatch.setattr(tcp, "fetch_now", counted)

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            async with Client.connect(server) as producer:
                tasks_of.clear()
                corr = c.send(_fetch(0, max_wait_ms=LONG_POLL_MS))
                await c.writer.drain()
                await c.ping()  # the fetch has reached its wait
                assert broker.fetch_waiters == 1
                (conn,) = [x for x in server.connections if x.parked]
                assert FETCH not in tasks_of
                assert tried == []
                await _produce(producer, [b"x"])
                event = await c.response(corr)
                assert [r.value for r in records(bytes(event.data))] == [b"x"]
                assert FETCH not in tasks_of
                assert (broker.fetch_waiters, conn.parked, broker._waiters) == (0, set(), {})
                assert broker_delivered(server) == 1

    asyncio.run(main())


def test_a_waiting_fetch_is_answered_empty_when_its_wait_is_over(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            tasks_of.clear()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            event = await c.rpc(_fetch(0, max_wait_ms=150))
            waited = loop.time() - t0
            (p,) = event.body.partitions
            assert (p.error_code, p.size, p.high_watermark) == (0, 0, 0)
            assert waited >= 0.14
            assert FETCH not in tasks_of
            assert (broker.fetch_waiters, broker._waiters) == (0, {})

    asyncio.run(main())


def test_a_waiting_fetch_whose_partition_goes_gets_the_task_paths_error(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    """Nothing is delivered from the wake-up's failed read: the task path reads again and
    answers with the partition's own error."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            tasks_of.clear()
            (corr,) = await _park(c)
            assert broker.fetch_waiters == 1
            await broker.delete_topic_async("t")
            event = await c.response(corr)
            (p,) = event.body.partitions
            assert p.error_code == UnknownTopicError.code
            assert tasks_of.count(FETCH) == 1
            assert (broker.fetch_waiters, broker._waiters) == (0, {})

    asyncio.run(main())


def test_a_waiting_fetch_of_a_connection_that_breaks_is_dropped(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            async with Client.connect(server) as c:
                await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
                await _park(c)
                assert broker.fetch_waiters == 1
                reset(c.writer)
            while server.connections:
                await asyncio.sleep(0.001)
            assert (broker.fetch_waiters, broker._waiters) == (0, {})
            async with Client.connect(server) as producer:
                await _produce(producer, [b"x"])  # wakes nothing left behind

    asyncio.run(main())


def test_waiting_fetches_are_bounded_and_released_by_a_drain(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    """Past ``max_fetch_waiters`` a fetch is refused (the task path's BackpressureError);
    a drain answers the waiting ones with what there is, then the connection goes away."""

    async def main() -> None:
        async with (
            serve(tmp_path, broker={"max_fetch_waiters": 2}) as (broker, server),
            Client.connect(server) as c,
        ):
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            waiting = await _park(c, 2)
            assert broker.fetch_waiters == 2
            tasks_of.clear()
            refused = await c.response(c.send(_fetch(0, max_wait_ms=LONG_POLL_MS)))
            assert refused.error is not None
            assert refused.error.code == BackpressureError.code
            assert tasks_of == [FETCH]
            server.begin_drain()  # the server's part: the connection waits for them
            broker.release_waiters()  # the broker's part
            for corr in waiting:
                (p,) = (await c.response(corr)).body.partitions
                assert (p.error_code, p.size) == (0, 0)
            assert (broker.fetch_waiters, broker._waiters) == (0, {})

    asyncio.run(main())


def test_a_failing_partition_is_answered_by_the_task_path(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            await _produce(c, [b"a"])
            tasks_of.clear()
            req = FetchRequest(
                max_wait_ms=0,
                partitions=[FetchPartition("t", 0, 0, ALL), FetchPartition("nope", 0, 0, ALL)],
            )
            event = await c.rpc(req)
            ok, missing = event.body.partitions
            assert (ok.error_code, ok.size > 0) == (0, True)
            assert missing.error_code != 0
            assert tasks_of == [FETCH]

    asyncio.run(main())


def test_a_released_fetch_without_room_for_its_answer_does_not_wait_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiting fetch whose answer does not fit when it is released goes to the task path,
    which waits for room and answers with what there is: its long-poll is over, it does not
    begin a new one (nor past its own deadline)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            (corr,) = await _park(c)
            assert broker.fetch_waiters == 1
            real = tcp._ClientProtocol._unsent

            def full(self: Any) -> int:  # once: no room for the answer when it is released
                monkeypatch.setattr(tcp._ClientProtocol, "_unsent", real)
                return server.config.max_unsent_bytes

            monkeypatch.setattr(tcp._ClientProtocol, "_unsent", full)
            broker.release_waiters()
            (p,) = (await c.response(corr)).body.partitions
            assert (p.error_code, p.size) == (0, 0)
            assert (broker.fetch_waiters, broker._waiters) == (0, {})

    asyncio.run(main())


def test_a_drain_waits_for_a_released_fetch_that_went_on_in_a_task(tmp_path: Path) -> None:
    """A waiting fetch released by a drain with no room for its answer goes on in a task
    (waiting for room): the drain's wait for what is in flight waits for that task too."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=TopicConfig(fsync="always")))
            (corr,) = await _park(c)
            (conn,) = [x for x in server.connections if x.parked]
            conn.reserved = server.config.max_unsent_bytes  # no room for any answer
            loop = asyncio.get_running_loop()

            def room_again() -> None:
                conn.reserved = 0
                conn._wake_output_waiters()

            loop.call_later(0.2, room_again)
            server.begin_drain()
            broker.release_waiters()
            left = await server.wait_in_flight(loop.time() + PROMPT_S)
            assert left == 0
            assert not conn.tasks
            (p,) = (await c.response(corr)).body.partitions
            assert (p.error_code, p.size) == (0, 0)

    asyncio.run(main())
