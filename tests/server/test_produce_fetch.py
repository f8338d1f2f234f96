"""Produce, fetch and list offsets over the wire: offsets under each acks, no response for
acks=0 (and the data stored all the same), request-level refusals that leave the connection
working, per-partition errors for malformed batches, raw batches in fetch responses, long-polls
woken by another connection's produce, and offsets by position and by timestamp.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.server._support import (
    ALL,
    LONG_POLL_MS,
    PROMPT_S,
    T0,
    Client,
    batch,
    read_partition,
    records,
    serve,
    split_batches,
)
from tidewire.errors import (
    BackpressureError,
    BatchLengthError,
    BatchTooLargeError,
    CorruptBatchError,
    InvalidMagicError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    RecordCountError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    ACKS_LEADER,
    ACKS_NONE,
    EARLIEST,
    LATEST,
    CreateTopicRequest,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    TopicConfig,
)
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.records.batch import MAGIC_OFFSET


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


@pytest.mark.parametrize("acks", [ACKS_DURABLE, ACKS_LEADER])
def test_produce_returns_offsets(tmp_path: Path, acks: int) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=2))
            p0 = batch(_values("a", 3)) + batch(_values("b", 2))  # two batches for p0
            p1 = batch(_values("c", 4))
            request = ProduceRequest(
                acks=acks,
                partitions=[ProducePartition("t", 0, len(p0)), ProducePartition("t", 1, len(p1))],
            )
            resp = await c.call(request, [p0, p1])
            assert isinstance(resp, ProduceResponse)
            assert [(r.topic, r.partition, r.base_offset, r.error_code) for r in resp.results] == [
                ("t", 0, 0, 0),
                ("t", 1, 0, 0),
            ]
            assert all(r.log_start_offset == 0 for r in resp.results)

            again = await c.call(
                ProduceRequest(acks=acks, partitions=[ProducePartition("t", 0, len(p1))]), [p1]
            )
            assert [(r.partition, r.base_offset) for r in again.results] == [(0, 5)]

            got = await read_partition(c, "t", 0)
            assert [(r.offset, r.value) for r in got] == list(
                enumerate(_values("a", 3) + _values("b", 2) + _values("c", 4))
            )

    asyncio.run(main())


def test_produce_acks_none_gets_no_response_and_is_stored(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t"))
            data = batch(_values("quiet", 3))
            corr = c.send(
                ProduceRequest(acks=ACKS_NONE, partitions=[ProducePartition("t", 0, len(data))]),
                [data],
            )
            # From here on, any frame answering ``corr`` is a response to a request that is
            # not in flight: the client's Connection would fail on it.
            c.conn.forget(corr, expect_response=False)
            await c.ping()

            # The data shows up (the long-poll returns as soon as it is there).
            body, raw = await c.fetch("t", 0, max_wait_ms=LONG_POLL_MS)
            assert body.partitions[0].error_code == 0
            assert [r.value for r in records(raw)] == _values("quiet", 3)

            # Many more, pipelined, then one request that is answered: nothing else came back.
            for _ in range(20):
                corr = c.send(
                    ProduceRequest(
                        acks=ACKS_NONE, partitions=[ProducePartition("t", 0, len(data))]
                    ),
                    [data],
                )
                c.conn.forget(corr, expect_response=False)
            await c.ping()
            offset = 3
            while offset < 63:  # each long-poll returns as soon as more is there
                _, raw = await c.fetch("t", 0, offset, max_wait_ms=LONG_POLL_MS)
                offset = records(raw)[-1].offset + 1
            got = await read_partition(c, "t", 0)
            assert [r.value for r in got] == _values("quiet", 3) * 21
            await c.ping()
            assert c.early == {}

    asyncio.run(main())


def test_produce_acks_none_is_never_answered_even_when_refused(tmp_path: Path) -> None:
    """docs/protocol.md: with acks=0 the client forgets the request at once
    (``forget(id, expect_response=False)``); any answer to it breaks that client."""

    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            data = batch([b"v"])
            corr = c.send(
                ProduceRequest(
                    acks=ACKS_NONE, partitions=[ProducePartition("t", 0, len(data) + 1)]
                ),
                [data],
            )
            c.conn.forget(corr, expect_response=False)
            await c.ping()  # raises ProtocolError if an answer to ``corr`` comes first

    asyncio.run(main())


def test_produce_auto_creates_the_topic(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            data = batch([b"first"])
            resp = await c.call(
                ProduceRequest(partitions=[ProducePartition("fresh", 0, len(data))]), [data]
            )
            assert resp.results[0].error_code == 0
            assert broker.topics() == {"fresh": 1}

    asyncio.run(main())


def test_produce_sizes_must_add_up_to_the_data_section(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=2))
            good = batch([b"v"])
            n = len(good)
            cases = [
                ([ProducePartition("t", 0, n + 1)], [good]),  # more than the data
                ([ProducePartition("t", 0, n - 1)], [good]),  # less than the data
                ([ProducePartition("t", 0, n), ProducePartition("t", 1, n)], [good]),
                ([ProducePartition("t", 0, n), ProducePartition("t", 1, 0)], [good]),
                ([ProducePartition("t", 0, 2 * n), ProducePartition("t", 1, -n)], [good]),
                ([], [good]),
                ([ProducePartition("t", 0, n)], []),
            ]
            for partitions, data in cases:
                event = await c.rpc(ProduceRequest(partitions=partitions), data)
                assert isinstance(event.error, InvalidRequestError), (partitions, event)
                assert event.error.code == 54
                assert event.body is None
                assert len(event.data) == 0
                await c.ping()  # the connection keeps working

            event = await c.rpc(
                ProduceRequest(acks=2, partitions=[ProducePartition("t", 0, n)]), [good]
            )
            assert isinstance(event.error, InvalidRequestError)
            assert "acks=2" in event.error.message

            # Nothing of the refused requests was stored; a good one still is.
            assert [s.log_end_offset for s in broker.describe("t")] == [0, 0]
            resp = await c.call(ProduceRequest(partitions=[ProducePartition("t", 1, n)]), [good])
            assert [(r.partition, r.base_offset, r.error_code) for r in resp.results] == [(1, 0, 0)]

    asyncio.run(main())


def _corrupt_crc(b: bytes) -> bytes:
    out = bytearray(b)
    out[-3] ^= 0xFF
    return bytes(out)


def _magic_1(b: bytes) -> bytes:
    out = bytearray(b)
    out[MAGIC_OFFSET] = 1
    return bytes(out)


def test_malformed_batches_get_their_record_error_per_partition(tmp_path: Path) -> None:
    good = batch(_values("ok", 2))
    bad = {
        1: (_corrupt_crc(batch(_values("x", 2))), CorruptBatchError),
        2: (_magic_1(batch(_values("x", 2))), InvalidMagicError),
        3: (batch(_values("x", 2))[:-5], BatchLengthError),
        4: (BatchBuilder().build(), RecordCountError),  # no record at all
        5: (good + batch([b"y" * 2000]), BatchTooLargeError),  # over max_message_bytes
    }

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(
                CreateTopicRequest(
                    name="t", partitions=6, config=TopicConfig(max_message_bytes=1024)
                )
            )
            partitions = [ProducePartition("t", 0, len(good))]
            data = [good]
            for p, (chunk, _) in bad.items():
                partitions.append(ProducePartition("t", p, len(chunk)))
                data.append(chunk)
            resp = await c.call(ProduceRequest(partitions=partitions), data)
            results = {r.partition: r for r in resp.results}
            assert (results[0].error_code, results[0].base_offset) == (0, 0)
            for p, (_, error) in bad.items():
                assert results[p].error_code == error.code, (p, results[p])
                assert results[p].error_message
                assert results[p].base_offset == -1
            # The good partition was stored, and nothing of the bad ones (all or nothing:
            # partition 5's good first batch is refused with its oversized second one).
            assert [s.log_end_offset for s in broker.describe("t")] == [2, 0, 0, 0, 0, 0]
            await c.ping()

    asyncio.run(main())


def test_fetch_returns_the_raw_batches(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t"))
            sent = [batch(_values("a", 2)), batch(_values("b", 3)), batch(_values("c", 1))]
            for b in sent:
                await c.call(ProduceRequest(partitions=[ProducePartition("t", 0, len(b))]), [b])

            body, data = await c.fetch("t", 0, 0)
            (result,) = body.partitions
            assert (result.topic, result.partition, result.error_code) == ("t", 0, 0)
            assert (result.size, result.high_watermark, result.log_start_offset) == (
                len(data),
                6,
                0,
            )
            headers = [h for _, h in iter_batches(data)]
            assert [(h.base_offset, h.records_count) for h in headers] == [(0, 2), (2, 3), (5, 1)]
            # Stored as sent from the magic byte on (CRC, attributes, records): never
            # re-encoded; only the base offset is the broker's.
            for stored, original in zip(split_batches(data), sent, strict=True):
                assert stored[MAGIC_OFFSET:] == original[MAGIC_OFFSET:]
            values = [(r.offset, r.value) for b in split_batches(data) for r in iter_records(b)]
            assert values == list(enumerate(_values("a", 2) + _values("b", 3) + _values("c", 1)))

            # From an offset inside a batch: that whole batch first.
            _, data = await c.fetch("t", 0, 3)
            assert [h.base_offset for _, h in iter_batches(data)] == [2, 5]

            # At the high watermark, without waiting: nothing.
            body, data = await c.fetch("t", 0, 6)
            assert (body.partitions[0].size, data) == (0, b"")

    asyncio.run(main())


def test_fetch_errors_are_per_partition(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=2))
            data = batch(_values("v", 2))
            await c.call(ProduceRequest(partitions=[ProducePartition("t", 1, len(data))]), [data])
            request = FetchRequest(
                max_wait_ms=LONG_POLL_MS,
                partitions=[
                    FetchPartition("nope", 0, 0, ALL),
                    FetchPartition("t", 1, 0, ALL),
                    FetchPartition("t", 9, 0, ALL),
                    FetchPartition("t", 1, 99, ALL),
                ],
            )
            event = await c.rpc(request)
            assert event.error is None
            assert isinstance(event.body, FetchResponse)
            codes = [(p.topic, p.partition, p.error_code) for p in event.body.partitions]
            assert codes == [
                ("nope", 0, UnknownTopicError.code),
                ("t", 1, 0),
                ("t", 9, UnknownPartitionError.code),
                ("t", 1, OffsetOutOfRangeError.code),
            ]
            sizes = [p.size for p in event.body.partitions]
            assert sizes == [0, len(event.data), 0, 0]
            assert [r.value for r in records(bytes(event.data))] == _values("v", 2)

    asyncio.run(main())


def test_long_poll_returns_as_soon_as_another_connection_produces(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path) as (_, server),
            Client.connect(server) as consumer,
            Client.connect(server) as producer,
        ):
            await producer.call(CreateTopicRequest(name="t", partitions=2))
            fetch = consumer.send(
                FetchRequest(
                    max_wait_ms=LONG_POLL_MS,
                    partitions=[FetchPartition("t", 0, 0, ALL), FetchPartition("t", 1, 0, ALL)],
                )
            )
            # Answered while the fetch (sent first, so started first) waits.
            await consumer.ping()
            assert consumer.early == {}

            data = batch([b"wake up"])
            await producer.call(
                ProduceRequest(partitions=[ProducePartition("t", 1, len(data))]), [data]
            )
            event = await consumer.response(fetch, timeout=PROMPT_S)
            assert event.error is None
            p0, p1 = event.body.partitions
            assert (p0.size, p1.size) == (0, len(event.data))
            assert [r.value for r in records(bytes(event.data))] == [b"wake up"]

    asyncio.run(main())


def test_long_poll_over_max_fetch_waiters_is_refused_with_backpressure(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, broker={"max_fetch_waiters": 1}) as (_, server),
            Client.connect(server) as first,
            Client.connect(server) as second,
        ):
            await first.call(CreateTopicRequest(name="t"))
            request = FetchRequest(
                max_wait_ms=LONG_POLL_MS, partitions=[FetchPartition("t", 0, 0, ALL)]
            )
            waiting = first.send(request)
            await first.ping()  # the first long-poll waits: the only slot is taken
            refused = await second.rpc(request)

            data = batch([b"wake"])  # end the first long-poll before checking the second
            await second.call(
                ProduceRequest(partitions=[ProducePartition("t", 0, len(data))]), [data]
            )
            assert (await first.response(waiting)).body.partitions[0].size == len(data)

            if refused.error is not None:
                assert isinstance(refused.error, BackpressureError)
            else:
                (result,) = refused.body.partitions
                assert result.error_code == BackpressureError.code, result

    asyncio.run(main())


def test_long_poll_times_out_with_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t"))
            loop = asyncio.get_running_loop()
            start = loop.time()
            body, data = await c.fetch("t", 0, max_wait_ms=200)
            assert loop.time() - start >= 0.19
            assert (body.partitions[0].error_code, body.partitions[0].size, data) == (0, 0, b"")

    asyncio.run(main())


def test_list_offsets(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=2))
            # offsets 0-1 at T0, 2-3 at T0 + 1 s, 4 at T0 + 2 s
            for n, ts in ((2, T0), (2, T0 + 1000), (1, T0 + 2000)):
                data = batch(_values(str(ts), n), timestamp_ms=ts)
                await c.call(
                    ProduceRequest(partitions=[ProducePartition("t", 0, len(data))]), [data]
                )
            asks = [
                ("t", 0, EARLIEST, 0),
                ("t", 0, LATEST, 5),
                ("t", 0, T0 - 1, 0),
                ("t", 0, T0, 0),
                ("t", 0, T0 + 500, 2),
                ("t", 0, T0 + 1000, 2),
                ("t", 0, T0 + 2000, 4),
                ("t", 0, T0 + 5000, 5),  # none so late: the high watermark
                ("t", 1, EARLIEST, 0),
                ("t", 1, LATEST, 0),
            ]
            resp = await c.call(
                ListOffsetsRequest(
                    partitions=[ListOffsetsPartition(t, p, ts) for t, p, ts, _ in asks]
                )
            )
            assert isinstance(resp, ListOffsetsResponse)
            assert [(r.topic, r.partition, r.offset, r.error_code) for r in resp.results] == [
                (t, p, want, 0) for t, p, _, want in asks
            ]

            resp = await c.call(
                ListOffsetsRequest(
                    partitions=[
                        ListOffsetsPartition("nope", 0, LATEST),
                        ListOffsetsPartition("t", 7, LATEST),
                        ListOffsetsPartition("t", 0, LATEST),
                    ]
                )
            )
            assert [(r.offset, r.error_code) for r in resp.results] == [
                (-1, UnknownTopicError.code),
                (-1, UnknownPartitionError.code),
                (5, 0),
            ]

    asyncio.run(main())
