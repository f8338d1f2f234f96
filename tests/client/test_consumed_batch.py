"""``poll_batch`` and :class:`ConsumedBatch` against a real broker on port 0, both twins:
the same records and positions as ``poll``, columns, a limit that splits a stored batch,
mixing with ``poll`` and iteration, a malformed stored batch, and the Arrow conversion
(the schema the Spark source uses; a clear error without pyarrow)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.client._producer_support import consuming
from tests.client._support import PROMPT_S, T0, addr, run, serve, until_waiting
from tidewire.broker import Broker
from tidewire.client import ConsumedBatch, ConsumerRecord, _arrow
from tidewire.errors import InvalidRecordError
from tidewire.records import BatchBuilder
from tidewire.records.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c


async def put(
    broker: Broker,
    topic: str,
    partition: int,
    values: list[bytes],
    ts: int = T0,
    *,
    keyed: bool = True,
) -> None:
    """Store ``values`` as one batch, record ``i`` at time ``ts + i``."""
    b = BatchBuilder()
    for i, v in enumerate(values):
        if keyed:
            b.append(v, key=b"k" + v, headers=[("i", b"%d" % i)], timestamp_ms=ts + i)
        else:
            b.append(v, timestamp_ms=ts + i)
    await broker.produce(topic, partition, b.build())


def columns_of(batch: ConsumedBatch) -> list[tuple[object, ...]]:
    return list(
        zip(
            batch.topics,
            batch.partitions,
            batch.offsets,
            batch.timestamps,
            batch.keys,
            batch.values,
            batch.headers,
            strict=True,
        )
    )


def test_poll_batch_hands_out_what_poll_would(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            await put(broker, "t", 0, [b"a0", b"a1", b"a2"])
            await put(broker, "t", 0, [b"a3"])
            await put(broker, "t", 1, [b"b0", b"b1"])
            positions = [("t", 0, 1), ("t", 1, "earliest")]  # 1: inside the first batch
            async with consuming(kind, addr(server), max_wait_ms=50) as ref:
                await ref.assign(positions)
                expected: list[ConsumerRecord] = []
                while len(expected) < 5:
                    expected += await ref.poll(PROMPT_S)
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign(positions)
                got: list[ConsumerRecord] = []
                while len(got) < 5:
                    batch = await c.poll_batch(PROMPT_S)
                    assert isinstance(batch, ConsumedBatch)
                    assert len(columns_of(batch)) == len(batch)
                    assert columns_of(batch) == [tuple(r) for r in batch]
                    got += list(batch)
                assert sorted(got) == sorted(expected)
                assert len(got) == 5
                r = next(r for r in got if r.value == b"a2")
                assert (r.topic, r.partition, r.offset, r.timestamp) == ("t", 0, 2, T0 + 2)
                assert (r.key, r.headers) == (b"ka2", (("i", b"2"),))
                assert isinstance(r, ConsumerRecord)
                assert (c.position("t", 0), c.position("t", 1)) == (4, 2)
                empty = await c.poll_batch(0.05)
                assert len(empty) == 0
                assert not empty
                assert list(empty) == []

    run(main())


def test_a_limit_splits_a_stored_batch_and_mixes_with_poll(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"%d" % i for i in range(10)])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                with pytest.raises(ValueError, match="assign"):
                    await c.poll_batch(0)
                await c.assign([("t", 0, 0)])
                with pytest.raises(ValueError, match="max_records=0 must be at least 1"):
                    await c.poll_batch(0, max_records=0)
                first = await c.poll_batch(PROMPT_S, max_records=4)
                assert first.values == [b"0", b"1", b"2", b"3"]
                assert first.offsets == [0, 1, 2, 3]
                assert c.position("t", 0) == 4
                # The rest of the stored batch, through poll, then the batch API again.
                assert [r.value for r in await c.poll(PROMPT_S, max_records=2)] == [b"4", b"5"]
                assert c.position("t", 0) == 6
                rest = await c.poll_batch(PROMPT_S)
                assert rest.values == [b"6", b"7", b"8", b"9"]
                assert c.position("t", 0) == 10
                # Records one iteration step made ready come first in the next batch.
                await put(broker, "t", 0, [b"x", b"y", b"z"])
                assert [r.value for r in await c.take(1)] == [b"x"]
                tail = await c.poll_batch(PROMPT_S)
                assert tail.values == [b"y", b"z"]
                assert c.position("t", 0) == 13

    run(main())


def test_columns_are_made_when_read_and_outlive_later_fetches(kind: str, tmp_path: Path) -> None:
    """A batch's columns are made from the fetched data when first read, in any order, once:
    read after later polls (new fetches) and after the consumer closed, they are still
    exactly the records ``poll`` hands out."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            for n in range(3):  # several stored batches a partition: one segment each
                await put(broker, "t", 0, [b"a%d-%d" % (n, i) * 40 for i in range(50)])
                await put(broker, "t", 1, [b"b%d-%d" % (n, i) for i in range(7)], keyed=False)
            positions = [("t", 0, 20), ("t", 1, "earliest")]
            async with consuming(kind, addr(server), max_wait_ms=50) as ref:
                await ref.assign(positions)
                expected: list[ConsumerRecord] = []
                while len(expected) < 151:
                    expected += await ref.poll(PROMPT_S)
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign(positions)
                batches: list[ConsumedBatch] = []
                while sum(len(b) for b in batches) < 151:
                    batches.append(await c.poll_batch(PROMPT_S, max_records=60))
                assert len(await c.poll_batch(0.05)) == 0
            got: list[tuple[object, ...]] = []
            for batch in reversed(batches):  # the last first; each column read before the rest
                values = batch.values
                assert batch.values is values  # made once
                keys, offsets = batch.keys, batch.offsets
                rows = list(zip(*(batch.topics, batch.partitions, offsets), strict=True))
                assert [tuple(r) for r in batch] == [
                    (*row, ts, k, v, h)
                    for row, ts, k, v, h in zip(
                        rows, batch.timestamps, keys, values, batch.headers, strict=True
                    )
                ]
                assert sum(len(s) for s in batch.segments) == len(batch)
                got[:0] = [tuple(r) for r in batch]
            assert sorted(got) == sorted(tuple(r) for r in expected)
            assert len(got) == 151

    run(main())


