"""Many requests in flight on one connection: each answered once, matched by correlation id,
in whatever order they finish; beyond ``max_in_flight`` the server stops reading and resumes
as responses go out, so everything is still answered; a client that half-closes after
pipelining still gets every answer before the server closes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.server._support import (
    ALL,
    LONG_POLL_MS,
    Client,
    batch,
    read_partition,
    records,
    serve,
    until,
)
from tidewire.errors import InvalidRequestError
from tidewire.protocol.messages import (
    ACKS_LEADER,
    ACKS_NONE,
    EARLIEST,
    ApiKey,
    Body,
    CreateTopicRequest,
    DescribeTopicRequest,
    FetchPartition,
    FetchRequest,
    InitProducerIdRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    MetadataRequest,
    PingRequest,
    ProducePartition,
    ProduceRequest,
)

PARTITIONS = 4


def _request(i: int) -> tuple[Body, list[bytes]]:
    """The ``i``-th request of a mixed pipeline, and its data section."""
    p = i % PARTITIONS
    match i % 5:
        case 0:
            return PingRequest(), []
        case 1:
            data = batch([f"m{i}".encode()])
            return ProduceRequest(
                acks=ACKS_LEADER, partitions=[ProducePartition("t", p, len(data))]
            ), [data]
        case 2:
            return ListOffsetsRequest(partitions=[ListOffsetsPartition("t", p, EARLIEST)]), []
        case 3:
            return DescribeTopicRequest(name="t"), []
        case _:
            return MetadataRequest(topics=["t"]), []


def test_pipelined_requests_are_answered_by_correlation_id(tmp_path: Path) -> None:
    n = 250  # under the server's default max_in_flight (256): all read at once

    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=PARTITIONS))
            c.arrivals.clear()
            sent = {c.send(*_request(i)): i for i in range(n)}  # one write, no waiting
            await c.writer.drain()
            produced: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value
            for corr, i in sent.items():
                event = await c.response(corr)
                assert event.error is None, (i, event.error)
                body, p = event.body, i % PARTITIONS
                assert body.api_key == _request(i)[0].api_key
                match i % 5:
                    case 1:
                        (r,) = body.results
                        assert (r.topic, r.partition, r.error_code) == ("t", p, 0)
                        assert (p, r.base_offset) not in produced
                        produced[(p, r.base_offset)] = f"m{i}".encode()
                    case 2:
                        (r,) = body.results
                        assert (r.partition, r.offset, r.error_code) == (p, 0, 0)
                    case 3:
                        assert body.topic.name == "t"
                    case 4:
                        assert [t.name for t in body.topics] == ["t"]
            assert sorted(c.arrivals) == sorted(sent)  # each answered exactly once
            assert c.early == {}

            # Each acknowledged offset holds the value that was sent with it.
            stored = {
                (p, r.offset): r.value
                for p in range(PARTITIONS)
                for r in await read_partition(c, "t", p)
            }
            assert stored == produced

    asyncio.run(main())


def test_responses_come_in_any_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t"))
            fetch = c.send(
                FetchRequest(max_wait_ms=LONG_POLL_MS, partitions=[FetchPartition("t", 0, 0, ALL)])
            )
            pings = [c.send(PingRequest()) for _ in range(10)]
            for corr in pings:
                await c.response(corr)
            assert fetch not in c.early  # still waiting, after everything sent later

            data = batch([b"late"])  # on the same connection: wakes the fetch
            await c.call(ProduceRequest(partitions=[ProducePartition("t", 0, len(data))]), [data])
            event = await c.response(fetch)
            assert [r.value for r in records(bytes(event.data))] == [b"late"]
            assert c.arrivals.index(fetch) > c.arrivals.index(pings[-1])

    asyncio.run(main())


def test_more_than_max_in_flight_are_all_answered(tmp_path: Path) -> None:
    n = 200

    async def main() -> None:
        async with (
            serve(tmp_path, max_in_flight=4) as (broker, server),
            Client.connect(server) as c,
        ):
            await c.call(CreateTopicRequest(name="t", partitions=PARTITIONS))
            c.arrivals.clear()
            expect: dict[int, type[Exception] | None] = {}
            quiet = 0
            for i in range(n):
                match i % 10:
                    case 7:  # no response at all: must still free its slot
                        data = batch([b"quiet"])
                        corr = c.send(
                            ProduceRequest(
                                acks=ACKS_NONE, partitions=[ProducePartition("t", 0, len(data))]
                            ),
                            [data],
                        )
                        c.conn.forget(corr, expect_response=False)
                        quiet += 1
                    case 8:  # a producer id: answered by the broker between the produces
                        expect[c.send(InitProducerIdRequest())] = None
                    case 9:  # refused by the produce handler
                        data = batch([b"x"])
                        body = ProduceRequest(partitions=[ProducePartition("t", 0, len(data) + 1)])
                        expect[c.send(body, [data])] = InvalidRequestError
                    case _:
                        expect[c.send(*_request(i))] = None
            await c.writer.drain()
            for corr, error in expect.items():
                event = await c.response(corr)
                if error is None:
                    assert event.error is None, event.error
                else:
                    assert isinstance(event.error, error)
            assert sorted(c.arrivals) == sorted(expect)
            await c.ping()
            produced = sum(1 for i in range(n) if i % 10 != 7 and i % 5 == 1)

            def stored() -> int:
                return sum(s.log_end_offset for s in broker.describe("t"))

            # The acks=0 batches land in their own time: none of them is lost.
            await until(lambda: stored() >= produced + quiet)
            assert stored() == produced + quiet

    asyncio.run(main())


def test_a_full_connection_reads_on_once_a_response_goes_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, max_in_flight=4) as (_, server),
            Client.connect(server) as c,
            Client.connect(server) as producer,
        ):
            await producer.call(CreateTopicRequest(name="t"))
            fetches = [
                c.send(
                    FetchRequest(
                        max_wait_ms=LONG_POLL_MS, partitions=[FetchPartition("t", 0, 0, ALL)]
                    )
                )
                for _ in range(4)
            ]
            ping = c.send(PingRequest())  # the fifth: not read while four wait
            await c.writer.drain()
            for _ in range(3):
                await producer.ping()
            data = batch([b"go"])
            await producer.call(
                ProduceRequest(partitions=[ProducePartition("t", 0, len(data))]), [data]
            )
            await c.response(ping)
            for corr in fetches:
                assert (await c.response(corr)).body.partitions[0].size == len(data)
            assert c.arrivals[0] in fetches  # the ping could only start after one fetch ended
            assert c.arrivals[0] != ping

    asyncio.run(main())


def test_half_close_after_pipelining_still_gets_every_answer(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, max_in_flight=4) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=PARTITIONS))
            c.arrivals.clear()
            sent = {c.send(*_request(i)): i for i in range(60)}
            c.writer.write_eof()
            responses = await c.until_closed()
            assert sorted(r.correlation_id for r in responses) == sorted(sent)
            assert all(r.error is None for r in responses)
            assert {r.api_key for r in responses} == {
                ApiKey.PING,
                ApiKey.PRODUCE,
                ApiKey.LIST_OFFSETS,
                ApiKey.DESCRIBE_TOPIC,
                ApiKey.METADATA,
            }

    asyncio.run(main())
