"""The conformance suite of the clients: every test runs against :class:`AsyncClient` and its
blocking twin :class:`Client` (the ``kind`` fixture), over a real broker on port 0.

It covers administration (topics and their errors, each an exception class with its wire
code), produce and fetch (every codec, keys, headers, timestamps, None values, acks),
offsets (consecutive, by time, out of range) and the long-poll.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import tidewire
from tests.client._support import (
    LONG_POLL_MS,
    PROMPT_S,
    T0,
    broker_at,
    connect,
    listening,
    read_all,
    run,
    serve,
    until_waiting,
)
from tidewire.client import FetchedRecords, Message
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    TidewireError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.protocol.messages import ACKS_DURABLE, ACKS_LEADER, ACKS_NONE, TopicConfig
from tidewire.records import Codec, Record, iter_batches, iter_records

CODECS = [Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD]

#: Messages with every optional part set and unset; ``timestamp_ms=None`` means "now".
MESSAGES = [
    Message(b"plain"),
    Message(b"v", key=b"k", timestamp_ms=T0),
    Message(None, key=b"tombstone", timestamp_ms=T0 + 1),
    Message(None, timestamp_ms=T0 + 2),
    Message(b"", key=b"", timestamp_ms=T0 + 3),
    Message(
        b"with headers",
        headers=[("a", b"1"), ("none", None), ("\u00fcn\u00efcode", b"\x00\xff"), ("a", b"2")],
        timestamp_ms=T0 + 4,
    ),
    Message(b"x" * 5000, key=b"compressible", timestamp_ms=T0 + 5),
    Message(bytes(range(256)), key=bytes(range(255, -1, -1)), timestamp_ms=0),
]


def assert_error(exc: pytest.ExceptionInfo[TidewireError], cls: type[TidewireError]) -> None:
    """The client raised exactly ``cls`` (not a parent), carrying its wire code."""
    assert type(exc.value) is cls
    assert exc.value.code == cls.code
    assert exc.value.message


def check_records(
    got: list[Record], messages: list[Message], base: int, *, before_ms: int, after_ms: int
) -> None:
    """``got`` holds ``messages`` at consecutive offsets from ``base``, field by field."""
    assert len(got) == len(messages)
    for i, (rec, m) in enumerate(zip(got, messages, strict=True)):
        assert rec.offset == base + i
        assert (rec.key, rec.value, rec.headers) == (m.key, m.value, tuple(m.headers))
        if m.timestamp_ms is None:
            assert before_ms <= rec.timestamp <= after_ms
        else:
            assert rec.timestamp == m.timestamp_ms


# --- administration ------------------------------------------------------------------------------


def test_ping_and_server_version(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            assert await c.ping() is None
            assert await c.server_version() == tidewire.__version__
            assert await c.ping() is None

    run(main())


def test_topic_lifecycle(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, default_partitions=2) as (_, server), connect(kind, server) as c:
            assert await c.list_topics() == []
            assert await c.create_topic("orders", 3) is None
            await c.create_topic("a.b_c-1")  # the broker's default partition count
            assert await c.list_topics() == ["a.b_c-1", "orders"]

            d = await c.describe_topic("orders")
            assert d.name == "orders"
            assert d.error_code == 0
            assert [p.partition for p in d.partitions] == [0, 1, 2]
            for p in d.partitions:
                assert (p.log_start_offset, p.log_end_offset, p.high_watermark) == (0, 0, 0)
            assert d.config.fsync == "interval"
            assert len((await c.describe_topic("a.b_c-1")).partitions) == 2

            await c.alter_topic("orders", partitions=5)
            assert len((await c.describe_topic("orders")).partitions) == 5
            await c.alter_topic("orders", config=TopicConfig(retention_ms=123_456))
            d = await c.describe_topic("orders")
            assert (d.config.retention_ms, len(d.partitions)) == (123_456, 5)
            await c.alter_topic("orders", partitions=5)  # the same count: allowed, no change
            await c.produce("orders", 4, [Message(b"in a new partition")])
            assert (await c.describe_topic("orders")).partitions[4].log_end_offset == 1

            await c.delete_topic("orders")
            assert await c.list_topics() == ["a.b_c-1"]
            await c.create_topic("orders", 1)  # the name is free again, the data gone
            assert (await c.describe_topic("orders")).partitions[0].log_end_offset == 0

    run(main())


def test_created_with_settings(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            cfg = TopicConfig(retention_ms=60_000, segment_bytes=1 << 20, fsync="always")
            await c.create_topic("t", 1, cfg)
            d = await c.describe_topic("t")
            assert (d.config.retention_ms, d.config.segment_bytes, d.config.fsync) == (
                60_000,
                1 << 20,
                "always",
            )

    run(main())


def test_topic_errors(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t", 2)
            with pytest.raises(TopicExistsError) as exc:
                await c.create_topic("t", 2)
            assert_error(exc, TopicExistsError)
            assert not exc.value.retriable

            for call in (
                c.describe_topic("missing"),
                c.delete_topic("missing"),
                c.alter_topic("missing", partitions=3),
            ):
                with pytest.raises(UnknownTopicError) as exc_u:
                    await call
                assert_error(exc_u, UnknownTopicError)

            for name in ("", "has space", "slash/y", "..", "x" * 1000):
                with pytest.raises(InvalidTopicError) as exc_i:
                    await c.create_topic(name)
                assert_error(exc_i, InvalidTopicError)
            for partitions in (0, -1):
                with pytest.raises(InvalidTopicError):
                    await c.create_topic("fine", partitions)
            with pytest.raises(InvalidTopicError) as exc_i:
                await c.alter_topic("t", partitions=1)  # a topic never loses partitions
            assert_error(exc_i, InvalidTopicError)

            with pytest.raises(InvalidConfigError) as exc_c:
                await c.create_topic("fine", 1, TopicConfig(segment_bytes=1))
            assert_error(exc_c, InvalidConfigError)
            with pytest.raises(InvalidConfigError):
                await c.alter_topic("t", config=TopicConfig(fsync="sometimes"))

            # Nothing of the refused requests happened, and the connection serves on.
            assert await c.list_topics() == ["t"]
            assert len((await c.describe_topic("t")).partitions) == 2

    run(main())


# --- produce and fetch ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_produce_and_fetch_every_field(kind: str, codec: Codec, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t", 2)
            before_ms = time.time_ns() // 1_000_000
            assert await c.produce("t", 1, MESSAGES, codec=codec) == 0
            second = [Message(b"second batch", key=b"k2"), Message(None, headers=[("h", None)])]
            assert await c.produce("t", 1, second, codec=codec) == len(MESSAGES)
            after_ms = time.time_ns() // 1_000_000

            got = await c.fetch("t", 1, 0)
            assert isinstance(got, FetchedRecords)
            total = len(MESSAGES) + len(second)
            assert (got.next_offset, got.high_watermark) == (total, total)
            check_records(
                got.records, [*MESSAGES, *second], 0, before_ms=before_ms, after_ms=after_ms
            )
            # The other partition saw nothing.
            empty = await c.fetch("t", 0, 0)
            assert (empty.records, empty.next_offset, empty.high_watermark) == ([], 0, 0)

    run(main())


def test_messages_may_be_any_iterable(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            assert await c.produce("t", 0, (Message(bytes([i])) for i in range(3))) == 0
            got = await c.fetch("t", 0, 0)
            assert [r.value for r in got.records] == [b"\x00", b"\x01", b"\x02"]
            with pytest.raises(ValueError, match="at least one message"):
                await c.produce("t", 0, [])

    run(main())


def test_offsets_are_consecutive(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t", 2)
            sizes = [1, 3, 2, 5, 1]
            bases = []
            for i, n in enumerate(sizes):
                msgs = [Message(f"{i}.{j}".encode()) for j in range(n)]
                bases.append(await c.produce("t", 0, msgs, codec=CODECS[i % len(CODECS)]))
            assert bases == [0, 1, 4, 6, 11]
            assert await c.produce("t", 1, [Message(b"p1")]) == 0  # per partition
            assert await c.list_offset("t", 0, -1) == 12
            d = await c.describe_topic("t")
            assert [(p.log_end_offset, p.high_watermark) for p in d.partitions] == [
                (12,) * 2,
                (1,) * 2,
            ]
            values = [r.value for r in await read_all(c, "t", 0)]
            assert values == [f"{i}.{j}".encode() for i, n in enumerate(sizes) for j in range(n)]

    run(main())


def test_acks(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), connect(kind, server) as c:
            await c.create_topic("t")
            assert await c.produce("t", 0, [Message(b"durable")], acks=ACKS_DURABLE) == 0
            assert await c.produce("t", 0, [Message(b"leader")], acks=ACKS_LEADER) == 1
            msgs = [Message(b"fire"), Message(b"and"), Message(b"forget")]
            assert await c.produce("t", 0, msgs, acks=ACKS_NONE) == -1
            # No answer comes, but the batch arrives: a long-poll returns once it is there.
            got = await asyncio.wait_for(c.fetch("t", 0, 2, max_wait_ms=LONG_POLL_MS), PROMPT_S)
            assert [(r.offset, r.value) for r in got.records] == [
                (2, b"fire"),
                (3, b"and"),
                (4, b"forget"),
            ]
            # The connection is in step: the next answered request gets its own answer.
            assert await c.produce("t", 0, [Message(b"after")], acks=ACKS_LEADER) == 5
            assert broker.list_offset("t", 0, -1) == 6

    run(main())


def test_acks_out_of_range_is_refused(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            with pytest.raises(InvalidRequestError) as exc:
                await c.produce("t", 0, [Message(b"x")], acks=2)
            assert_error(exc, InvalidRequestError)
            assert await c.produce("t", 0, [Message(b"y")]) == 0  # nothing stored before
            await c.ping()

    run(main())


def test_produce_errors(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, auto_create_topics=False) as (_, server),
            connect(kind, server) as c,
        ):
            with pytest.raises(UnknownTopicError) as exc_t:
                await c.produce("missing", 0, [Message(b"x")])
            assert_error(exc_t, UnknownTopicError)
            await c.create_topic("t", 2)
            with pytest.raises(UnknownPartitionError) as exc_p:
                await c.produce("t", 2, [Message(b"x")])
            assert_error(exc_p, UnknownPartitionError)
            assert await c.list_topics() == ["t"]

    run(main())


def test_produce_creates_the_topic(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, default_partitions=3) as (_, server), connect(kind, server) as c:
            assert await c.produce("auto", 2, [Message(b"x")]) == 0
            assert await c.list_topics() == ["auto"]
            assert len((await c.describe_topic("auto")).partitions) == 3

    run(main())


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_fetch_from_the_middle_of_a_batch(kind: str, codec: Codec, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            await c.produce("t", 0, [Message(b"a%d" % i) for i in range(5)], codec=codec)
            await c.produce("t", 0, [Message(b"b%d" % i) for i in range(3)], codec=codec)

            got = await c.fetch("t", 0, 2)
            assert [(r.offset, r.value) for r in got.records] == [
                (2, b"a2"),
                (3, b"a3"),
                (4, b"a4"),
                (5, b"b0"),
                (6, b"b1"),
                (7, b"b2"),
            ]
            assert (got.next_offset, got.high_watermark) == (8, 8)
            # The last record of the first batch; then the first of the second.
            got = await c.fetch("t", 0, 4, max_bytes=1)
            assert [r.offset for r in got.records] == [4]
            assert got.next_offset == 5
            got = await c.fetch("t", 0, 6, max_bytes=1)
            assert [r.offset for r in got.records] == [6, 7]
            # At the end: nothing, and the same offset to read from next.
            got = await c.fetch("t", 0, 8)
            assert (got.records, got.next_offset, got.high_watermark) == ([], 8, 8)

    run(main())


def test_small_fetches_read_everything_once(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            expected = []
            for i in range(6):
                msgs = [Message(b"%d-%d" % (i, j), key=b"%d" % j) for j in range(i + 1)]
                await c.produce("t", 0, msgs, codec=CODECS[i % len(CODECS)])
                expected += [(m.key, m.value) for m in msgs]
            for max_bytes in (1, 200, 1 << 20):
                got = await read_all(c, "t", 0, max_bytes=max_bytes)
                assert [(r.key, r.value) for r in got] == expected
            got = await read_all(c, "t", 0, 7, max_bytes=1)
            assert [(r.key, r.value) for r in got] == expected[7:]

    run(main())


def test_fetch_errors(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, auto_create_topics=False) as (_, server),
            connect(kind, server) as c,
        ):
            await c.create_topic("t")
            await c.produce("t", 0, [Message(b"x"), Message(b"y"), Message(b"z")])
            for offset in (4, 1000, -1):
                with pytest.raises(OffsetOutOfRangeError) as exc:
                    await c.fetch("t", 0, offset)
                assert_error(exc, OffsetOutOfRangeError)
                assert not exc.value.retriable
            with pytest.raises(OffsetOutOfRangeError):  # no waiting for an impossible offset
                await asyncio.wait_for(c.fetch("t", 0, 4, max_wait_ms=LONG_POLL_MS), PROMPT_S)
            with pytest.raises(UnknownTopicError):
                await c.fetch("missing", 0, 0)
            with pytest.raises(UnknownPartitionError):
                await c.fetch("t", 1, 0)
            assert [r.value for r in (await c.fetch("t", 0, 0)).records] == [b"x", b"y", b"z"]

    run(main())


def test_fetch_batches_hands_over_the_stored_bytes(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            await c.produce("t", 0, [Message(b"a%d" % i) for i in range(3)])
            await c.produce("t", 0, [Message(b"b%d" % i) for i in range(2)], codec=Codec.LZ4)
            got = await c.fetch_batches("t", 0, 1)
            assert (got.high_watermark, got.log_start_offset) == (5, 0)
            batches = list(iter_batches(got.data))  # the CRCs check out
            assert [(h.base_offset, h.records_count) for _, h in batches] == [(0, 3), (3, 2)]
            assert [r.value for r in iter_records(got.data[batches[1][0] :])] == [b"b0", b"b1"]
            assert (await c.fetch_batches("t", 0, 5)).data == b""
            with pytest.raises(OffsetOutOfRangeError):
                await c.fetch_batches("t", 0, 6)

    run(main())


def test_commit_offsets_from_outside_a_group(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t", 2)
            await c.produce("t", 0, [Message(b"x%d" % i) for i in range(4)])
            await c.commit_offsets("job", {("t", 1): 0, ("t", 0): 3})
            await c.commit_offsets("job", {})  # nothing to do
            assert await c.committed_offsets("job") == {("t", 0): 3, ("t", 1): 0}
            assert [(x.partition, x.lag) for x in await c.group_lag("job")] == [(0, 1), (1, 0)]
            with pytest.raises(UnknownPartitionError):
                await c.commit_offsets("job", {("t", 7): 0})
            assert await c.committed_offsets("job") == {("t", 0): 3, ("t", 1): 0}

    run(main())


def test_long_poll_returns_when_another_client_produces(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path) as (broker, server),
            connect(kind, server) as consumer,
            connect(kind, server) as producer,
        ):
            await producer.create_topic("t", 2)
            await producer.produce("t", 0, [Message(b"old")])
            polls = [
                asyncio.ensure_future(consumer.fetch("t", 0, 1, max_wait_ms=LONG_POLL_MS)),
                asyncio.ensure_future(consumer.fetch("t", 1, 0, max_wait_ms=LONG_POLL_MS)),
            ]
            await until_waiting(broker, 2)
            assert not any(p.done() for p in polls)

            await producer.produce("t", 0, [Message(b"new"), Message(b"newer")])
            got = await asyncio.wait_for(polls[0], PROMPT_S)
            assert [(r.offset, r.value) for r in got.records] == [(1, b"new"), (2, b"newer")]
            assert not polls[1].done()  # a produce to partition 0 does not wake partition 1

            await producer.produce("t", 1, [Message(b"p1")])
            got = await asyncio.wait_for(polls[1], PROMPT_S)
            assert [(r.offset, r.value) for r in got.records] == [(0, b"p1")]

    run(main())


def test_long_poll_times_out_empty(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            start = time.monotonic()
            got = await asyncio.wait_for(c.fetch("t", 0, 0, max_wait_ms=50), PROMPT_S)
            assert time.monotonic() - start >= 0.04
            assert (got.records, got.next_offset, got.high_watermark) == ([], 0, 0)

    run(main())


def test_list_offset(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.create_topic("t")
            assert (await c.list_offset("t", 0, -2), await c.list_offset("t", 0, -1)) == (0, 0)
            assert await c.list_offset("t", 0, T0) == 0  # empty: the high watermark
            first = [Message(b"%d" % i, timestamp_ms=T0 + 10 * i) for i in range(3)]
            second = [Message(b"%d" % i, timestamp_ms=T0 + 10 * i) for i in range(3, 5)]
            await c.produce("t", 0, first)
            await c.produce("t", 0, second, codec=Codec.ZSTD)
            assert await c.list_offset("t", 0, -2) == 0
            assert await c.list_offset("t", 0, -1) == 5
            for ts, offset in [
                (0, 0),
                (T0, 0),
                (T0 + 1, 1),
                (T0 + 15, 2),
                (T0 + 20, 2),
                (T0 + 21, 3),
                (T0 + 40, 4),
                (T0 + 41, 5),  # later than every record: the high watermark
            ]:
                assert await c.list_offset("t", 0, ts) == offset, ts
            with pytest.raises(UnknownTopicError):
                await c.list_offset("missing", 0, -1)
            with pytest.raises(UnknownPartitionError):
                await c.list_offset("t", 1, -1)

    run(main())


def test_data_outlives_a_broker_restart(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        msgs = [Message(b"v%d" % i, key=b"k", timestamp_ms=T0 + i) for i in range(4)]
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            await c.produce("t", 0, msgs, codec=Codec.LZ4)
        async with (
            broker_at(tmp_path) as broker,
            listening(broker) as server,
            connect(kind, server) as c,
        ):
            got = await c.fetch("t", 0, 0)
            check_records(got.records, msgs, 0, before_ms=0, after_ms=0)
            assert await c.list_offset("t", 0, T0 + 2) == 2

    run(main())