def _malformed(value: bytes) -> bytes:
    """A batch of one record whose CRC is right but whose record declares a header it does
    not hold (the broker checks sizes and CRC only; the reader finds the fault)."""
    b = BatchBuilder()
    b.append(value, timestamp_ms=T0)
    batch = bytearray(b.build())
    assert batch[-1] == 0  # the header count of the last record
    batch[-1] = 2  # one header (zigzag varint)
    crc = crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:])
    batch[CRC_OFFSET : CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return bytes(batch)


@pytest.mark.parametrize("api", ["poll_batch", "poll"])
def test_a_malformed_stored_batch_fails_after_the_records_before_it(
    kind: str, api: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"a", b"b"], keyed=False)
            await broker.produce("t", 0, _malformed(b"bad"))
            await put(broker, "t", 0, [b"after"], keyed=False)
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign([("t", 0, 0)])
                read = getattr(c, api)
                first = await read(PROMPT_S)
                assert [r.value for r in first] == [b"a", b"b"]
                assert c.position("t", 0) == 2
                for _ in range(2):  # the same error each time, the position kept
                    with pytest.raises(InvalidRecordError, match="header"):
                        await read(PROMPT_S)
                    assert c.position("t", 0) == 2
                await c.seek("t", 0, 3)  # past it, as an application may choose to
                assert [r.value for r in await read(PROMPT_S)] == [b"after"]

    run(main())


def test_to_arrow_has_the_spark_sources_schema(kind: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            await put(broker, "t", 0, [b"a0", b"a1"])
            await put(broker, "t", 1, [b"b0"])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign([("t", 0, 0), ("t", 1, 0)])
                batch = ConsumedBatch([])
                while len(batch) < 3:
                    more = await c.poll_batch(PROMPT_S)
                    batch = ConsumedBatch(batch.segments + more.segments)
                table = batch.to_arrow()
                assert isinstance(table, pa.RecordBatch)
                assert table.num_rows == 3
                assert table.schema == _arrow.arrow_schema(False)
                rows = sorted(table.to_pylist(), key=lambda r: (r["partition"], r["offset"]))
                assert [(r["topic"], r["partition"], r["offset"]) for r in rows] == [
                    ("t", 0, 0),
                    ("t", 0, 1),
                    ("t", 1, 0),
                ]
                assert [(r["key"], r["value"], r["timestampType"]) for r in rows] == [
                    (b"ka0", b"a0", 0),
                    (b"ka1", b"a1", 0),
                    (b"kb0", b"b0", 0),
                ]
                assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [
                    T0,
                    T0 + 1,
                    T0,
                ]
                with_headers = batch.to_arrow(include_headers=True)
                assert with_headers.schema == _arrow.arrow_schema(True)
                assert sorted(
                    (r["partition"], r["offset"], r["headers"]) for r in with_headers.to_pylist()
                ) == [
                    (0, 0, [{"key": "i", "value": b"0"}]),
                    (0, 1, [{"key": "i", "value": b"1"}]),
                    (1, 0, [{"key": "i", "value": b"0"}]),
                ]
                empty = ConsumedBatch([]).to_arrow()
                assert (empty.num_rows, empty.schema) == (0, _arrow.arrow_schema(False))

    run(main())


def test_to_arrow_from_spans_holds_what_iteration_hands_out(kind: str, tmp_path: Path) -> None:
    """Arrow's buffers filled from the fetched data (several stored batches a partition,
    null and empty keys and values, a batch split by ``max_records`` whose rest comes as
    records) hold exactly the records iteration hands out."""
    pa = pytest.importorskip("pyarrow")

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            for n in range(3):
                for partition in (0, 1):
                    b = BatchBuilder()
                    for i in range(9 + n):
                        b.append(
                            None if i % 4 == 1 else b"v%d" % i * (i % 3),
                            key=None if i % 3 == 0 else b"k%d-%d" % (n, i),
                            timestamp_ms=T0 + n * 100 + i,
                        )
                    await broker.produce("t", partition, b.build())
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign([("t", 0, 2), ("t", 1, 0)])
                batches: list[ConsumedBatch] = []
                while sum(len(b) for b in batches) < 28 + 30:
                    batches.append(await c.poll_batch(PROMPT_S, max_records=25))
            for batch in batches:
                table = batch.to_arrow()
                assert table.schema == _arrow.arrow_schema(False)
                assert isinstance(table, pa.RecordBatch)
                assert [
                    (
                        r["topic"],
                        r["partition"],
                        r["offset"],
                        round(r["timestamp"].timestamp() * 1000),
                        r["key"],
                        r["value"],
                    )
                    for r in table.to_pylist()
                ] == [tuple(r)[:6] for r in batch]

    run(main())


def test_to_arrow_without_pyarrow_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_arrow, "_cache", {})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.compute", None)
    with pytest.raises(ImportError, match=r"pip install 'tidewire\[spark\]'"):
        ConsumedBatch([]).to_arrow()


@pytest.mark.parametrize("api", ["poll_batch", "poll"])
def test_after_everything_was_handed_out_a_poll_waits_for_more(
    kind: str, api: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            await put(broker, "t", 0, [b"a", b"b"])
            async with consuming(kind, addr(server), max_wait_ms=30_000) as c:
                await c.assign([("t", 0, 0)])
                read = getattr(c, api)
                # Exactly what is there: the limit is reached at the end of the stored batch.
                assert [r.value for r in await read(PROMPT_S, max_records=2)] == [b"a", b"b"]
                # Nothing is left: the next call waits on the broker's long-poll for more.
                waiting = asyncio.ensure_future(read(PROMPT_S * 2))
                await until_waiting(broker, 1)
                assert not waiting.done()
                await put(broker, "t", 0, [b"c"])
                got = await asyncio.wait_for(waiting, PROMPT_S)
                assert [r.value for r in got] == [b"c"]
                assert c.position("t", 0) == 3

    run(main())


def test_a_small_stored_batch_is_copied_out_of_a_large_fetch(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept ConsumedBatch must not hold a whole fetch for a few small records: a stored
    batch under an eighth of the fetched data is read from a copy of its own, a large one
    straight from the fetched buffer."""
    from tidewire.client import _consumer

    seen: list[tuple[int, int]] = []  # (bytes of the buffer read from, the stored batch's size)
    real = _consumer.read_spans

    def spy(data: bytes | bytearray, at: int, h: object, *args: object) -> object:
        seen.append((len(data), h.size))  # type: ignore[attr-defined]
        return real(data, at, h, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_consumer, "read_spans", spy)

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            for i in range(20):  # 20 small stored batches, then a large one
                await put(broker, "t", 0, [b"s%d" % i])
            await put(broker, "t", 0, [b"L" * 1000 for _ in range(200)])
            async with consuming(kind, addr(server), max_wait_ms=50) as c:
                await c.assign([("t", 0, "earliest")])
                got = 0
                while got < 220:
                    batch = await c.poll_batch(PROMPT_S)
                    assert batch.values == [r.value for r in batch]
                    got += len(batch)
        assert len(seen) == 21
        small, large = seen[:20], seen[20]
        assert all(buffer == size for buffer, size in small), small  # copies of their own
        assert large[0] > large[1]  # read in place from the fetched data

    run(main())
